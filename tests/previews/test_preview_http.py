"""The web preview route's HTTP half on a real jupyter_server and real docker sessions with network ``none``.

A session of the Python image runs ``python3 -m http.server`` (a page and a 20 MiB file) and a small app of
this test's own (it echoes what it was sent, answers a Range, a chunked body, a cookie and a CSP of its
own, and can sit silent). Through ``/api/sandbox/sessions/{id}/ports/{port}/...``: bytes exact, the prefix
stripped (or not, under ``absolute-ports``), the query kept without ``token``, X-Forwarded-* seen, Cookie,
Authorization and the token never seen by the app, Set-Cookie dropped and the CSP sandbox present; another
user 404, nothing listening 502, idle 504, the limits 413 and 429, a POST with a cookie and no XSRF 403,
and the destroyed session's URL 410.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.previews.urls import port_path
from jupyter_tai_sandbox.server.preview_handlers import CSP_SANDBOX, without_token
from tests.support.server import call, exec_call, sandbox_app, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

pytestmark = [pytest.mark.docker]

USERS = {"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin}
BIG = 20 << 20

#: the test's own app: what it was sent (echo), a Range, a chunked body, a cookie and a CSP, silence
APP = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DATA = bytes(range(256)) * 64


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if not size:
                    self.rfile.readline()
                    return out, "chunked"
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length), "length"

    def handle_one(self):
        body, framing = self._body()
        path = self.path.split("?")[0]
        if path.endswith("/range"):
            first, last = self.headers["Range"].split("=")[1].split("-")
            part = DATA[int(first) : int(last) + 1]
            self._send(206, part, [("Content-Range", f"bytes {first}-{last}/{len(DATA)}"),
                                   ("Content-Type", "application/octet-stream")])
        elif path.endswith("/chunked"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                piece = f"piece {i}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        elif path.endswith("/cookie"):
            self._send(200, b"<p>cookie</p>", [("Content-Type", "text/html"), ("Set-Cookie", "app=1; Path=/"),
                                              ("Set-Cookie", "other=2"), ("Content-Security-Policy", "img-src 'self'")])
        elif path.endswith("/silent"):
            time.sleep(30)
            self._send(200, b"late")
        else:
            seen = {"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                    "body": body.decode("latin-1"), "framing": framing}
            self._send(200, json.dumps(seen).encode(), [("Content-Type", "application/json")])

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = handle_one


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), App).serve_forever()
"""


@pytest.fixture
def jp_server_config(tmp_path):
    from tests.support.docker import python_image

    python_image().close()
    return server_config(
        "docker", tmp_path / "sandboxes", ServerApp=USERS, DockerSandbox={"allowed_images": [PYTHON_IMAGE]}
    )


@pytest.fixture
def fetch(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    """A request to a server path (from port_path) as ``user`` (the token, unless headers say otherwise):
    the response, never raising on a status."""
    token = jp_serverapp.identity_provider.token
    client = AsyncHTTPClient()

    async def fetch(path: str, *, user: str = "alice", method: str = "GET", **kwargs):
        headers = {"Authorization": f"token {token}", **as_user(user), **kwargs.pop("headers", {})}
        headers = {name: value for name, value in headers.items() if value}
        url = f"http://localhost:{jp_http_port}{jp_base_url.rstrip('/')}{path}"
        if method in ("POST", "PUT") and "body" not in kwargs and "body_producer" not in kwargs:
            kwargs["body"] = b""
        request = HTTPRequest(url, method=method, headers=headers, request_timeout=60, **kwargs)
        try:
            return await client.fetch(request)
        except HTTPClientError as e:
            assert e.response is not None, e
            return e.response

    return fetch


async def started(fetch, sid: str, port: int) -> None:
    give_up = time.monotonic() + 30
    while True:
        response = await fetch(port_path(sid, port, "echo"))
        if response.code == 200:
            return
        assert response.code == 502 and time.monotonic() < give_up, (response.code, response.body[:300])
        await asyncio.sleep(0.3)


async def holding(settings, sid: str) -> None:
    """Wait until the server holds a preview connection to ``sid`` (a request admitted, not yet answered)."""
    give_up = time.monotonic() + 30
    while not settings._per_session.get(sid):
        assert time.monotonic() < give_up
        await asyncio.sleep(0.02)


def error_of(response) -> dict:
    return json.loads(response.body)


async def test_http_through_a_preview(jp_fetch, fetch, jp_serverapp, jp_base_url, jp_http_port):
    status, info = await call(
        jp_fetch,
        "sessions",
        method="POST",
        body={"ttl_seconds": 300, "network": "none", "image": PYTHON_IMAGE},
        headers=as_user("alice"),
    )
    assert status == 201, info
    sid = info["id"]
    try:
        await _checks(jp_fetch, fetch, jp_serverapp, jp_base_url, jp_http_port, sid)
    finally:
        await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))
    # the destroyed session's preview answers 410, never another app
    for path in (port_path(sid, 8000, "index.html"), port_path(sid, 8001, "echo", absolute=True)):
        response = await fetch(path)
        assert response.code == 410 and error_of(response)["error"] == "PreviewSessionGoneError", (
            response.body
        )
        assert "gone" in error_of(response)["message"]
    never = await fetch(port_path("sbx-0000000000000000", 8000))
    assert never.code == 410


async def _checks(jp_fetch, fetch, jp_serverapp, jp_base_url, jp_http_port, sid: str) -> None:
    start = (
        f"cat > app.py <<'APP_END'\n{APP}\nAPP_END\n"
        f"mkdir site && head -c {BIG} /dev/urandom > site/big.bin && echo '<h1>hello</h1>' > site/index.html && "
        "(cd site && setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &) && "
        "(setsid python3 app.py 8001 >/dev/null 2>&1 </dev/null &) && sha256sum site/big.bin"
    )
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", start], headers=as_user("alice"))
    assert status == 200 and result["exit_code"] == 0, result
    digest = result["stdout"].split()[0]
    await started(fetch, sid, 8001)
    give_up = time.monotonic() + 30
    while (page := await fetch(port_path(sid, 8000, "index.html"))).code == 502:
        assert time.monotonic() < give_up
        await asyncio.sleep(0.3)

    # the app's root without its slash is sent to it with the slash (relative links then resolve), query kept
    bare = await fetch(port_path(sid, 8000).rstrip("/") + "?a=1", follow_redirects=False)
    assert bare.code == 302 and bare.headers["Location"].endswith(port_path(sid, 8000) + "?a=1"), bare.headers
    # a page and a 20 MiB file, byte for byte, with the security headers
    assert page.code == 200 and page.body == b"<h1>hello</h1>\n", page.body[:200]
    assert page.headers["Content-Security-Policy"] == CSP_SANDBOX and "allow-same-origin" not in CSP_SANDBOX
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert page.headers["Content-Type"].startswith("text/html")
    received = hashlib.sha256()
    sizes = []

    def chunk(data: bytes) -> None:
        sizes.append(len(data))
        received.update(data)

    big = await fetch(port_path(sid, 8000, "big.bin"), streaming_callback=chunk)
    assert big.code == 200 and int(big.headers["Content-Length"]) == BIG
    assert sum(sizes) == BIG and received.hexdigest() == digest
    assert len(sizes) > 1  # it came in pieces, as the app sent it

    # HEAD: the length, no body; OPTIONS reaches the app (not the API's CORS answer)
    head = await fetch(port_path(sid, 8000, "big.bin"), method="HEAD")
    assert head.code == 200 and int(head.headers["Content-Length"]) == BIG and not head.body
    options = json.loads((await fetch(port_path(sid, 8001, "echo"), method="OPTIONS")).body)
    assert options["method"] == "OPTIONS", options

    # a Range: 206 with the app's Content-Range
    ranged = await fetch(port_path(sid, 8001, "range"), headers={"Range": "bytes=100-299"})
    assert ranged.code == 206 and ranged.headers["Content-Range"] == "bytes 100-299/16384"
    assert ranged.body == (bytes(range(256)) * 2)[100:300]

    # a chunked response passes through (re-chunked by the server), whole
    chunked = await fetch(port_path(sid, 8001, "chunked"))
    assert chunked.code == 200 and chunked.body == b"".join(f"piece {i}\n".encode() for i in range(5))
    assert "Content-Length" not in chunked.headers

    # POST: the body echoed; the query kept without token; the prefix stripped; X-Forwarded-*
    token = jp_serverapp.identity_provider.token
    posted = await fetch(
        port_path(sid, 8001, f"echo/a%20b?x=1&token={token}&y=2&tokenish=3"), method="POST", body=b"hello app"
    )
    seen = json.loads(posted.body)
    assert posted.code == 200 and seen["method"] == "POST" and seen["body"] == "hello app", seen
    assert seen["path"].startswith("/echo/a%20b?") and "token=" not in seen["path"].replace("tokenish", ""), (
        seen
    )
    assert sorted(seen["path"].split("?")[1].split("&")) == ["tokenish=3", "x=1", "y=2"], seen
    headers = {name.lower(): value for name, value in seen["headers"].items()}
    prefix = f"{jp_base_url.rstrip('/')}/api/sandbox/sessions/{sid}/ports/8001"
    assert headers["x-forwarded-prefix"] == prefix
    assert headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-host"].endswith(f":{jp_http_port}")
    assert headers["x-forwarded-port"] == str(jp_http_port)
    assert headers["x-forwarded-for"] in ("127.0.0.1", "::1")
    assert headers["host"] == "127.0.0.1:8001"
    # the user's credentials never reach the app: the token (parameter or header), a cookie, Authorization
    assert "authorization" not in headers and "cookie" not in headers and token not in posted.body.decode()

    # a chunked request body streams (tornado's client sends one with a body producer)
    async def produce(write):
        for i in range(4):
            await write(b"part%d;" % i)

    streamed = await fetch(port_path(sid, 8001, "echo"), method="PUT", body_producer=produce)
    seen = json.loads(streamed.body)
    assert seen["body"] == "part0;part1;part2;part3;" and seen["framing"] == "chunked", seen

    # absolute-ports: the app sees the whole path
    absolute = json.loads((await fetch(port_path(sid, 8001, "x/y", absolute=True))).body)
    assert absolute["path"] == f"{jp_base_url.rstrip('/')}/api/sandbox/sessions/{sid}/absolute-ports/8001/x/y"
    assert absolute["headers"]["X-Forwarded-Prefix"].endswith(f"/{sid}/absolute-ports/8001")

    # a browser logged in by cookie: the cookie never reaches the app either; a POST without _xsrf is refused
    login = await fetch(f"/api/sandbox/status?token={token}", headers={"Authorization": ""})
    cookies = [c.split(";", 1)[0] for c in login.headers.get_list("Set-Cookie")]
    by_cookie = {"Authorization": "", "Cookie": "; ".join(c for c in cookies if not c.startswith("_xsrf="))}
    seen = json.loads((await fetch(port_path(sid, 8001, "echo"), headers=by_cookie)).body)
    assert "Cookie" not in seen["headers"] and "Authorization" not in seen["headers"], seen
    refused = await fetch(port_path(sid, 8001, "echo"), method="POST", body=b"x", headers=by_cookie)
    assert refused.code == 403 and "xsrf" in error_of(refused)["message"].lower(), refused.body

    # the app's Set-Cookie dropped, its own CSP kept beside the sandbox
    cookie = await fetch(port_path(sid, 8001, "cookie"))
    set_cookies = cookie.headers.get_list("Set-Cookie")  # Jupyter's own login cookie may be refreshed
    assert cookie.code == 200 and not [c for c in set_cookies if c.startswith(("app=", "other="))], (
        set_cookies
    )
    assert cookie.headers.get_list("Content-Security-Policy") == [CSP_SANDBOX, "img-src 'self'"]

    # another user: 404 like an unknown id (and never 410 for a live session)
    other = await fetch(port_path(sid, 8001, "echo"), user="bob")
    assert other.code == 404 and error_of(other)["error"] == "SandboxNotFoundError", other.body

    # nothing listening: 502 typed
    nothing = await fetch(port_path(sid, 8009, ""))
    assert nothing.code == 502 and error_of(nothing)["error"] == "PreviewUpstreamError", nothing.body
    assert "nothing is listening on port 8009" in error_of(nothing)["message"]

    # the limits: a body over max_request_body_bytes 413, one connection over a count 429, idle 504
    settings = sandbox_app(jp_serverapp).previews
    settings.max_request_body_bytes = 1000
    too_big = await fetch(port_path(sid, 8001, "echo"), method="POST", body=b"x" * 1001)
    assert too_big.code == 413 and error_of(too_big)["error"] == "PreviewBodyTooLargeError", too_big.body
    assert "PreviewSettings.max_request_body_bytes" in error_of(too_big)["message"]

    async def produce_big(write):
        for _ in range(3):
            await write(b"y" * 600)

    too_big = await fetch(port_path(sid, 8001, "echo"), method="POST", body_producer=produce_big)
    assert too_big.code == 413 and error_of(too_big)["error"] == "PreviewBodyTooLargeError", too_big.body
    settings.max_request_body_bytes = 256 << 20

    settings.max_response_bytes = BIG - 1
    refused = await fetch(port_path(sid, 8000, "big.bin"))
    assert refused.code == 502 and "PreviewSettings.max_response_bytes" in error_of(refused)["message"]
    settings.max_response_bytes = 0

    settings.idle_timeout_seconds = 1.0
    settings.max_connections_per_session = 1
    held = asyncio.ensure_future(fetch(port_path(sid, 8001, "silent")))
    await holding(settings, sid)
    second = await fetch(port_path(sid, 8001, "echo"))
    assert second.code == 429 and error_of(second)["error"] == "PreviewConnectionsError", second.body
    assert "PreviewSettings.max_connections_per_session" in error_of(second)["message"]
    silent = await held
    assert silent.code == 504 and error_of(silent)["error"] == "PreviewIdleTimeoutError", silent.body
    assert "PreviewSettings.idle_timeout_seconds" in error_of(silent)["message"]
    settings.max_connections_per_session = 64
    settings.max_connections_per_user = 1
    held = asyncio.ensure_future(fetch(port_path(sid, 8001, "silent")))
    await holding(settings, sid)
    second = await fetch(port_path(sid, 8000, "index.html"))
    assert second.code == 429 and "max_connections_per_user" in error_of(second)["message"], second.body
    assert (await held).code == 504
    settings.max_connections_per_user = 256
    settings.idle_timeout_seconds = 300.0
    # every connection was given back
    assert (await fetch(port_path(sid, 8000, "index.html"))).code == 200
    assert not settings._per_session and not settings._per_user


def test_the_token_parameter_is_removed_and_the_rest_kept_as_sent():
    assert without_token("token=abc") == ""
    assert without_token("a=1&token=abc&b=%20&token&c") == "a=1&b=%20&c"
    assert without_token("tokens=1&x=token") == "tokens=1&x=token"
