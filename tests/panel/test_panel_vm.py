"""The panel on the vm provider, in a real browser against a live ``jupyter lab``: it says the guests are
emulated, a session's Pause button freezes it and Resume lets it run on, and Fork starts a copy (issue 28's
panel door)."""

from __future__ import annotations

import re
import shutil
import tempfile
from typing import Any

import pytest

from tests.support.lab import BROWSER_MARKS, LabProcess, open_panel, shot
from tests.support.vm import need_qemu

pytestmark = [*BROWSER_MARKS, pytest.mark.slow(40)]


def test_a_vm_session_is_paused_resumed_and_forked_from_the_panel(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    need_qemu()
    state = tempfile.mkdtemp(prefix="tai-vmp-", dir="/tmp")
    try:
        lab = lab_process.start("vm", "--VmSandbox.accel=tcg", f"--VmSandbox.state_dir={state}")
        code, info = lab.api("POST", "sessions", {"network": "none", "ttl_seconds": 600})
        assert code == 201, info
        panel = open_panel(page, lab)
        notice = panel.locator(".jp-TaiSandbox-notice")
        expect(notice).to_have_text("Isolation: emulated: a separate guest kernel, not a hardened boundary.")
        expect(notice).to_have_attribute("data-kind", "isolation-note")
        item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{info["id"]}"]')
        item.locator(".jp-TaiSandbox-sessionLabel").click()  # Pause and Fork are in the opened row
        pause = item.locator(".jp-TaiSandbox-pause")
        expect(pause).to_have_text("Pause")

        pause.click()
        expect(pause).to_have_text("Resume")
        expect(item).to_have_class(re.compile(r"\bjp-mod-paused\b"))
        assert lab.api("GET", f"sessions/{info['id']}?usage=0")[1]["paused"] is True
        code, refused = lab.api(
            "POST", f"sessions/{info['id']}/exec", {"argv": ["true"], "timeout_seconds": 10}
        )
        assert code == 409 and refused["error"] == "SandboxConflictError", refused
        shot(page, "vm-session-paused")

        pause.click()
        expect(pause).to_have_text("Pause")
        expect(item).not_to_have_class(re.compile(r"\bjp-mod-paused\b"))
        assert lab.api("GET", f"sessions/{info['id']}?usage=0")[1]["paused"] is False
        code, ran = lab.api(
            "POST", f"sessions/{info['id']}/exec", {"argv": ["echo", "on"], "timeout_seconds": 30}
        )
        assert code == 200 and ran["stdout"] == "on\n", ran

        # Fork: a second session appears in the panel, started from the first one's state
        item.locator(".jp-TaiSandbox-fork").click()
        expect(panel.locator(".jp-TaiSandbox-session")).to_have_count(2, timeout=30_000)
        sessions = lab.api("GET", "sessions")[1]["sessions"]
        [fork] = [s for s in sessions if s["id"] != info["id"]]
        shot(page, "vm-session-forked")
        for session_id in (info["id"], fork["id"]):
            assert lab.api("DELETE", f"sessions/{session_id}")[0] == 204
    finally:
        shutil.rmtree(state, ignore_errors=True)
