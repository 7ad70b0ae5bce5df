"""Websockets through web previews: a real jupyter_server and a docker session with network ``none``.

The session runs a websocket echo app written here with the Python standard library only (the Python
image has no websockets package). The browser's websocket goes to ``.../ports/9100/...`` and is relayed
to the app over the session's port connection: text and binary echo, a subprotocol, a large message and
the frame limit, close codes both ways, the app's pings answered, the Origin, owner and gone-session
rules before the upgrade, and a browser that never reads holding the app still, not the server's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import time

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.websocket import WebSocketClosedError

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from tests.support.server import call, exec_call, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

pytestmark = pytest.mark.docker

PORT = 9100
#: the frame limit these tests run with (PreviewSettings.max_ws_frame_bytes)
LIMIT = 4 << 20

#: a websocket echo server, standard library only. Text "info": the handshake it saw, as JSON; "close C R":
#: it closes with code C and reason R; "ping": it pings, then says "pong:<payload>" when the pong came;
#: "big N": it sends N bytes in one binary message; "flood": 1 MiB binary messages until the socket blocks,
#: the bytes sent so far kept in /tmp/flood; anything else comes back as it came. A close from the client
#: is recorded in /tmp/closes ("code reason" lines) and answered with the same code. A path under /refuse
#: is answered 403, no upgrade.
ECHO_APP = r"""
import base64, hashlib, json, socket, struct, sys, threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def exact(c, n):
    data = bytearray()
    while len(data) < n:
        chunk = c.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def frame(c):
    b0, b1 = exact(c, 2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", exact(c, 2))[0]
    elif n == 127:
        n = struct.unpack("!Q", exact(c, 8))[0]
    mask = exact(c, 4) if b1 & 0x80 else b"\0\0\0\0"
    data = bytearray(exact(c, n))
    for i in range(len(data)):
        data[i] ^= mask[i % 4]
    return b0 & 0x80, b0 & 0x0F, bytes(data)


def send(c, opcode, data):
    n = len(data)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
    c.sendall(head + data)


def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = c.recv(65536)
        if not chunk:
            return
        head += chunk
    lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    target = lines[0].split(" ")[1]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if target.startswith("/refuse"):
        c.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope")
        return
    accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest()).decode()
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    chosen = "echo.v2" if "echo.v2" in offered else None
    answer = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    answer += "Sec-WebSocket-Accept: %s\r\n" % accept
    if chosen:
        answer += "Sec-WebSocket-Protocol: %s\r\n" % chosen
    c.sendall((answer + "\r\n").encode())
    parts, kind = [], 0
    while True:
        fin, opcode, data = frame(c)
        if opcode == 8:
            code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1005
            with open("/tmp/closes", "a") as f:
                f.write("%d %s\n" % (code, data[2:].decode()))
            send(c, 8, data[:2])
            return
        if opcode == 9:
            send(c, 10, data)
            continue
        if opcode == 10:
            send(c, 1, b"pong:" + data)
            continue
        if opcode:
            kind = opcode
        parts.append(data)
        if not fin:
            continue
        message, parts = b"".join(parts), []
        if kind == 1 and message == b"info":
            send(c, 1, json.dumps({"target": target, "headers": headers, "subprotocol": chosen}).encode())
        elif kind == 1 and message.startswith(b"close "):
            _, code, reason = message.decode().split(" ", 2)
            send(c, 8, struct.pack("!H", int(code)) + reason.encode())
            frame(c)
            return
        elif kind == 1 and message == b"ping":
            send(c, 9, b"hello")
        elif kind == 1 and message.startswith(b"big "):
            send(c, 2, b"b" * int(message.split()[1]))
        elif kind == 1 and message == b"flood":
            sent, chunk = 0, b"f" * (1 << 20)
            while True:
                send(c, 2, chunk)
                sent += len(chunk)
                with open("/tmp/flood", "w") as f:
                    f.write(str(sent))
        else:
            send(c, kind, message)


def guarded(c):
    try:
        serve(c)
    except (EOFError, OSError):
        pass
    finally:
        c.close()


listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(16)
while True:
    connection, _ = listener.accept()
    threading.Thread(target=guarded, args=(connection,), daemon=True).start()
"""


@pytest.fixture
def jp_server_config(tmp_path):
    from tests.support.docker import python_image

    python_image().close()
    return server_config(
        "docker",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        DockerSandbox={"allowed_images": [PYTHON_IMAGE]},
        PreviewSettings={"max_ws_frame_bytes": LIMIT},
    )


@contextlib.asynccontextmanager
async def echo_app(jp_fetch):
    """A network-none session of alice's running the echo app on PORT: its id (destroyed after)."""
    status, info = await call(
        jp_fetch,
        "sessions",
        method="POST",
        body={"ttl_seconds": 600, "network": "none", "image": PYTHON_IMAGE},
        headers=as_user("alice"),
    )
    assert status == 201, info
    sid = info["id"]
    status, put = await call(
        jp_fetch,
        "sessions",
        sid,
        "files",
        "echo.py",
        method="PUT",
        raw=ECHO_APP.encode(),
        headers=as_user("alice"),
    )
    assert status == 201, put
    start = f"setsid python3 echo.py {PORT} >echo.log 2>&1 </dev/null &"
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", start], headers=as_user("alice"))
    assert status == 200 and result["exit_code"] == 0, result
    probe = f"import socket; socket.create_connection(('127.0.0.1', {PORT}), 1).close()"
    give_up = time.monotonic() + 30
    while True:
        _, result = await exec_call(jp_fetch, sid, ["python3", "-c", probe], headers=as_user("alice"))
        if result["exit_code"] == 0:
            break
        assert time.monotonic() < give_up, result
        await asyncio.sleep(0.2)
    try:
        yield sid
    finally:
        await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))


def connect(jp_ws_fetch, sid, *path, user="alice", headers=None, **kwargs):
    return jp_ws_fetch(
        "api", "sandbox", "sessions", sid, "ports", str(PORT), *path,
        headers={**as_user(user), **(headers or {})}, **kwargs,
    )  # fmt: skip


async def read_file(jp_fetch, sid, path):
    _, result = await exec_call(jp_fetch, sid, ["cat", path], headers=as_user("alice"))
    return result["stdout"] if result["exit_code"] == 0 else ""


async def test_text_and_binary_echo_with_the_browsers_path_query_and_subprotocol(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    token = jp_serverapp.identity_provider.token
    async with echo_app(jp_fetch) as app:
        ws = await connect(
            jp_ws_fetch,
            app,
            "socket",
            "x",
            params={"a": "1", "token": token},
            headers={"Cookie": "jupyter-session=secret"},
            subprotocols=["chat.v1", "echo.v2"],
        )
        try:
            assert ws.selected_subprotocol == "echo.v2"
            await ws.write_message("héllo")
            assert await ws.read_message() == "héllo"
            data = bytes(range(256)) * 4
            await ws.write_message(data, binary=True)
            assert await ws.read_message() == data
            await ws.write_message("info")
            info = json.loads(await ws.read_message())
        finally:
            ws.close()
        assert info["target"] == "/socket/x?a=1", info
        assert info["subprotocol"] == "echo.v2"
        headers = info["headers"]
        assert "cookie" not in headers and "authorization" not in headers and "origin" not in headers, headers
        assert headers["x-forwarded-prefix"].endswith(f"/api/sandbox/sessions/{app}/ports/{PORT}"), headers
        assert "secret" not in json.dumps(info) and token not in json.dumps(info)


async def test_a_large_message_both_ways_and_the_frame_limit(jp_fetch, jp_ws_fetch):
    async with echo_app(jp_fetch) as app:
        ws = await connect(jp_ws_fetch, app, max_message_size=8 << 20)
        data = os.urandom(LIMIT - 1024)
        await ws.write_message(data, binary=True)
        assert await asyncio.wait_for(ws.read_message(), 60) == data
        # the app's message over the limit: the relay closes both sides with 1009
        await ws.write_message(f"big {LIMIT + 1}")
        assert await asyncio.wait_for(ws.read_message(), 60) is None
        assert ws.close_code == 1009, (ws.close_code, ws.close_reason)
        # the browser's message over the limit: refused the same way
        ws = await connect(jp_ws_fetch, app, max_message_size=8 << 20)
        with contextlib.suppress(WebSocketClosedError):  # the server may close while it is still sent
            await ws.write_message(b"x" * (LIMIT + 1), binary=True)
        assert await asyncio.wait_for(ws.read_message(), 60) is None
        assert ws.close_code == 1009, (ws.close_code, ws.close_reason)


async def test_close_codes_pass_through_both_ways_and_the_apps_ping_is_answered(jp_fetch, jp_ws_fetch):
    async with echo_app(jp_fetch) as app:
        ws = await connect(jp_ws_fetch, app)
        await ws.write_message("ping")
        assert await ws.read_message() == "pong:hello"  # the app's ping got its pong
        await ws.write_message("close 4123 app says bye")
        assert await asyncio.wait_for(ws.read_message(), 30) is None
        assert (ws.close_code, ws.close_reason) == (4123, "app says bye")

        ws = await connect(jp_ws_fetch, app)
        await ws.write_message("x")
        assert await ws.read_message() == "x"
        ws.close(4001, "browser says bye")
        give_up = time.monotonic() + 30
        while "4001 browser says bye" not in (closes := await read_file(jp_fetch, app, "/tmp/closes")):
            assert time.monotonic() < give_up, closes
            await asyncio.sleep(0.2)


async def login_cookie(jp_http_port, jp_base_url, jp_serverapp) -> str:
    """The login cookie a browser gets once it opened the server (at the host jp_ws_fetch uses) with its
    token."""
    token = jp_serverapp.identity_provider.token
    url = f"http://localhost:{jp_http_port}{jp_base_url}api/sandbox/status?token={token}"
    response = await AsyncHTTPClient().fetch(url)
    cookies = [c.split(";", 1)[0] for c in response.headers.get_list("Set-Cookie")]
    login = [c for c in cookies if not c.startswith("_xsrf=")]
    assert login, cookies
    return "; ".join(login)


async def test_origin_owner_and_gone_session_are_refused_before_the_upgrade(
    jp_fetch, jp_ws_fetch, jp_http_port, jp_base_url, jp_serverapp
):
    async with echo_app(jp_fetch) as app:
        # a browser logged in by cookie (jupyter_server checks the Origin of those, not of token requests)
        browser = {"Authorization": "", "Cookie": await login_cookie(jp_http_port, jp_base_url, jp_serverapp)}
        with pytest.raises(HTTPClientError) as refused:
            await connect(jp_ws_fetch, app, headers={**browser, "Origin": "http://evil.example"})
        assert refused.value.code in (403, 404), refused.value
        # the server's own origin is let through, and the login cookie does not reach the app
        ws = await connect(
            jp_ws_fetch, app, headers={**browser, "Origin": f"http://localhost:{jp_http_port}"}
        )
        await ws.write_message("info")
        seen = json.loads(await ws.read_message())["headers"]
        assert "cookie" not in seen and "origin" not in seen, seen
        ws.close()

        with pytest.raises(HTTPClientError) as other:
            await connect(jp_ws_fetch, app, user="bob")
        assert other.value.code == 404
        assert json.loads(other.value.response.body)["error"] == "SandboxNotFoundError"

        # nothing listening on the port: a typed 502 before the upgrade
        with pytest.raises(HTTPClientError) as nothing:
            await jp_ws_fetch("api", "sandbox", "sessions", app, "ports", "9101", headers=as_user("alice"))
        assert nothing.value.code == 502
        assert json.loads(nothing.value.response.body)["error"] == "PreviewUpstreamError"

        # the app refuses the upgrade: a typed 502 saying so, and the browser gets no 101
        with pytest.raises(HTTPClientError) as no:
            await connect(jp_ws_fetch, app, "refuse")
        assert no.value.code == 502
        body = json.loads(no.value.response.body)
        assert (
            body["error"] == "PreviewUpstreamError" and "403" in body["message"] and "nope" in body["message"]
        )

        status, _ = await call(jp_fetch, "sessions", app, method="DELETE", headers=as_user("alice"))
        assert status == 204
        with pytest.raises(HTTPClientError) as gone:
            await connect(jp_ws_fetch, app)
        assert gone.value.code == 410
        assert json.loads(gone.value.response.body)["error"] == "PreviewSessionGoneError"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


async def test_a_browser_that_never_reads_stalls_the_app_not_the_servers_memory(jp_fetch, jp_ws_fetch):
    async with echo_app(jp_fetch) as app:
        ws = await connect(jp_ws_fetch, app)
        await ws.write_message("ping")
        assert await ws.read_message() == "pong:hello"
        before = rss_bytes()
        await ws.write_message("flood")  # 1 MiB messages as fast as they go; this client reads none of them
        await asyncio.sleep(4)
        first = int(await read_file(jp_fetch, app, "/tmp/flood") or 0)
        await asyncio.sleep(3)
        second = int(await read_file(jp_fetch, app, "/tmp/flood") or 0)
        grown = rss_bytes() - before
        # the app is held by TCP: it stopped sending (a few buffers' worth in flight), and the server holds
        # no more than that either; the loop still serves the exec calls above
        assert first >= 1 << 20 and first == second, (first, second)
        assert second < 96 << 20, second
        assert grown < 64 << 20, grown
        ws.close()


class TestLimits:
    """The idle timeout and the connection counts, on a server with small ones."""

    @pytest.fixture
    def jp_server_config(self, tmp_path):
        from tests.support.docker import python_image

        python_image().close()
        return server_config(
            "docker",
            tmp_path / "sandboxes",
            ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
            DockerSandbox={"allowed_images": [PYTHON_IMAGE]},
            PreviewSettings={"idle_timeout_seconds": 2, "max_connections_per_session": 2},
        )

    async def test_a_websocket_holds_its_connection_until_it_ends_and_an_idle_one_is_closed(
        self, jp_fetch, jp_ws_fetch
    ):
        async with echo_app(jp_fetch) as app:
            first, second = await connect(jp_ws_fetch, app), await connect(jp_ws_fetch, app)
            with pytest.raises(HTTPClientError) as refused:
                await connect(jp_ws_fetch, app)
            assert refused.value.code == 429
            assert "max_connections_per_session" in json.loads(refused.value.response.body)["message"]
            # traffic keeps a socket open past the idle timeout; one without any is closed (1001)
            started = time.monotonic()
            while time.monotonic() - started < 3:
                await second.write_message("still here")
                assert await second.read_message() == "still here"
                await asyncio.sleep(0.5)
            assert await asyncio.wait_for(first.read_message(), 10) is None
            assert first.close_code == 1001 and "idle_timeout_seconds" in (first.close_reason or "")
            # its connection was given back: another socket opens
            give_up = time.monotonic() + 10
            while True:
                try:
                    third = await connect(jp_ws_fetch, app)
                    break
                except HTTPClientError as e:
                    assert e.code == 429 and time.monotonic() < give_up, e
                    await asyncio.sleep(0.2)
            await third.write_message("hello")
            assert await third.read_message() == "hello"
            second.close()
            third.close()
