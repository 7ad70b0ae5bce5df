"""The Python client: kept-alive connections, streamed transfers past tornado's 100 MiB cap, reconnects,
closing (``aclose``, ``async with``), the blocking destroy, and which server it finds."""

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
import warnings

import pytest

from jupyter_tai_sandbox.client import SandboxClient, SeveralServersWarning, discover_server, running_servers
from jupyter_tai_sandbox.client.http_connections import HTTPConnections
from jupyter_tai_sandbox.client.remote_exec import DIRECT_READ_BYTES, _DirectReads
from jupyter_tai_sandbox.contract import (
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxNotFoundError,
    SandboxUnavailableError,
)
from tests.support.server import server_config

BIG = 120 << 20


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes")


@pytest.fixture
def client(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    # jp_fetch starts the HTTP server the client talks to
    client = SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    )
    yield client
    client.close()


def connections_to(port: int) -> int:
    """Established TCP connections this process holds to ``port`` on localhost."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for row in list(f)[1:]:
                fields = row.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[3] == "01" and fields[9] in inodes:
                    count += 1
    return count


async def test_sequential_calls_share_one_connection(client, jp_http_port):
    info = await client.create(ttl_seconds=120)
    for _ in range(20):
        assert (await client.exec(info["id"], ["true"], timeout_seconds=10)).exit_code == 0
        await client.status()
    assert connections_to(jp_http_port) == 1
    with pytest.raises(SandboxNotFoundError):  # an error answer keeps the connection usable
        await client.info("sbx-0000000000000000")
    assert (await client.info(info["id"]))["id"] == info["id"]
    assert connections_to(jp_http_port) == 1
    await client.destroy(info["id"])


async def test_concurrent_calls_each_get_a_connection(client):
    info = await client.create(ttl_seconds=120)
    results = await asyncio.gather(
        *(client.exec(info["id"], ["sh", "-c", f"sleep 0.2; echo {i}"], timeout_seconds=10) for i in range(6))
    )
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(6)]
    await client.destroy(info["id"])


async def test_streamed_upload_and_download_past_tornados_body_cap(client, tmp_path):
    info = await client.create(ttl_seconds=300)
    block = os.urandom(1 << 20)

    async def chunks():
        for _ in range(BIG // len(block)):
            yield block

    assert (await client.upload(info["id"], "big.bin", chunks()))["size"] == BIG
    with open(tmp_path / "big.bin", "wb") as sink:
        assert await client.download_to(info["id"], "big.bin", sink) == BIG
    with open(tmp_path / "big.bin", "rb") as f:
        assert all(f.read(len(block)) == block for _ in range(BIG // len(block)))
    await client.destroy(info["id"])


async def test_a_connection_the_server_closed_while_idle_is_replaced():
    """A server may close a kept-alive connection between requests; the next request opens a new one."""
    served = []

    async def answer_once_then_close(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        served.append(writer.get_extra_info("peername"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
        await writer.drain()
        writer.close()  # no "Connection: close": the client learns only from the closed socket

    server = await asyncio.start_server(answer_once_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connections = HTTPConnections(f"http://127.0.0.1:{port}/")
    try:
        for _ in range(3):
            response = await connections.fetch("GET", "/", {})
            assert (response.code, response.body) == (200, b"ok")
            await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
        assert len(set(served)) == 3
    finally:
        connections.close()
        server.close()
        await server.wait_closed()


@contextlib.contextmanager
def socket_bound():
    """A port nothing listens on (bound, never listening) while the block runs."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


async def test_an_unreachable_server_is_a_typed_error():
    with socket_bound() as port:
        client = SandboxClient(f"http://127.0.0.1:{port}/", "token")
        with pytest.raises(SandboxUnavailableError, match="cannot reach"):
            await client.status()


async def test_sixteen_mib_both_ways_through_the_clients_websocket(client):
    info = await client.create(ttl_seconds=120)
    data = os.urandom(16 << 20)
    remote = await client.exec_start(info["id"], ["cat"], timeout_seconds=60)

    async def feed():
        for i in range(0, len(data), 1 << 20):
            await remote.write(data[i : i + (1 << 20)])
        await remote.close_stdin()

    feeder = asyncio.create_task(feed())
    received = bytearray()
    items = []
    async for item in remote.output:
        if isinstance(item, OutputChunk):
            assert item.stream == "stdout" and isinstance(item.data, bytes)
            received += item.data
        else:
            items.append(item)
    await feeder
    assert items == [ExitItem(0)] and bytes(received) == data
    await client.destroy(info["id"])


async def test_large_frames_are_read_directly_and_come_out_as_bytes_in_order(client):
    """Frames past DIRECT_READ_BYTES are read into their own buffer (not tornado's copies); every chunk is
    still bytes, in order, each stream counted."""
    info = await client.create(ttl_seconds=120)
    script = "printf a; head -c 3000000 /dev/zero | tr '\\0' b; printf c >&2; printf d"
    remote = await client.exec_start(info["id"], ["sh", "-c", script], timeout_seconds=60)
    assert type(remote._ws.protocol) is _DirectReads
    got: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    largest, items = 0, []
    async for item in remote.output:
        if isinstance(item, OutputChunk):
            assert type(item.data) is bytes
            got[item.stream] += item.data
            largest = max(largest, len(item.data))
        else:
            items.append(item)
    assert items == [ExitItem(0)] and largest + 1 >= DIRECT_READ_BYTES
    assert got == {"stdout": b"a" + b"b" * 3000000 + b"d", "stderr": b"c"}
    assert remote.offsets == {"stdout": 3000002, "stderr": 1}
    await client.destroy(info["id"])


async def test_an_unknown_session_refuses_the_websocket_with_a_typed_error(client):
    with pytest.raises(SandboxNotFoundError):
        await client.exec_start("sbx-0000000000000000", ["true"], timeout_seconds=5)


async def test_a_server_that_never_answers_is_a_typed_error_after_the_request_timeout():
    async def never_answer(reader, writer):
        await reader.read()  # hold the connection until the client drops it

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = SandboxClient(f"http://127.0.0.1:{port}/", "token", request_timeout=0.3)
    try:
        with pytest.raises(SandboxUnavailableError, match="no answer"):
            await client.status()
    finally:
        client.close()
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------- closing, blocking destroy


async def test_async_context_manager_and_aclose(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    url, token = f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    async with SandboxClient(url, token) as client:
        info = await client.create(ttl_seconds=120)
        assert (await client.exec(info["id"], ["true"], timeout_seconds=10)).exit_code == 0
        assert connections_to(jp_http_port) == 1
    assert connections_to(jp_http_port) == 0  # leaving the block closed the idle connection
    async with client:  # a closed client opens connections again when used
        await client.destroy(info["id"])
    await client.aclose()  # closing twice is harmless
    client.close()  # the sync spelling stays


async def test_destroy_blocking_from_a_thread(client):
    info = await client.create(ttl_seconds=120)
    # blocking: never on the loop the server runs on (here the test's own), so from a thread
    assert await asyncio.to_thread(client.destroy_blocking, info["id"]) is True
    with pytest.raises(SandboxNotFoundError):
        await client.info(info["id"])
    assert await asyncio.to_thread(client.destroy_blocking, info["id"]) is False  # already gone
    with socket_bound() as port, pytest.raises(SandboxUnavailableError, match="cannot reach"):
        SandboxClient(f"http://127.0.0.1:{port}/", "t").destroy_blocking("sbx-0000000000000000")


async def test_destroy_blocking_keeps_remove_workspace_and_typed_errors(client):
    info = await client.create(ttl_seconds=120, durability="persistent", workspace_key="blocking-destroy")
    await client.upload(info["id"], "kept.txt", b"x")
    assert await asyncio.to_thread(client.destroy_blocking, info["id"], True)
    again = await client.create(ttl_seconds=120, durability="persistent", workspace_key="blocking-destroy")
    assert await client.list_files(again["id"], "") == []  # remove_workspace=True reached the server
    await client.destroy(again["id"], remove_workspace=True)
    assert await asyncio.to_thread(client.destroy_blocking, "../status") is False  # sent quoted, not resolved
    stranger = SandboxClient(client.url, "not-the-token")
    with pytest.raises(
        SandboxError, match="token is missing or wrong"
    ):  # a refusal is an error, not "already gone"
        await asyncio.to_thread(stranger.destroy_blocking, info["id"])


# ---------------------------------------------------------------- finding the server


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """An empty Jupyter runtime folder, and no TAI_SANDBOX_URL."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("TAI_SANDBOX_URL", raising=False)
    monkeypatch.delenv("TAI_SANDBOX_TOKEN", raising=False)
    return tmp_path


@pytest.fixture
def other_pid():
    """The pid of a live process other than this one (a running server's info file needs one)."""
    process = subprocess.Popen(["sleep", "300"])
    yield process.pid
    process.kill()
    process.wait()


def server_file(runtime, pid: int, url: str, started: float) -> None:
    path = runtime / f"jpserver-{pid}.json"
    path.write_text(json.dumps({"url": url, "token": f"token-{pid}", "pid": pid, "port": 1}))
    os.utime(path, (started, started))


def test_discovery_with_one_server_is_quiet(runtime):
    server_file(runtime, os.getpid(), "http://one/", time.time())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert discover_server() == ("http://one/", f"token-{os.getpid()}")


def test_discovery_picks_the_server_started_first_and_warns(runtime, other_pid):
    now = time.time()
    server_file(runtime, os.getpid(), "http://newer/", now)
    server_file(runtime, other_pid, "http://older/", now - 60)
    for _ in range(3):  # deterministic, whatever order the folder lists them in
        with pytest.warns(
            SeveralServersWarning,
            match=r"2 Jupyter servers are running; using the one started "
            r"first, http://older/ \(pid \d+\), not http://newer/.*TAI_SANDBOX_URL",
        ):
            assert discover_server() == ("http://older/", f"token-{other_pid}")
    assert [s["url"] for s in running_servers()] == ["http://older/", "http://newer/"]
    server_file(runtime, os.getpid(), "http://newer/", now - 120)  # now this one is older
    with pytest.warns(SeveralServersWarning):
        assert discover_server()[0] == "http://newer/"


def test_discovery_prefers_the_environment(runtime, other_pid, monkeypatch):
    server_file(runtime, other_pid, "http://listed/", time.time())
    monkeypatch.setenv("TAI_SANDBOX_URL", "http://from-env/")
    assert discover_server() == ("http://from-env/", "")


def test_no_server_is_a_typed_error(runtime):
    with pytest.raises(SandboxUnavailableError, match="no Jupyter server found"):
        discover_server()
