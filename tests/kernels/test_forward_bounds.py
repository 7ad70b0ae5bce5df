"""What a kernel's forwarded ports may cost the server (issue 50, finding 3): 100 connections of the server's
own user that send and never read once took the server from 131 to 544 MiB (4 MiB a connection) and the
relay in the session to 200 MiB. Now each side holds at most its budget of queued bytes over every
connection, connections past a cap are closed at once (slots kept for the server's own process), and a
connection of another process that moves nothing is closed after the idle timeout.

The flood comes from another process, as it would (the server's own clients are never idle-closed); memory
is asserted against generous bounds (the machine may be loaded), never timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jupyter_tai_sandbox.kernels.tunnel import DEFAULT_BUDGET, MAX_FRAME, Tunnel
from tests.kernels.test_tunnel import python_docker_session, python_engine, start_server, talk  # noqa: F401
from tests.support.aio import run
from tests.support.kernels import local_session

pytestmark = pytest.mark.timeout(240)

#: the idle timeout of the tests that have one: the client says which connections are open 1 s after it opened
#: them, so a timeout that short could close them first on a loaded machine
IDLE_TIMEOUT = 3.0

#: A client process: ``port n mode``. Opens n connections (each says "echo"), prints "open <k>" (how many the
#: forwarder kept: the others read an end at once), then per mode: "flood" sends on each and never reads,
#: printing "flooding" after a second; "idle" holds them; "busy" does an echo round trip on each every 0.2 s.
#: On "report" (stdin) it prints, per connection, "closed" or "open" (and "busy <round trips>").
CLIENT = r"""
import select, socket, sys, threading, time
port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks, kept = [], []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"echo\n")
    socks.append(s)
time.sleep(1.0)
for s in socks:  # the forwarder closes a refused connection at once: it reads an end (or a reset)
    r, _, _ = select.select([s], [], [], 0)
    try:
        ended = bool(r) and s.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        ended = True
    if not ended:
        kept.append(s)
print("open", len(kept), flush=True)
trips = [0]
def flood():
    chunk = b"x" * (1 << 16)
    for s in kept:
        s.setblocking(False)
    started = time.monotonic()
    said = False
    while True:
        _, w, _ = select.select([], kept, [], 0.2)
        for s in w:
            try:
                s.send(chunk)
            except OSError:
                pass
        if not said and time.monotonic() - started > 1:
            print("flooding", flush=True)
            said = True
def busy():
    while True:
        for s in kept:
            s.sendall(b"ping")
            got = b""
            while len(got) < 4:
                d = s.recv(4 - len(got))
                if not d:
                    return
                got += d
            trips[0] += 1
        time.sleep(0.2)
if mode == "flood":
    threading.Thread(target=flood, daemon=True).start()
elif mode == "busy":
    threading.Thread(target=busy, daemon=True).start()
for line in sys.stdin:
    if mode == "flood":
        continue
    states = []
    for s in kept:
        try:
            s.setblocking(False)
            d = s.recv(1 << 16)
            states.append("closed" if d == b"" else "open")
        except BlockingIOError:
            states.append("open")
        except OSError:
            states.append("closed")
        finally:
            s.setblocking(True)
    print(" ".join(states), "trips", trips[0], flush=True)
"""


def rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


async def relay_pid(session) -> int:
    """The relay's process: the one running the relay program in this session's workspace (its cwd)."""
    workspace = os.path.realpath((await session.info()).workspace)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                relay = b"def charge(before, after)" in f.read()
            if relay and os.path.realpath(os.readlink(f"/proc/{entry}/cwd")) == workspace:
                return int(entry)
    raise AssertionError("no relay process found")


class Client:
    """A CLIENT process (another process of the server's user)."""

    def __init__(self, port: int, n: int, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(port), str(n), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def line(self, timeout: float = 60) -> str:
        assert self.proc.stdout is not None
        return (await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)).strip()

    async def report(self) -> list[str]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("report\n")
        self.proc.stdin.flush()
        return (await self.line()).split()

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@contextlib.asynccontextmanager
async def echo_tunnel(**settings):
    with tempfile.TemporaryDirectory() as tmp:
        async with local_session(Path(tmp)) as session:
            server, port = await start_server(session, sys.executable)
            tunnel = await Tunnel.start(session, python=sys.executable, timeout_seconds=600, **settings)
            try:
                yield tunnel, (await tunnel.forward(port)).port, await relay_pid(session)
            finally:
                await tunnel.close()
                await server.kill()


async def settled(tunnel: Tunnel, pid: int, seconds: float = 90) -> None:
    """Wait until neither the host's queued bytes nor the relay's size moved by a MiB for 3 s."""
    last, still = -1, 0
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while still < 3 and loop.time() < until:
        await asyncio.sleep(1.0)
        now = tunnel.buffered + rss(pid)
        still = still + 1 if abs(now - last) < (1 << 20) else 0
        last = now


def test_100_connections_that_send_and_never_read_hold_at_most_the_budget_on_either_side():
    async def main() -> None:
        async with echo_tunnel() as (tunnel, port, relay):
            server_before, relay_before = rss(), rss(relay)
            flood = Client(port, 100, "flood")
            try:
                assert await flood.line() == "open 100"
                assert await flood.line() == "flooding"
                await settled(tunnel, relay)
                assert tunnel.connections == 100
                # the host: at most its budget of the relay's bytes (and a frame and an output chunk of the stream)
                assert tunnel.peak_buffered <= DEFAULT_BUDGET + MAX_FRAME + (4 << 20), tunnel.peak_buffered
                assert tunnel.buffered > DEFAULT_BUDGET // 2  # the flood did fill it (a test that tests)
                # the sizes: before, +4 MiB a connection here and 2 MiB in the relay (+411 and +200 MiB)
                relay_growth, server_growth = rss(relay) - relay_before, rss() - server_before
                assert relay_growth < 64 << 20, relay_growth
                assert server_growth < 128 << 20, server_growth
                # the last quarter of the budget is the server's own: another process's flood stops short of it
                assert tunnel.buffered <= DEFAULT_BUDGET - DEFAULT_BUDGET // 4, tunnel.buffered
                # the kernel's own client still gets through, at once, and is granted from that last quarter
                assert await asyncio.wait_for(talk(port, b"echo", b"still here"), 30) == b"still here"
                most = 0
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"source %d\n" % (16 << 20))
                got = 0
                while chunk := await asyncio.wait_for(reader.read(1 << 20), 60):
                    got += len(chunk)
                    most = max(most, tunnel._committed)
                writer.close()
                assert got == 16 << 20
                assert most > DEFAULT_BUDGET - DEFAULT_BUDGET // 4, most
            finally:
                flood.end()
            for _ in range(200):  # the flood's end frees everything it held
                if tunnel.connections == 0:
                    break
                await asyncio.sleep(0.05)
            assert (tunnel.connections, tunnel.buffered, tunnel._committed) == (0, 0, 0)

    run(main())


def test_an_idle_connection_of_another_process_is_closed_after_the_timeout_a_busy_one_and_the_servers_are_not():
    async def main() -> None:
        # the idle timeout is well past the client's 1 s before it says what is open (a loaded machine)
        async with echo_tunnel(idle_timeout=IDLE_TIMEOUT) as (tunnel, port, _):
            # the server's own connection (this process), idle as a kernel's are while nobody runs a cell
            own_reader, own_writer = await asyncio.open_connection("127.0.0.1", port)
            own_writer.write(b"echo\n")
            idle, busy = Client(port, 2, "idle"), Client(port, 2, "busy")
            try:
                assert await idle.line() == "open 2" and await busy.line() == "open 2"
                await asyncio.sleep(4.0)
                idle_states, busy_states = await idle.report(), await busy.report()
                assert idle_states[:2] == ["closed", "closed"], idle_states
                assert busy_states[:2] == ["open", "open"] and int(busy_states[-1]) >= 4, busy_states
                own_writer.write(b"mine")
                assert await asyncio.wait_for(own_reader.readexactly(4), 30) == b"mine"
                assert tunnel.connections == 3  # the busy two and this process's own
            finally:
                idle.end()
                busy.end()
                own_writer.close()

    run(main())


def test_past_the_cap_another_processs_connection_is_closed_at_once_and_the_servers_own_keep_their_slots():
    async def main() -> None:
        async with echo_tunnel(max_connections=8, reserved=3) as (tunnel, port, _):
            others = Client(port, 8, "idle")
            try:
                assert await others.line() == "open 5"  # 8 less the 3 kept for the server's own process
                own = []
                for i in range(3):
                    own.append(await asyncio.open_connection("127.0.0.1", port))
                    own[-1][1].write(b"echo\nown %d" % i)
                    assert await asyncio.wait_for(own[-1][0].readexactly(5), 30) == b"own %d" % i
                assert tunnel.connections == 8
                reader, writer = await asyncio.open_connection("127.0.0.1", port)  # the ninth: none left
                with contextlib.suppress(ConnectionError):
                    assert await asyncio.wait_for(reader.read(), 10) == b""
                writer.close()
                for _, own_writer in own:
                    own_writer.close()
            finally:
                others.end()

    run(main())


#: 100 ZeroMQ clients of another process on a kernel's heartbeat port (an echo): each sends 64 KiB messages and
#: reads nothing back (a receive queue of one message and a 4 KiB socket buffer)
ZMQ_FLOOD = r"""
import sys, time, zmq
port, n = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
socks = []
for _ in range(n):
    s = ctx.socket(zmq.DEALER)
    s.rcvhwm = 1
    s.setsockopt(zmq.RCVBUF, 4096)
    s.connect("tcp://127.0.0.1:%d" % port)
    socks.append(s)
msg = b"x" * (1 << 16)
started = time.monotonic()
said = False
while True:
    for s in socks:
        try:
            s.send(msg, zmq.NOBLOCK)
        except zmq.Again:
            pass
    if not said and time.monotonic() - started > 2:
        print("flooding", flush=True)
        said = True
    time.sleep(0.01)
"""


def test_a_local_kernel_runs_cells_while_its_heartbeat_port_is_flooded_and_the_flood_is_held_to_the_budget(
    tmp_path, monkeypatch
):
    from jupyter_tai_sandbox import sandboxes
    from jupyter_tai_sandbox.policy import SandboxPolicy
    from jupyter_tai_sandbox.providers.local import LocalSandbox
    from tests.support.kernels import install_spec, started_kernel

    name = install_spec(tmp_path, monkeypatch)
    sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=SandboxPolicy(isolation="none")
    )

    async def run_cell(kc, code: str) -> str:
        msg_id = kc.execute(code)
        out = ""
        while True:
            msg = await kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return out

    async def main() -> None:
        async with started_kernel(name) as (km, kc):
            tunnel = km.provisioner.tunnel
            assert isinstance(tunnel, Tunnel)
            relay = await relay_pid(km.provisioner.session)
            relay_before = rss(relay)
            flood = subprocess.Popen(
                [sys.executable, "-c", ZMQ_FLOOD, str(km.hb_port), "100"],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert flood.stdout is not None
                line = await asyncio.wait_for(asyncio.to_thread(flood.stdout.readline), 60)
                assert line.strip() == "flooding"
                await settled(tunnel, relay)
                assert tunnel.connections >= 100  # the flood's and the client's own
                assert tunnel.peak_buffered <= DEFAULT_BUDGET + MAX_FRAME + (4 << 20), tunnel.peak_buffered
                assert rss(relay) - relay_before < 64 << 20
                assert (await run_cell(kc, "print(6 * 7)")).strip() == "42"
            finally:
                flood.kill()
                flood.wait()
                assert flood.stdout is not None
                flood.stdout.close()
            assert (await run_cell(kc, "print('after')")).strip() == "after"

    run(main())


@pytest.mark.usefixtures("python_engine")
@pytest.mark.parametrize("agent_transport", ["auto", "exec"])
def test_a_docker_sessions_own_ports_keep_slots_for_the_server_and_close_another_processs_idle_connections(
    agent_transport,
):
    """The same bounds where the session opens its own ports (SessionPorts, no relay): the agent's connection
    window bounds what one connection holds; the cap, the reserved slots and the idle timeout are the host's
    (sockets joined by splice, or bytes carried through the engine's exec)."""
    from jupyter_tai_sandbox.kernels.ports import SessionPorts

    async def main() -> None:
        async with python_docker_session(agent_transport) as session:
            server, inner = await start_server(session, "python3")
            ports = SessionPorts(session, max_connections=6, reserved=2, idle_timeout=IDLE_TIMEOUT)
            try:
                port = (await ports.forward(inner)).port
                others = Client(port, 6, "idle")
                try:
                    assert await others.line() == "open 4"  # 6 less the 2 kept for the server's own process
                    own = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
                    for i, (reader, writer) in enumerate(own):
                        writer.write(b"echo\nown %d" % i)
                        assert await asyncio.wait_for(reader.readexactly(5), 30) == b"own %d" % i
                    # the other process's four moved nothing since: closed
                    await asyncio.sleep(2 * IDLE_TIMEOUT)
                    assert (await others.report())[:4] == ["closed"] * 4
                    reader, writer = own[0]  # the server's own, as idle, are not
                    writer.write(b"again")
                    assert await asyncio.wait_for(reader.readexactly(5), 30) == b"again"
                    for _, writer in own:
                        writer.close()
                finally:
                    others.end()
            finally:
                await ports.close()
                await server.kill()

    run(main())
