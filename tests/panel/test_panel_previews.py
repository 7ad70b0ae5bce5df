"""Issue 54's "Done when", in a real browser: a docker session with network ``none`` (the Python image) runs
``python3 -m http.server`` serving a page of this test's own, and a websocket echo app (standard library
only, written here); both open from the panel's Ports list in JupyterLab tabs (the preview route, through the
session's port connection). The page's script tries what an app must never do with the Jupyter origin's
rights: ``fetch('/api/sandbox/sessions')`` (plain and with credentials), read ``document.cookie``, set a
cookie; all are refused (the preview's opaque origin: the server's CSP ``sandbox`` and the iframe's own), in
the tab, after its reload, and top-level ("Open in a browser tab"). A websocket to the echo app through the
preview route, opened from the JupyterLab page (the browser's login and Origin), echoes. Another user gets
404 on the same URL; once the session is destroyed its URL answers 410.

Not asserted here, and known not to work under the opaque origin: the app's own requests from its page (a
script beside it, a fetch of its own data, a websocket its page opens) carry ``Origin: null`` (and, top-level,
no login cookie), which the server refuses; the probe page records them (``ownScript``, ``ownFetch``).

Fixtures and helpers are in tests/support/lab.py; screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.lab import BROWSER_MARKS, Lab, LabProcess, open_panel, shot

pytestmark = [*BROWSER_MARKS, pytest.mark.docker, pytest.mark.slow(120)]

HTTP_PORT = 8000
WS_PORT = 8765
COOKIE = "preview_planted"

#: the http.server page: what its script tried, written into the page as JSON (#result, body[data-done])
PROBE_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>preview probe</title></head>
<body><h1>preview probe</h1><pre id="result">running</pre>
<script src="probe.js"></script>
<script>
(async () => {
  const out = {};
  const tryFetch = async (init) => {
    try {
      const r = await fetch('/api/sandbox/sessions', init);
      return 'status ' + r.status + ': ' + (await r.text()).slice(0, 300);
    } catch (e) {
      return 'refused: ' + e.name;
    }
  };
  out.fetch = await tryFetch({});
  out.fetchWithCredentials = await tryFetch({ credentials: 'include' });
  try {
    out.cookieRead = 'read: [' + document.cookie + ']';
  } catch (e) {
    out.cookieRead = 'threw: ' + e.name;
  }
  try {
    document.cookie = 'COOKIE=1; path=/';
    out.cookieSet = 'no error';
  } catch (e) {
    out.cookieSet = 'threw: ' + e.name;
  }
  try {
    out.cookieAfter = 'read: [' + document.cookie + ']';
  } catch (e) {
    out.cookieAfter = 'threw: ' + e.name;
  }
  out.origin = String(self.origin);
  // the app's own: a script beside the page (a classic script: no CORS), and a fetch of its own data
  out.ownScript = self.probeScriptRan ? 'ran' : 'did not run';
  try {
    const r = await fetch('data.json');
    out.ownFetch = 'status ' + r.status + ': ' + (await r.text()).slice(0, 100);
  } catch (e) {
    out.ownFetch = 'refused: ' + e.name;
  }
  document.getElementById('result').textContent = JSON.stringify(out);
  document.body.dataset.done = '1';
})();
</script></body></html>
""".replace("COOKIE", COOKIE)

#: a websocket echo app, standard library only: GET without Upgrade answers a page whose script opens
#: a websocket to ``echo`` beside it (through the preview) and writes what came back into #ws
WS_ECHO_APP = r'''
import base64, hashlib, socketserver, struct

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PAGE = b"""<!doctype html><html><head><meta charset="utf-8"><title>ws echo</title></head>
<body><pre id="ws">pending</pre><script>
const out = document.getElementById('ws');
const done = text => { if (!document.body.dataset.done) { out.textContent = text; document.body.dataset.done = '1'; } };
try {
  const url = location.href.replace(/^http/, 'ws').replace(/[?#].*$/, '').replace(/\/?$/, '/') + 'echo';
  const ws = new WebSocket(url);
  ws.onopen = () => ws.send('hello through the preview');
  ws.onmessage = e => { done('echoed: ' + e.data); ws.close(); };
  ws.onerror = () => done('error');
  ws.onclose = e => done('closed ' + e.code);
} catch (e) {
  done('threw ' + e);
}
</script></body></html>"""


class Handler(socketserver.BaseRequestHandler):
    def recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.request.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send_frame(self, opcode, data):
        n = len(data)
        if n < 126:
            size = bytes([n])
        elif n < 65536:
            size = bytes([126]) + struct.pack(">H", n)
        else:
            size = bytes([127]) + struct.pack(">Q", n)
        self.request.sendall(bytes([0x80 | opcode]) + size + data)

    def handle(self):
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("upgrade", "").lower() != "websocket":
            self.request.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\nContent-Length: "
                + str(len(PAGE)).encode() + b"\r\n\r\n" + PAGE
            )
            return
        key = headers["sec-websocket-key"] + GUID
        accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
        self.request.sendall(
            ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Accept: " + accept + "\r\n\r\n").encode()
        )
        try:
            while True:
                b1, b2 = self.recv_exact(2)
                opcode, n = b1 & 0x0F, b2 & 0x7F
                if n == 126:
                    n = struct.unpack(">H", self.recv_exact(2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", self.recv_exact(8))[0]
                mask = self.recv_exact(4) if b2 & 0x80 else b"\0\0\0\0"
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(self.recv_exact(n)))
                if opcode == 8:
                    self.send_frame(8, data[:2])
                    return
                if opcode == 9:
                    self.send_frame(10, data)
                elif opcode in (1, 2):
                    self.send_frame(opcode, data)
        except (EOFError, OSError):
            return


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


Server(("0.0.0.0", PORT), Handler).serve_forever()
'''.replace("PORT", str(WS_PORT))


#: the owner: every request of this test names it (X-Test-User), the browser's too; "bob" is another user
OWNER = "alice"


def call(lab: Lab, method: str, path: str, body: Any = None, user: str = OWNER) -> tuple[int, Any]:
    """A request to a server path with the token, as ``user``: (status, JSON or bytes)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"token {lab.token}", "X-Test-User": user, "Content-Type": "application/json"}
    request = urllib.request.Request(f"{lab.url}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, kind = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, json.loads(raw) if raw and kind.startswith("application/json") else raw


def run(lab: Lab, session_id: str, argv: list[str]) -> dict[str, Any]:
    code, result = call(
        lab, "POST", f"/api/sandbox/sessions/{session_id}/exec", {"argv": argv, "timeout_seconds": 60}
    )
    assert code == 200 and result["exit_code"] == 0, (code, result)
    return result


def start_apps(lab: Lab, session_id: str) -> None:
    """Write the probe page and the echo app into the session's ``previews`` folder; start both apps."""
    files = {
        "previews/www/index.html": PROBE_PAGE,
        "previews/www/probe.js": "self.probeScriptRan = true;\n",
        "previews/www/data.json": '{"own": "data"}\n',
        "previews/ws_echo.py": WS_ECHO_APP,
    }
    write = (
        "import base64, json, pathlib\n"
        f"for name, text in json.loads(base64.b64decode({base64.b64encode(json.dumps(files).encode())!r})).items():\n"
        "    path = pathlib.Path(name); path.parent.mkdir(parents=True, exist_ok=True); path.write_text(text)\n"
    )
    run(lab, session_id, ["python3", "-c", write])
    start = (
        f"setsid python3 -m http.server {HTTP_PORT} --directory previews/www >/dev/null 2>&1 </dev/null & "
        "setsid python3 previews/ws_echo.py >previews/ws_echo.log 2>&1 </dev/null &"
    )
    run(lab, session_id, ["sh", "-c", start])


@contextlib.contextmanager
def previews_lab(lab_process: LabProcess) -> Iterator[tuple[Lab, str]]:
    """A lab on the docker provider (another user by ``X-Test-User``) and a network-``none`` session of the
    Python image running both apps; the session destroyed after (if the test did not)."""
    from jupyter_tai_sandbox.images import PYTHON_IMAGE
    from tests.support import docker as docker_support

    docker_support.python_image().close()  # the engine and the Python image, or skip (fail in CI)
    lab = lab_process.start(
        "docker",
        *docker_support.server_args(PYTHON_IMAGE)[1:],  # sessions of the Python image, this run's label
        f"--DockerSandbox.deployment={os.environ['TAI_SANDBOX_DEPLOYMENT']}-panel-previews",
        # X-Test-User names another user (the browser, sending none, is the token's own user);
        "--ServerApp.identity_provider_class=tests.support.users.HeaderUsers",
        # no one but "admin" holds the admin resource (the default Authorizer grants it to everyone)
        "--ServerApp.authorizer_class=tests.support.users.AdminOnlyAdmin",
        isolation="container",
    )
    code, info = call(lab, "POST", "/api/sandbox/sessions", {"network": "none", "ttl_seconds": 900})
    assert code == 201, info
    session_id = info["id"]
    try:
        assert info["network"] == "none"
        start_apps(lab, session_id)
        yield lab, session_id
    finally:
        call(lab, "DELETE", f"/api/sandbox/sessions/{session_id}")


def open_ports(page: Any, lab: Lab, session_id: str) -> Any:
    """The panel, the session's details open, both apps in its Ports list; the list's locator."""
    from playwright.sync_api import expect

    # the browser's requests name the owner too (a token or cookie login alone is a new anonymous user)
    page.context.set_extra_http_headers({"X-Test-User": OWNER})
    panel = open_panel(page, lab)
    item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{session_id}"]')
    item.locator(".jp-TaiSandbox-sessionRow").click()
    ports = item.locator(".jp-TaiSandbox-portsList")
    # the list is asked again every few seconds while shown: both apps show once they listen
    expect(ports.locator(f'.jp-TaiSandbox-port[data-port="{HTTP_PORT}"]')).to_be_visible(timeout=60_000)
    expect(ports.locator(f'.jp-TaiSandbox-port[data-port="{WS_PORT}"]')).to_be_visible(timeout=60_000)
    return ports


def open_preview(page: Any, ports: Any, port: int) -> Any:
    """Open from the panel: the preview tab's locator, once it shows."""
    from playwright.sync_api import expect

    ports.locator(f'.jp-TaiSandbox-port[data-port="{port}"] .jp-TaiSandbox-openPort').click()
    tab = page.locator(f'.jp-TaiSandbox-preview[data-port="{port}"]')
    expect(tab).to_be_visible()
    return tab


def probe_result(frame: Any) -> dict[str, Any]:
    from playwright.sync_api import expect

    expect(frame.locator("body[data-done]")).to_be_attached(timeout=30_000)
    return json.loads(frame.locator("#result").inner_text())


def test_previews_from_the_panel_keep_the_app_out_of_the_jupyter_origin(
    lab_process: LabProcess, page: Any
) -> None:
    from playwright.sync_api import expect

    with previews_lab(lab_process) as (lab, session_id):
        ports = open_ports(page, lab, session_id)
        shot(page, "previews-ports-list")

        # the http.server page, opened from the panel in a JupyterLab tab: a sandboxed iframe of the URL
        tab = open_preview(page, ports, HTTP_PORT)
        iframe = tab.locator("iframe")
        url = f"{lab.url}/api/sandbox/sessions/{session_id}/ports/{HTTP_PORT}/"
        assert iframe.get_attribute("src") == url
        assert "allow-same-origin" not in (iframe.get_attribute("sandbox") or "")
        frame = tab.frame_locator("iframe")
        result = probe_result(frame)
        shot(page, "previews-probe-page")

        def refused(found: dict[str, Any]) -> None:
            for what in ("fetch", "fetchWithCredentials"):
                # refused (an opaque origin: no CORS, and the server's origin check), or no sessions in it
                assert found[what].startswith("refused") or session_id not in found[what], found
            assert found["cookieRead"].startswith("threw") or found["cookieRead"] == "read: []", found
            assert found["cookieSet"].startswith("threw") or found["cookieAfter"] == "read: []", found
            assert found["origin"] == "null", found  # an opaque origin, not the Jupyter server's

        refused(result)
        server_cookies = page.context.cookies(lab.url)
        assert server_cookies, "the browser holds the Jupyter login cookie"
        assert COOKIE not in {c["name"] for c in server_cookies}, server_cookies

        # reload (the toolbar's): the page loads again, its probe runs again
        frame.locator("#result").evaluate("el => { el.textContent = 'reloading'; }")
        tab.locator(".jp-TaiSandbox-previewReload").click()
        refused(probe_result(frame))

        # "Open in a browser tab": the same URL, top-level; the server's CSP keeps its origin opaque there too
        with page.context.expect_page() as opened:
            tab.locator(".jp-TaiSandbox-previewOpenBrowser").click()
        popup = opened.value
        popup.wait_for_load_state()
        assert popup.url == url
        refused(probe_result(popup))
        popup.close()
        assert COOKIE not in {c["name"] for c in page.context.cookies(lab.url)}

        # the websocket echo app: a tab from the panel too; a websocket to it through the preview route
        # (from the JupyterLab page: the browser's login and Origin, as the relay checks them) echoes
        ws_tab = open_preview(page, ports, WS_PORT)
        expect(ws_tab.frame_locator("iframe").locator("#ws")).to_be_attached()
        ws_url = f"{lab.url.replace('http', 'ws', 1)}/api/sandbox/sessions/{session_id}/ports/{WS_PORT}/echo"
        echoed = page.evaluate(
            """url => new Promise(resolve => {
                const ws = new WebSocket(url);
                ws.onopen = () => ws.send('hello through the preview');
                ws.onmessage = e => { resolve('echoed: ' + e.data); ws.close(); };
                ws.onerror = () => resolve('error');
                ws.onclose = e => resolve('closed ' + e.code);
            })""",
            ws_url,
        )
        assert echoed == "echoed: hello through the preview"

        # the owner reaches the URL (no token in it: the browser's login; here the token header); another
        # user gets 404 on the very same URL, as for an id that does not exist
        path = f"/api/sandbox/sessions/{session_id}/ports/{HTTP_PORT}/"
        code, body = call(lab, "GET", path)
        assert code == 200 and b"preview probe" in body, (code, body)
        code, body = call(lab, "GET", path, user="bob")
        assert code == 404 and b"preview probe" not in json.dumps(body, default=str).encode(), (code, body)
        assert call(lab, "GET", f"/api/sandbox/sessions/{session_id}/ports", user="bob")[0] == 404

        # destroyed: the URL answers 410 (to the browser's login too), never another app
        code, body = call(lab, "DELETE", f"/api/sandbox/sessions/{session_id}")
        assert code in (200, 204), body
        code, body = call(lab, "GET", path)
        assert code == 410, (code, body)
        assert page.request.get(url, headers={"X-Test-User": OWNER}).status == 410
