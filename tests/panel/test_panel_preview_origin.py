"""Per-session preview origins in a real browser (PreviewSettings.origin_template on ``*.localhost``): a
docker session with network ``none`` runs an app (tests/previews/test_preview_origin.py's ``APP``) whose page
loads its own script from a relative URL, fetches JSON from its own origin and opens a websocket to its own
origin (an echo). Opened from the panel's Ports list, the Jupyter-origin URL redirects the tab's iframe to
``http://<session>-<port>.preview.localhost:<port>`` with a one-time code: there all three work, while the
page's ``fetch`` of the Jupyter origin's ``/api/sandbox/sessions`` gets nothing of the user's, its
``document.cookie`` holds no Jupyter cookie, and the cookie it sets is not on the Jupyter origin. The same
top-level ("Open in a browser tab"). Another user gets 404 on the Jupyter URL.

Chromium resolves ``*.localhost`` to loopback itself (no DNS needed).
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from tests.panel.test_panel_previews import OWNER, call, probe_result, run
from tests.previews.test_preview_origin import APP, APP_PORT, TEMPLATE
from tests.support.lab import BROWSER_MARKS, LabProcess, open_panel, shot

pytestmark = [*BROWSER_MARKS, pytest.mark.docker, pytest.mark.slow(120)]


def own_origin_works(found: dict[str, Any], origin: str, session_id: str, jupyter_cookies: set[str]) -> None:
    assert found["script"] == "ran", found  # app.js, a relative URL on its own origin
    assert found["origin"] == origin, found
    assert found["fetch"] == '200 {"hello":"data"}', found
    assert found["ws"] == "echo: hello over ws", found
    for what in ("jupyterFetch", "jupyterFetchWithCredentials"):
        # refused (no CORS grant for this origin), and never the user's sessions
        assert found[what].startswith("refused") or session_id not in found[what], found
    seen = {part.split("=", 1)[0].strip() for part in found["cookieBefore"].split(";") if part.strip()}
    assert not seen & jupyter_cookies, (seen, jupyter_cookies)
    # its own cookies work: its server's and its script's, on its own origin
    assert "planted_by_app=1" in found["cookieAfter"] and "appc=1" in found["cookieAfter"], found


def test_a_preview_on_its_own_origin_from_the_panel(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    from jupyter_tai_sandbox.images import PYTHON_IMAGE
    from tests.support import docker as docker_support

    docker_support.python_image().close()
    lab = lab_process.start(
        "docker",
        *docker_support.server_args(PYTHON_IMAGE)[1:],
        f"--DockerSandbox.deployment={os.environ['TAI_SANDBOX_DEPLOYMENT']}-panel-preview-origin",
        "--ServerApp.identity_provider_class=tests.support.users.HeaderUsers",
        "--ServerApp.authorizer_class=tests.support.users.AdminOnlyAdmin",
        f"--PreviewSettings.origin_template={TEMPLATE}",
        isolation="container",
    )
    code, info = call(lab, "POST", "/api/sandbox/sessions", {"network": "none", "ttl_seconds": 900})
    assert code == 201, info
    session_id = info["id"]
    try:
        assert info["network"] == "none"
        write = (
            "import base64, pathlib\n"
            f"pathlib.Path('app.py').write_bytes(base64.b64decode({base64.b64encode(APP.encode())!r}))\n"
        )
        run(lab, session_id, ["python3", "-c", write])
        run(
            lab,
            session_id,
            ["sh", "-c", f"setsid python3 app.py {APP_PORT} {lab.url} >app.log 2>&1 </dev/null &"],
        )
        port = lab.url.rsplit(":", 1)[1]
        origin = f"http://{session_id}-{APP_PORT}.preview.localhost:{port}"

        page.context.set_extra_http_headers({"X-Test-User": OWNER})
        panel = open_panel(page, lab)
        item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{session_id}"]')
        item.locator(".jp-TaiSandbox-sessionRow").click()
        listed = item.locator(f'.jp-TaiSandbox-portsList .jp-TaiSandbox-port[data-port="{APP_PORT}"]')
        expect(listed).to_be_visible(timeout=60_000)
        code, body = call(lab, "GET", f"/api/sandbox/sessions/{session_id}/ports")
        assert code == 200 and [p["origin"] for p in body["ports"] if p["port"] == APP_PORT] == [origin], body

        listed.locator(".jp-TaiSandbox-openPort").click()
        tab = page.locator(f'.jp-TaiSandbox-preview[data-port="{APP_PORT}"]')
        expect(tab).to_be_visible()
        iframe = tab.locator("iframe")
        url = f"{lab.url}/api/sandbox/sessions/{session_id}/ports/{APP_PORT}/"
        assert iframe.get_attribute("src") == url
        assert "allow-same-origin" in (iframe.get_attribute("sandbox") or "")
        jupyter_cookies = {c["name"] for c in page.context.cookies(lab.url)}
        assert jupyter_cookies, "the browser holds the Jupyter login cookie"

        found = probe_result(tab.frame_locator("iframe"))
        shot(page, "preview-origin-tab")
        own_origin_works(found, origin, session_id, jupyter_cookies)
        assert not {"planted_by_app", "appc"} & {c["name"] for c in page.context.cookies(lab.url)}

        # reload (a new one-time code through the Jupyter URL), then top-level
        tab.frame_locator("iframe").locator("#result").evaluate("el => { el.textContent = 'reloading'; }")
        tab.locator(".jp-TaiSandbox-previewReload").click()
        own_origin_works(probe_result(tab.frame_locator("iframe")), origin, session_id, jupyter_cookies)
        with page.context.expect_page() as opened:
            tab.locator(".jp-TaiSandbox-previewOpenBrowser").click()
        popup = opened.value
        popup.wait_for_load_state()
        assert popup.url == origin + "/", popup.url  # the code's redirects end on the clean URL
        own_origin_works(probe_result(popup), origin, session_id, jupyter_cookies)
        popup.close()
        assert not {"planted_by_app", "appc"} & {c["name"] for c in page.context.cookies(lab.url)}

        # another user: 404 on the Jupyter URL, no code
        code, body = call(lab, "GET", f"/api/sandbox/sessions/{session_id}/ports/{APP_PORT}/", user="bob")
        assert code == 404, (code, body)
        assert json.dumps(body, default=str).find("__tai_preview_grant") < 0
    finally:
        call(lab, "DELETE", f"/api/sandbox/sessions/{session_id}")
