"""Per-session preview origins (PreviewSettings.origin_template) on a real jupyter_server and real docker
sessions with network ``none``.

The server runs with ``http://{session}-{port}.preview.localhost:{server_port}``; these clients connect to
127.0.0.1 and send the preview host's name as Host (a browser resolves ``*.localhost`` to loopback itself).
A session runs :data:`APP` (standard library only: a page whose script loads its own files, fetches its own
JSON and opens a websocket to its own origin, plus an echo of what it was sent and a websocket echo). Checked:
a browser's document GET of the Jupyter route is redirected with a one-time code, which is single use,
expires, and is bound to its session port; the preview host's cookie and what it is good for (only that
session port, only its user: another user's code, cookie or login is refused, and the owner is checked
again on every request), the app at the origin's root (its ``/api/...`` is the app's, not Jupyter's), its
cookies kept (host-only) while the preview cookie never reaches it, websockets only from the origin itself,
and a gone session's cookie answering 410.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect
from traitlets import TraitError

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.previews.origin import COOKIE_NAME, GRANT_PATH, Grant, OriginTemplate, PreviewCookies
from jupyter_tai_sandbox.previews.settings import PreviewSettings
from jupyter_tai_sandbox.previews.urls import port_path
from jupyter_tai_sandbox.server.preview_handlers import CSP_SANDBOX
from tests.support.server import call, exec_call, sandbox_app, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

TEMPLATE = "http://{session}-{port}.preview.localhost:{server_port}"
APP_PORT = 8001

#: the app (``python3 app.py PORT [JUPYTER_ORIGIN]``): ``/`` a page loading ``app.js`` (relative), which
#: fetches ``data.json``, opens ``ws``, tries ``/api/sandbox/sessions`` on the Jupyter origin (if given) and
#: reads and sets ``document.cookie``, its findings as JSON in ``#result``; ``/echo`` what it was sent (JSON); ``/setcookie`` two cookies
#: (one with a parent Domain, one named as the preview cookie); ``/ws`` a websocket echo
APP = r"""
import base64, hashlib, json, struct, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JUPYTER = sys.argv[2] if len(sys.argv) > 2 else ''
PAGE = ('''<!doctype html><html><head><meta charset="utf-8"><title>origin probe</title></head>
<body data-jupyter="%s"><h1>origin probe</h1><pre id="result">running</pre><script src="app.js"></script>
</body></html>''' % JUPYTER).encode()

SCRIPT = rb'''
(async () => {
  const out = {script: 'ran', origin: location.origin};
  try {
    const r = await fetch('data.json');
    out.fetch = r.status + ' ' + JSON.stringify(await r.json());
  } catch (e) { out.fetch = 'failed: ' + e; }
  out.ws = await new Promise((resolve) => {
    try {
      const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
      ws.onopen = () => ws.send('hello over ws');
      ws.onmessage = (m) => { resolve('echo: ' + m.data); ws.close(); };
      ws.onerror = () => resolve('error');
      setTimeout(() => resolve('timeout'), 10000);
    } catch (e) { resolve('threw: ' + e); }
  });
  const jupyter = document.body.dataset.jupyter;
  if (jupyter) {
    for (const [key, init] of [['jupyterFetch', {}], ['jupyterFetchWithCredentials', {credentials: 'include'}]]) {
      try {
        const r = await fetch(jupyter + '/api/sandbox/sessions', init);
        out[key] = 'status ' + r.status + ': ' + (await r.text()).slice(0, 200);
      } catch (e) { out[key] = 'refused: ' + e.name; }
    }
  }
  out.cookieBefore = document.cookie;
  // one cookie from its server (a Set-Cookie without SameSite), one from its script (in the JupyterLab
  // tab the page is a cross-site frame: a script's cookie there needs SameSite=None; Secure)
  await fetch('setcookie');
  document.cookie = 'planted_by_app=1; path=/; SameSite=None; Secure; Partitioned';
  out.cookieAfter = document.cookie;
  document.getElementById('result').textContent = JSON.stringify(out);
  document.body.dataset.done = '1';
})();
'''


def read_frame(r):
    head = r.read(2)
    if len(head) < 2:
        return None
    opcode, size = head[0] & 15, head[1] & 127
    if size == 126:
        size = struct.unpack('>H', r.read(2))[0]
    elif size == 127:
        size = struct.unpack('>Q', r.read(8))[0]
    mask = r.read(4) if head[1] & 128 else bytes(4)
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(size)))


def send_frame(w, opcode, data):
    n = len(data)
    size = bytes([n]) if n < 126 else bytes([126]) + struct.pack('>H', n) if n < 65536 else bytes([127]) + struct.pack('>Q', n)
    w.write(bytes([0x80 | opcode]) + size + data)
    w.flush()


class App(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):
        pass

    def send(self, body, kind, headers=()):
        self.send_response(200)
        self.send_header('Content-Type', kind)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(body)

    def websocket(self):
        key = self.headers['Sec-WebSocket-Key'].encode()
        accept = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest()).decode()
        self.send_response(101)
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept', accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while (got := read_frame(self.rfile)) is not None:
            opcode, data = got
            if opcode == 8:
                send_frame(self.wfile, 8, data[:2])
                return
            if opcode == 9:
                send_frame(self.wfile, 10, data)
            elif data == b'cookie?':
                send_frame(self.wfile, 1, self.headers.get('Cookie', '').encode())
            elif opcode in (1, 2):
                send_frame(self.wfile, opcode, data)

    def handle_one(self):
        length = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(length) if length else b''
        path = self.path.split('?')[0]
        if path == '/ws' and self.headers.get('Upgrade', '').lower() == 'websocket':
            self.websocket()
        elif path == '/':
            self.send(PAGE, 'text/html')
        elif path == '/app.js':
            self.send(SCRIPT, 'text/javascript')
        elif path == '/data.json':
            self.send(b'{"hello": "data"}', 'application/json')
        elif path == '/setcookie':
            self.send(b'ok', 'text/plain', [('Set-Cookie', 'appc=1; Domain=preview.localhost; Path=/'),
                                            ('Set-Cookie', '__Host-tai-preview=forged; Path=/; Secure')])
        else:
            seen = {'method': self.command, 'path': self.path, 'headers': dict(self.headers.items()),
                    'body': body.decode('latin-1')}
            self.send(json.dumps(seen).encode(), 'application/json')

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_one


ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), App).serve_forever()
"""


# ------------------------------------------------------------------ the template, checked at start


def test_the_template_is_checked_when_the_settings_are_made():
    template = OriginTemplate(TEMPLATE)
    assert template.origin("sbx-0123abcd", 8000, "8888") == "http://sbx-0123abcd-8000.preview.localhost:8888"
    assert template.parse("sbx-0123abcd-8000.preview.localhost") == ("sbx-0123abcd", 8000)
    assert template.parse("sbx-0123abcd-8000.preview.localhost.evil.org") is None
    assert template.parse("preview.localhost") is None
    https = OriginTemplate("https://{session}-{port}.previews.example.org")
    assert https.origin("sbx-1", 80, "443") == "https://sbx-1-80.previews.example.org"
    assert https.parse("SBX-1-80.Previews.Example.org") == ("sbx-1", 80)
    assert not OriginTemplate.fits("Upper.case_id")
    for bad, says in (
        ("ftp://{session}-{port}.x.localhost", "http:// or https://"),
        ("http://{session}-{port}.previews.example.org", "only under .localhost"),
        ("https://{session}.previews.example.org", "{port} once each"),
        ("https://previews.{session}-{port}.example.org", "first label"),
        ("https://{session}-{port}.example.org/path", "origin only"),
        ("https://{session}-{port}-{user}.example.org", "unknown placeholder {user}"),
        ("https://{session}-{port}", "parent domain"),
    ):
        with pytest.raises(ValueError) as raised:  # the message is checked below
            OriginTemplate(bad)
        assert says in str(raised.value), (bad, raised.value)
        with pytest.raises(TraitError, match=r"PreviewSettings\.origin_template"):
            PreviewSettings(origin_template=bad)
    assert PreviewSettings().origin is None  # empty: the opaque-origin mode


# ------------------------------------------------------------------ a real server with a template


@pytest.fixture
def jp_server_config(tmp_path):
    from tests.support.docker import python_image

    python_image().close()
    return server_config(
        "docker",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        DockerSandbox={"allowed_images": [PYTHON_IMAGE]},
        PreviewSettings={"origin_template": TEMPLATE},
    )


class Client:
    """Requests as a browser (or a tool) would make them: to the Jupyter route (token, X-Test-User) and to a
    preview host (127.0.0.1 with the host's name as Host); never raising on a status, never following."""

    def __init__(self, port: int, base_url: str, token: str) -> None:
        self.port, self.base_url, self.token = port, base_url.rstrip("/"), token
        self.http = AsyncHTTPClient()

    def host(self, sid: str, port: int) -> str:
        return f"{sid}-{port}.preview.localhost:{self.port}"

    async def _fetch(self, url: str, headers: dict[str, str], method: str = "GET", body: bytes | None = None):
        if method in ("POST", "PUT") and body is None:
            body = b""
        request = HTTPRequest(
            url, method=method, headers=headers, body=body, follow_redirects=False, request_timeout=60
        )
        try:
            return await self.http.fetch(request)
        except HTTPClientError as e:
            assert e.response is not None, e
            return e.response

    async def jupyter(self, path: str, user: str = "alice", document: bool = True, **headers: str):
        sent = {"Authorization": f"token {self.token}", **as_user(user), **headers}
        if document:
            sent["Sec-Fetch-Dest"] = "document"
        return await self._fetch(f"http://127.0.0.1:{self.port}{self.base_url}{path}", sent)

    async def preview(
        self,
        sid: str,
        port: int,
        path: str,
        cookie: str | None = None,
        method: str = "GET",
        body: bytes | None = None,
        **headers: str,
    ):
        sent = {"Host": self.host(sid, port), **headers}
        if cookie is not None:
            sent["Cookie"] = cookie
        return await self._fetch(f"http://127.0.0.1:{self.port}{path}", sent, method, body)

    async def code(self, sid: str, port: int, path: str = "", user: str = "alice") -> tuple[str, str]:
        """A one-time code for ``user`` from the Jupyter route, and the grant's ``next``."""
        response = await self.jupyter(port_path(sid, port, path), user=user)
        assert response.code == 302, (response.code, response.body[:300])
        location = urlsplit(response.headers["Location"])
        assert f"{location.scheme}://{location.netloc}" == f"http://{self.host(sid, port)}"
        assert location.path == GRANT_PATH
        query = parse_qs(location.query)
        return query["code"][0], query["next"][0]

    async def login(self, sid: str, port: int, user: str = "alice") -> str:
        """The preview host's cookie (``name=value``) for ``user``, through the code exchange."""
        code, _ = await self.code(sid, port, user=user)
        response = await self.preview(sid, port, f"{GRANT_PATH}?code={code}&next=/")
        assert response.code == 302, (response.code, response.body[:300])
        return response.headers["Set-Cookie"].split(";", 1)[0]


def error_of(response) -> str:
    return json.loads(response.body)["error"]


async def start_app(jp_fetch, user: str, run_app: bool = True) -> str:
    status, info = await call(
        jp_fetch,
        "sessions",
        method="POST",
        body={"ttl_seconds": 600, "network": "none", "image": PYTHON_IMAGE},
        headers=as_user(user),
    )
    assert status == 201, info
    sid = info["id"]
    if not run_app:
        return sid
    status, put = await call(
        jp_fetch, "sessions", sid, "files", "app.py", method="PUT", raw=APP.encode(), headers=as_user(user)
    )
    assert status == 201, put
    start = f"setsid python3 app.py {APP_PORT} >app.log 2>&1 </dev/null &"
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", start], headers=as_user(user))
    assert status == 200 and result["exit_code"] == 0, result
    probe = f"import socket; socket.create_connection(('127.0.0.1', {APP_PORT}), 1).close()"
    give_up = time.monotonic() + 30
    while True:
        _, result = await exec_call(jp_fetch, sid, ["python3", "-c", probe], headers=as_user(user))
        if result["exit_code"] == 0:
            return sid
        assert time.monotonic() < give_up, result
        await asyncio.sleep(0.2)


@pytest.mark.docker
async def test_a_session_port_on_its_own_origin(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    client = Client(jp_http_port, jp_base_url, jp_serverapp.identity_provider.token)
    alice = await start_app(jp_fetch, "alice")
    bob = await start_app(jp_fetch, "bob", run_app=False)
    try:
        cookie = await _checks(client, jp_serverapp, alice, bob)
    finally:
        await call(jp_fetch, "sessions", bob, method="DELETE", headers=as_user("bob"))
        await call(jp_fetch, "sessions", alice, method="DELETE", headers=as_user("alice"))
    # a gone session's cookie: 410, never another app
    gone = await client.preview(alice, APP_PORT, "/echo", cookie=cookie)
    assert gone.code == 410 and error_of(gone) == "PreviewSessionGoneError", gone.body


async def _checks(client: Client, jp_serverapp, alice: str, bob: str) -> str:
    """Everything above with both sessions live; alice's cookie for APP_PORT."""
    settings = sandbox_app(jp_serverapp).previews

    # the Jupyter route: a document is redirected with a code; a tool's request is relayed there as before
    code, next_path = await client.code(alice, APP_PORT, "echo?a=1")
    assert next_path == "/echo?a=1"
    relayed = await client.jupyter(port_path(alice, APP_PORT, "echo"), document=False)
    assert relayed.code == 200 and relayed.headers["Content-Security-Policy"] == CSP_SANDBOX

    # another user's login gets no code for alice's session: 404, no redirect
    other = await client.jupyter(port_path(alice, APP_PORT, ""), user="bob")
    assert other.code == 404 and "Location" not in other.headers, other.body

    # the code becomes the host's cookie, once
    granted = await client.preview(alice, APP_PORT, f"{GRANT_PATH}?code={code}&next=/echo%3Fa%3D1")
    assert granted.code == 302 and granted.headers["Location"] == "/echo?a=1"
    set_cookie = granted.headers["Set-Cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in set_cookie.split(";")[1:]}
    assert set_cookie.startswith(COOKIE_NAME + "=")
    assert {"path", "max-age", "httponly", "secure", "samesite", "partitioned"} <= attributes
    assert "domain" not in attributes and "SameSite=None" in set_cookie
    cookie = set_cookie.split(";", 1)[0]
    again = await client.preview(alice, APP_PORT, f"{GRANT_PATH}?code={code}&next=/")
    assert again.code == 403 and error_of(again) == "PreviewGrantError"
    assert "Set-Cookie" not in again.headers
    outside = await client.preview(alice, APP_PORT, f"{GRANT_PATH}?code=x&next=//evil.example/")
    assert outside.code == 403

    # with it: the app at the origin's root, without the CSP sandbox, its own cookies only
    page = await client.preview(alice, APP_PORT, "/echo?a=1&token=secret", cookie=f"mine=1; {cookie}")
    assert page.code == 200, page.body
    seen = json.loads(page.body)
    assert seen["path"] == "/echo?a=1"
    assert seen["headers"].get("Cookie") == "mine=1"
    assert seen["headers"]["X-Forwarded-Host"] == client.host(alice, APP_PORT)
    assert "X-Forwarded-Prefix" not in seen["headers"]
    assert "Content-Security-Policy" not in page.headers
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Cross-Origin-Resource-Policy"] == "same-origin"
    # a browser's page there is the app's (no redirect on the preview host itself)
    document = await client.preview(alice, APP_PORT, "/", cookie=cookie, **{"Sec-Fetch-Dest": "iframe"})
    assert document.code == 200 and b"origin probe" in document.body, document.code
    # an app's /api/... is the app's, not Jupyter's
    api = await client.preview(alice, APP_PORT, "/api/sandbox/sessions", cookie=cookie)
    assert api.code == 200 and json.loads(api.body)["path"] == "/api/sandbox/sessions"
    # its cookies host-only; one named as the preview cookie never set
    app_cookies = (await client.preview(alice, APP_PORT, "/setcookie", cookie=cookie)).headers.get_list(
        "Set-Cookie"
    )
    assert app_cookies == ["appc=1; Path=/; SameSite=None; Secure; Partitioned"], app_cookies

    # no cookie, or Jupyter's token, or a made-up one: refused
    for refused in (
        await client.preview(alice, APP_PORT, "/echo"),
        await client.preview(alice, APP_PORT, "/echo", Authorization=f"token {client.token}"),
        await client.preview(alice, APP_PORT, "/echo", cookie=f"{COOKIE_NAME}=e30.AAAA"),
    ):
        assert refused.code == 403 and error_of(refused) == "PreviewGrantError", refused.body
    # the cookie is for that session port only
    for sid, port in ((alice, APP_PORT + 1), (bob, APP_PORT)):
        elsewhere = await client.preview(sid, port, "/echo", cookie=cookie)
        assert elsewhere.code == 403 and error_of(elsewhere) == "PreviewGrantError", (sid, port)
    # and a code too: redeemed at another port's host, refused (and spent)
    code, _ = await client.code(alice, APP_PORT)
    wrong = await client.preview(alice, APP_PORT + 1, f"{GRANT_PATH}?code={code}&next=/")
    assert wrong.code == 403
    spent = await client.preview(alice, APP_PORT, f"{GRANT_PATH}?code={code}&next=/")
    assert spent.code == 403
    # a code expires
    settings.codes.seconds = 0.3
    try:
        code, _ = await client.code(alice, APP_PORT)
        await asyncio.sleep(0.6)
        late = await client.preview(alice, APP_PORT, f"{GRANT_PATH}?code={code}&next=/")
        assert late.code == 403 and error_of(late) == "PreviewGrantError"
    finally:
        settings.codes.seconds = 30.0

    # unsafe methods: from the origin itself, or without an Origin (a tool); never from another origin
    own = f"http://{client.host(alice, APP_PORT)}"
    for origin, expected in (
        (own, 200),
        (None, 200),
        (f"http://127.0.0.1:{client.port}", 403),
        ("null", 403),
    ):
        headers = {"Origin": origin} if origin else {}
        posted = await client.preview(
            alice, APP_PORT, "/echo", cookie=cookie, method="POST", body=b"x", **headers
        )
        assert posted.code == expected, (origin, posted.code, posted.body[:200])

    # websockets: from the origin itself only, with the cookie
    url = f"ws://127.0.0.1:{client.port}/ws"
    ws = await websocket_connect(
        HTTPRequest(
            url, headers={"Host": client.host(alice, APP_PORT), "Origin": own, "Cookie": f"mine=1; {cookie}"}
        )
    )
    await ws.write_message("hello")
    assert await asyncio.wait_for(ws.read_message(), 30) == "hello"
    await ws.write_message("cookie?")  # the app's own cookies reach its websocket, the preview cookie never
    assert await asyncio.wait_for(ws.read_message(), 30) == "mine=1"
    ws.close()
    for headers in (
        {"Origin": f"http://127.0.0.1:{client.port}", "Cookie": cookie},
        {"Origin": own},
        {"Cookie": cookie},
    ):
        with pytest.raises(HTTPClientError) as raised:
            await websocket_connect(
                HTTPRequest(url, headers={"Host": client.host(alice, APP_PORT), **headers})
            )
        assert raised.value.code == 403, headers

    # bob: his own session port's cookie works on his host (nothing listens there: 502, past the checks),
    # not on alice's; nor does his code; a cookie for bob on alice's session fails the owner check (404)
    bob_cookie = await client.login(bob, APP_PORT, user="bob")
    assert (await client.preview(bob, APP_PORT, "/", cookie=bob_cookie)).code == 502
    assert (await client.preview(alice, APP_PORT, "/", cookie=bob_cookie)).code == 403
    bob_code, _ = await client.code(bob, APP_PORT, user="bob")
    assert (await client.preview(alice, APP_PORT, f"{GRANT_PATH}?code={bob_code}&next=/")).code == 403
    secret = jp_serverapp.web_app.settings["cookie_secret"]
    secret = secret.encode() if isinstance(secret, str) else secret
    minted = PreviewCookies(secret, 60).make(
        Grant("bob", frozenset(), frozenset({"read", "write", "execute"}), alice, APP_PORT, 0)
    )
    not_his = await client.preview(alice, APP_PORT, "/echo", cookie=f"{COOKIE_NAME}={minted}")
    assert not_his.code == 404, not_his.body

    # a cookie expires
    settings.origin_cookie_seconds = 3.0
    try:
        short = await client.login(alice, APP_PORT)
        assert (await client.preview(alice, APP_PORT, "/echo", cookie=short)).code == 200
        await asyncio.sleep(4.1)
        expired = await client.preview(alice, APP_PORT, "/echo", cookie=short)
        assert expired.code == 403 and error_of(expired) == "PreviewGrantError"
    finally:
        settings.origin_cookie_seconds = 8 * 3600.0
    return cookie
