"""Port forwarding over the exec seam (jupyter_tai_sandbox.kernels.tunnel), on the local provider and on docker.

In the session a small TCP server (python3, started with exec_start) listens on
127.0.0.1; the test talks to it through the tunnel's host listener only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import sys
import time

import pytest

from jupyter_tai_sandbox.contract import OutputChunk, SessionSpec
from jupyter_tai_sandbox.kernels.tunnel import Tunnel, TunnelError
from tests.support.aio import run
from tests.support.kernels import local_session

pytestmark = pytest.mark.timeout(180)

#: A TCP server for the tests, run in the session: port 0 picks a port, printed as "PORT <n>".
#: Its first line says what to do: "echo", "sink" (read all, answer the sha256 and byte count),
#: "source N" (send N pattern bytes, then half-close), "flood" (send forever, never read).
SERVER = r"""
import hashlib, socket, sys, threading
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(128)
print("PORT", srv.getsockname()[1], flush=True)
PATTERN = bytes(range(256)) * 4096
def line(c):
    b = b""
    while not b.endswith(b"\n"):
        d = c.recv(1)
        if not d: return b""
        b += d
    return b
def serve(c):
    try:
        mode = line(c).split()
        if not mode: return
        if mode[0] == b"echo":
            while True:
                d = c.recv(1 << 16)
                if not d: break
                c.sendall(d)
            c.shutdown(socket.SHUT_WR)
        elif mode[0] == b"sink":
            h, n = hashlib.sha256(), 0
            while True:
                d = c.recv(1 << 16)
                if not d: break
                h.update(d); n += len(d)
            c.sendall(("%s %d\n" % (h.hexdigest(), n)).encode()); c.shutdown(socket.SHUT_WR)
        elif mode[0] == b"source":
            left = int(mode[1])
            while left:
                k = min(left, len(PATTERN)); c.sendall(PATTERN[:k]); left -= k
            c.shutdown(socket.SHUT_WR)
        elif mode[0] == b"flood":
            while True:
                c.sendall(PATTERN)
    except OSError:
        pass
    finally:
        c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

PATTERN = bytes(range(256)) * 4096
BIG = 64 << 20


async def start_server(session, python: str) -> tuple[object, int]:
    handle = await session.exec_start([python, "-u", "-c", SERVER], timeout_seconds=600)
    text = b""
    async for item in handle.output:
        if isinstance(item, OutputChunk):
            text += item.data
            if b"\n" in text:
                break
        else:  # pragma: no cover - the server died
            raise AssertionError(f"the test server ended: {item!r} {text!r}")
    assert text.startswith(b"PORT "), text
    return handle, int(text.split()[1])


def pattern_sha(n: int) -> str:
    h = hashlib.sha256()
    left = n
    while left:
        k = min(left, len(PATTERN))
        h.update(PATTERN[:k])
        left -= k
    return h.hexdigest()


async def talk(port: int, mode: bytes, data: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(mode + b"\n" + data)
    await writer.drain()
    writer.write_eof()
    out = await reader.read()
    writer.close()
    return out


async def check_big_both_ways(port: int) -> None:
    """64 MiB up (sha256 checked in the session) and 64 MiB down (checked here), at the same time."""
    up = (PATTERN * (BIG // len(PATTERN) + 1))[:BIG]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"echo\n")

    async def send() -> None:
        view = memoryview(up)
        for i in range(0, BIG, 1 << 20):
            writer.write(view[i : i + (1 << 20)])
            await writer.drain()
        writer.write_eof()

    async def receive() -> tuple[str, int]:
        h, n = hashlib.sha256(), 0
        while True:
            chunk = await reader.read(1 << 20)
            if not chunk:
                return h.hexdigest(), n
            h.update(chunk)
            n += len(chunk)

    _, (digest, n) = await asyncio.gather(send(), receive())
    writer.close()
    assert n == BIG
    assert digest == hashlib.sha256(up).hexdigest()
    # and separately: 64 MiB into a sink, 64 MiB out of a source
    answer = await talk(port, b"sink", up)
    assert answer.split() == [hashlib.sha256(up).hexdigest().encode(), str(BIG).encode()]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"source %d\n" % BIG)
    h, n = hashlib.sha256(), 0
    while chunk := await reader.read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    writer.close()
    assert (n, h.hexdigest()) == (BIG, pattern_sha(BIG))


@contextlib.asynccontextmanager
async def tunnel_to_server(session, python: str):
    server, port = await start_server(session, python)
    tunnel = await Tunnel.start(session, python=python, timeout_seconds=600)
    try:
        forward = await tunnel.forward(port)
        yield tunnel, forward.port
    finally:
        await tunnel.close()
        await server.kill()


def test_many_connections_and_half_close(tmp_path):
    async def main() -> None:
        async with (
            local_session(tmp_path) as session,
            tunnel_to_server(session, sys.executable) as (tunnel, port),
        ):
            payloads = [os.urandom(1 + i * 997) for i in range(64)]
            answers = await asyncio.gather(*(talk(port, b"echo", p) for p in payloads))
            assert answers == payloads
            # half-close: we stop writing, the server still answers after it saw our EOF
            answer = await talk(port, b"sink", b"x" * 1000)
            assert answer.split()[1] == b"1000"
            for _ in range(50):  # both sides closed: the relay and the host forget the connections
                if tunnel.connections == 0:
                    break
                await asyncio.sleep(0.05)
            assert tunnel.connections == 0

    run(main())


def test_64_mib_both_ways_byte_exact(tmp_path):
    async def main() -> None:
        async with local_session(tmp_path) as session, tunnel_to_server(session, sys.executable) as (_, port):
            await check_big_both_ways(port)

    run(main())


def test_a_slow_connection_does_not_stall_the_others(tmp_path):
    async def main() -> None:
        async with (
            local_session(tmp_path) as session,
            tunnel_to_server(session, sys.executable) as (tunnel, port),
        ):
            # one connection floods towards a reader that never reads; another sends into a sink that
            # the server reads, while a third one does echo round trips
            slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
            slow_writer.write(b"flood\n")
            await slow_writer.drain()
            await asyncio.sleep(1.0)  # its window fills up
            started = time.monotonic()
            for i in range(20):
                assert await talk(port, b"echo", b"ping %d" % i) == b"ping %d" % i
            assert await talk(port, b"source 10000000") == (PATTERN * 10)[:10_000_000]
            assert time.monotonic() - started < 20
            # the flood is held at its window, not buffered without bound on the host
            assert len(slow_reader._buffer) <= tunnel.window + (1 << 20)
            slow_writer.close()

    run(main())


def test_killing_the_relay_ends_every_connection(tmp_path):
    async def main() -> None:
        async with (
            local_session(tmp_path) as session,
            tunnel_to_server(session, sys.executable) as (tunnel, port),
        ):
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
            for _, writer in conns:
                writer.write(b"echo\n")
                await writer.drain()
            reader, writer = conns[0]
            writer.write(b"hello")
            assert await reader.readexactly(5) == b"hello"
            await tunnel.handle.kill()  # the relay dies (as with its session)
            await asyncio.wait_for(tunnel.closed.wait(), 10)
            assert "relay" in (tunnel.exit_reason or "")

            async def ended(reader: asyncio.StreamReader) -> bool:
                with contextlib.suppress(ConnectionError):
                    return await reader.read() == b""
                return True

            assert all(await asyncio.wait_for(asyncio.gather(*(ended(r) for r, _ in conns)), 10))
            # the listener is closed too
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
            with pytest.raises(TunnelError):
                await tunnel.forward(port)

    run(main())


def test_a_relay_that_cannot_start_says_why(tmp_path):
    async def main() -> None:
        async with local_session(tmp_path) as session:
            with pytest.raises(TunnelError, match="did not start"):
                await Tunnel.start(
                    session, python="/nonexistent/python3", timeout_seconds=60, start_timeout_seconds=10
                )

    run(main())


def test_a_connection_to_a_closed_port_is_reset(tmp_path):
    async def main() -> None:
        async with local_session(tmp_path) as session:
            tunnel = await Tunnel.start(session, python=sys.executable, timeout_seconds=120)
            try:
                probe = socket.socket()
                probe.bind(("127.0.0.1", 0))
                closed_port = probe.getsockname()[1]
                probe.close()
                forward = await tunnel.forward(closed_port)
                reader, writer = await asyncio.open_connection("127.0.0.1", forward.port)
                with contextlib.suppress(ConnectionError):
                    assert await asyncio.wait_for(reader.read(), 10) == b""
                writer.close()
            finally:
                await tunnel.close()

    run(main())


# ---------------------------------------------------------------- docker


@pytest.fixture
def python_engine():
    """The engine, with the Python image (skipped without it; a failure in CI); nothing of the test left on it."""
    from tests.support.docker import leftovers, python_image

    client = python_image()
    yield client
    try:
        assert leftovers(client) == []
    finally:
        client.close()


@contextlib.asynccontextmanager
async def python_docker_session(agent_transport: str = "auto"):
    """A docker session of the Python image with network none."""
    from jupyter_tai_sandbox.images import PYTHON_IMAGE
    from jupyter_tai_sandbox.providers.docker import DockerSandbox
    from tests.support.docker import RUN_LABEL

    sandbox = DockerSandbox(
        image=PYTHON_IMAGE, extra_labels=RUN_LABEL, pool_size=0, agent_transport=agent_transport
    )
    session = await sandbox.create(SessionSpec(network="none", consumer="tunnel-test"))
    try:
        yield session
    finally:
        await session.destroy()
        await sandbox.close()


def test_tunnel_on_docker_with_network_none(python_engine):
    async def main() -> None:
        async with python_docker_session() as session, tunnel_to_server(session, "python3") as (_, port):
            payloads = [os.urandom(100 + i) for i in range(16)]
            assert await asyncio.gather(*(talk(port, b"echo", p) for p in payloads)) == payloads
            await check_big_both_ways(port)

    run(main())


@pytest.mark.parametrize("agent_transport", ["auto", "exec"])
def test_a_docker_sessions_own_ports_forward_with_half_close_flow_control_and_no_relay(
    python_engine, agent_transport
):
    """On the agent the session opens its ports itself (SessionPorts): nothing runs in it for the forwarding.
    A server that reaches the agent's socket (root here) makes each connection itself in the container's
    network, a socket joined to the host's; through the engine's exec, the agent dials and carries it."""
    from jupyter_tai_sandbox.kernels.ports import SessionPorts

    async def main() -> None:
        async with python_docker_session(agent_transport) as session:
            assert session.opens_ports
            server, inner = await start_server(session, "python3")
            probe = await session.open_port(inner)
            try:
                direct = probe.take_socket()
                assert (direct is not None) == (agent_transport == "auto" and os.geteuid() == 0)
                if direct is not None:
                    direct.close()
            finally:
                await probe.close()
            ports = SessionPorts(session)
            port = (await ports.forward(inner)).port
            payloads = [os.urandom(100 + i * 997) for i in range(32)]
            assert await asyncio.gather(*(talk(port, b"echo", p) for p in payloads)) == payloads
            assert (await talk(port, b"sink", b"x" * 1000)).split()[1] == b"1000"  # answered after our EOF
            await check_big_both_ways(port)
            # a connection whose reader never reads stalls only itself
            slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
            slow_writer.write(b"flood\n")
            await asyncio.sleep(1.0)
            for i in range(10):
                assert await talk(port, b"echo", b"ping %d" % i) == b"ping %d" % i
            assert len(slow_reader._buffer) <= 8 << 20
            slow_writer.close()
            # anyone on the host may dial a listener: past 64 open connections one more is closed at once
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(64)]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            for _, held_writer in held:
                held_writer.close()
            await asyncio.sleep(0.5)
            assert await talk(port, b"echo", b"again") == b"again"
            # nothing listens: the client's connection ends at once (no wait asked)
            closed = (await ports.forward(1)).port
            reader, writer = await asyncio.open_connection("127.0.0.1", closed)
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            # a kernel still binding: the connect is tried again within connect_wait (a python that starts
            # in the session and binds after the first try; on a busy machine that may take seconds)
            late = (await ports.forward(inner + 1 if inner < 65535 else inner - 1, connect_wait=30)).port
            waiting = asyncio.ensure_future(talk(late, b"echo", b"late"))
            await asyncio.sleep(0.5)
            await session.exec(
                [
                    "python3",
                    "-c",
                    f"""
import socket, os
s = socket.socket(); s.bind(("127.0.0.1", {inner + 1 if inner < 65535 else inner - 1})); s.listen(1)
c, _ = s.accept(); c.recv(5); data = b""
while chunk := c.recv(100): data += chunk
c.sendall(data); c.close()
""",
                ],
                timeout_seconds=30,
            )
            assert await asyncio.wait_for(waiting, 10) == b"late"
            await server.kill()
            await ports.close()
            # every connection was given back to the agent (it holds at most 64 commands and connections)
            agent = await session._client()
            assert [c for c in await agent.list() if c["argv"][0] == "tcp"] == []
            with pytest.raises(TunnelError):
                await ports.forward(inner)

    run(main())


def test_closing_a_docker_sessions_ports_ends_a_connection_still_dialling(python_engine):
    """A connection accepted while nothing listens in the session yet (a kernel restarting) is ended when the
    forwarding closes, not left open: a ZeroMQ client on it waits 30 s for the peer's greeting before it dials
    again, so every other kernel restart took 30 s to be ready."""
    from jupyter_tai_sandbox.kernels.ports import SessionPorts

    async def main() -> None:
        async with python_docker_session() as session:
            ports = SessionPorts(session)
            port = (await ports.forward(1, connect_wait=60)).port
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.5)  # the forwarding is dialling port 1, again and again
            await ports.close()
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()

    run(main())
