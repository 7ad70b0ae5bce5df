"""The Python client: kept-alive connections, streamed transfers past tornado's 100 MiB cap, reconnects."""

import asyncio
import contextlib
import os
import socket

import pytest
from server_support import server_config

from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import ExitItem, OutputChunk, SandboxNotFoundError, SandboxUnavailableError
from jupyter_tai_sandbox.http_connections import HTTPConnections

BIG = 120 << 20


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes")


@pytest.fixture
def client(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    # jp_fetch starts the HTTP server the client talks to
    client = SandboxClient(f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token)
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
