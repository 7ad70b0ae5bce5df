"""Issue 52 in the panel, in a real browser against a real lab on the docker provider (its egress gateway):
the New session dialog takes an allow-list; a session's details show its egress policy (the allowed and
denied hosts, the operator's secret by variable and name, never its placeholder or value); "Egress policy…"
changes it (PATCH: GET then shows the new lists); a change over the operator's rule is refused with the
server's own message in the dialog, what was typed kept, nothing changed; the dialog lists the session's
recent egress decisions (the audit route).

Fixtures and helpers are in tests/support/lab.py; screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from tests.support.lab import BROWSER_MARKS, LabProcess, open_new_session_dialog, open_panel, shot

pytestmark = [*BROWSER_MARKS, pytest.mark.docker, pytest.mark.slow(90)]

#: the operator's rule for everyone: the ceiling of every allow-list, and a deny entry always added
RULES = {"*": {"allow": ["pypi.org", "files.pythonhosted.org", "*.example.org"], "deny": ["bad.example.org"]}}
SECRET_VALUE = "panel-real-secret-value-4f1c"
SECRETS = {
    "demo-token": {"hosts": ["api.example.org"], "from_env": "TAI_PANEL_DEMO_TOKEN", "env": "DEMO_TOKEN"}
}


def egress_of(lab: Any, session_id: str) -> dict[str, Any]:
    code, info = lab.api("GET", f"sessions/{session_id}")
    assert code == 200, info
    return info["spec"]["egress"]


def wait_for(check: Any, what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.3)


def test_egress_policy_in_the_panel(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    from tests.support import docker as docker_support

    docker_support.docker_client()  # an engine, or skip (fail in CI)
    lab = lab_process.start(
        "docker",
        *docker_support.server_args()[1:],  # the test image, this run's label (start names the provider)
        f"--DockerSandbox.deployment={os.environ['TAI_SANDBOX_DEPLOYMENT']}-panel-egress",
        isolation="container",
        extra_env={
            "TAI_MCP_SANDBOX_EGRESS_RULES": json.dumps(RULES),
            "TAI_MCP_SANDBOX_SECRETS": json.dumps(SECRETS),
            "TAI_PANEL_DEMO_TOKEN": SECRET_VALUE,
        },
    )
    code, status = lab.api("GET", "status")
    assert code == 200 and status["egress_policy"] is True, status
    session_id = None
    try:
        panel = open_panel(page, lab)
        expect(panel.locator(".jp-TaiSandbox-status")).to_contain_text("Provider docker")

        # the New session dialog: an allow-list on network egress makes a session with a policy
        dialog = open_new_session_dialog(page, panel)
        allow_field = dialog.locator('textarea[name="egressAllow"]')
        expect(allow_field).to_be_visible()
        dialog.locator('select[name="network"]').select_option("none")
        expect(allow_field).to_be_hidden()  # no hosts to list without egress
        dialog.locator('select[name="network"]').select_option("egress")
        allow_field.fill("pypi.org\nfiles.pythonhosted.org")
        shot(page, "egress-new-session-dialog")
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        expect(dialog).to_have_count(0)
        item = panel.locator(".jp-TaiSandbox-session")
        expect(item).to_have_count(1, timeout=90_000)
        session_id = item.get_attribute("data-session-id")
        assert session_id
        assert egress_of(lab, session_id)["allow"] == ["pypi.org", "files.pythonhosted.org"]
        placeholder = egress_of(lab, session_id)["secrets"][0]["placeholder"]

        # its details: the lists, the operator's deny entry, the secret by variable and name only
        item.locator(".jp-TaiSandbox-sessionRow").click()
        field = lambda name: item.locator(f'.jp-TaiSandbox-field[data-field="{name}"]')  # noqa: E731
        expect(field("egress allow")).to_have_text("egress allow: pypi.org, files.pythonhosted.org")
        expect(field("egress deny")).to_have_text("egress deny: bad.example.org")
        expect(field("secrets")).to_have_text("secrets: DEMO_TOKEN (demo-token)")

        # two decisions of its gateway for the dialog's recent list: an allowed name and a refused one
        for name in ("pypi.org", "evil.example"):
            code, result = lab.api(
                "POST", f"sessions/{session_id}/exec", {"argv": ["nslookup", name], "timeout_seconds": 20}
            )
            assert code == 200, result
        wait_for(
            lambda: any(
                line.get("host") == "evil.example"
                for line in lab.api("GET", f"egress/audit?session={session_id}&limit=50")[1]["lines"]
            ),
            "audit line of evil.example",
        )

        # "Egress policy…": the lists as in force, one entry a line; a change reaches the server
        item.locator(".jp-TaiSandbox-egress").click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_be_visible()
        allow = dialog.locator('textarea[name="allow"]')
        deny = dialog.locator('textarea[name="deny"]')
        expect(allow).to_have_value("pypi.org\nfiles.pythonhosted.org")
        expect(deny).to_have_value("bad.example.org")
        expect(dialog.locator('[data-secret="demo-token"]')).to_have_text(
            "DEMO_TOKEN (demo-token) → api.example.org"
        )
        recent = dialog.locator(".jp-TaiSandbox-egressAudit")
        recent.locator("summary").click()
        lines = recent.locator(".jp-TaiSandbox-egressAuditLines")
        expect(lines).to_contain_text("refuse dns evil.example")
        expect(lines).to_contain_text("allow dns pypi.org")
        shot(page, "egress-policy-dialog")
        allow.fill("pypi.org\ndocs.example.org")
        deny.fill("bad.example.org\nold.example.org")
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        expect(dialog).to_have_count(0)
        wait_for(
            lambda: egress_of(lab, session_id)["allow"] == ["pypi.org", "docs.example.org"], "new allow-list"
        )
        assert set(egress_of(lab, session_id)["deny"]) == {"bad.example.org", "old.example.org"}
        expect(field("egress allow")).to_have_text("egress allow: pypi.org, docs.example.org")
        expect(field("egress deny")).to_contain_text("old.example.org")

        # over the operator's rule: the server's own message in the dialog, what was typed kept, nothing changed
        code, refused = lab.api(
            "PATCH", f"sessions/{session_id}", {"egress": {"allow": ["evil.example"], "deny": []}}
        )
        assert code == 400 and "evil.example" in refused["message"], refused
        item.locator(".jp-TaiSandbox-egress").click()
        dialog = page.locator(".jp-Dialog")
        dialog.locator('textarea[name="allow"]').fill("pypi.org\nevil.example")
        dialog.locator('textarea[name="deny"]').fill("typed.example.org")
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        error = page.locator(".jp-Dialog .jp-TaiSandbox-egressError")
        expect(error).to_be_visible()
        expect(error).to_have_text(f"The server refused the change: {refused['message']}")
        dialog = page.locator(".jp-Dialog")
        expect(dialog.locator('textarea[name="allow"]')).to_have_value("pypi.org\nevil.example")
        expect(dialog.locator('textarea[name="deny"]')).to_have_value("typed.example.org")
        shot(page, "egress-policy-refused")
        assert egress_of(lab, session_id)["allow"] == ["pypi.org", "docs.example.org"]
        dialog.locator(".jp-Dialog-button.jp-mod-reject").click()
        expect(page.locator(".jp-Dialog")).to_have_count(0)

        # the secret's value never reached the page, nor its placeholder
        html = page.content()
        assert SECRET_VALUE not in html and placeholder not in html
    finally:
        if session_id:
            code, body = lab.api("DELETE", f"sessions/{session_id}")
            assert code in (204, 404), body
