"""The kernel tunnel does not trust the session (issue 24, point 3).

The relay is session code: anything in the session can write into its stdout
(``/proc/<pid>/fd/1``), or be the relay outright. Every protocol violation closes
the tunnel (with a warning saying why), the relay is killed, and the host never
buffers more than a frame of the stream plus its budget (a window, in these tests of one connection).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from jupyter_tai_sandbox.kernels.tunnel import MAX_FRAME, Tunnel
from tests.support.aio import run
from tests.support.kernels import local_session

pytestmark = pytest.mark.timeout(120)

#: what the host may hold of the relay's stream besides the windows: one frame and one output chunk
SLACK = MAX_FRAME + (4 << 20)

#: Session code that finds the tunnel relay of its own session (same workspace, the relay's source in
#: its command line) and writes a 4 GiB DATA frame header into its stdout, then 64 MiB of junk.
HOSTILE_WRITER = r"""
import os, struct, sys
here = os.path.realpath(os.getcwd())
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        cmdline = open("/proc/%s/cmdline" % pid, "rb").read()
        cwd = os.path.realpath(os.readlink("/proc/%s/cwd" % pid))
    except OSError:
        continue
    if b"int(sys.argv[2])" in cmdline and cwd == here:
        break
else:
    sys.exit("no relay found")
print("relay", pid, flush=True)
out = open("/proc/%s/fd/1" % pid, "wb", buffering=0)
out.write(struct.pack(">IBI", 1, 3, 0xFFFFFFFF))
junk = b"\xee" * (1 << 20)
try:
    for _ in range(64):
        out.write(junk)
except OSError:
    pass
"""

#: A hostile relay: says HELLO, then breaks the protocol as argv[1] says, then waits to be killed.
FAKE_RELAY = r"""
import os, struct, sys, time
H = struct.Struct(">IBI")
def send(cid, kind, data=b""):
    buf = memoryview(H.pack(cid, kind, len(data)) + data)
    while buf:
        buf = buf[os.write(1, buf):]
def read_frame():
    head = b""
    while len(head) < 9:
        head += os.read(0, 9 - len(head))
    cid, kind, n = H.unpack(head)
    body = b""
    while len(body) < n:
        body += os.read(0, n - len(body))
    return cid, kind, body
mode = sys.argv[1]
os.write(2, b"pid %d\n" % os.getpid())
send(0, 1, struct.pack(">I", 1))
if mode == "unknown-kind":
    os.write(1, H.pack(0, 99, 0))
elif mode == "unknown-connection":
    send(7, 3, b"x" * 100)
else:
    cid, kind, _ = read_frame()  # the host's OPEN
    if mode == "oversize-data":
        os.write(1, H.pack(cid, 3, int(sys.argv[2]) + 1))
    elif mode == "past-window":
        chunk = b"\xee" * int(sys.argv[2])
        try:
            while True:
                send(cid, 3, chunk)
        except OSError:
            pass
    elif mode == "credit-overflow":
        send(cid, 4, struct.pack(">I", 1 << 30))
time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


async def closes_promptly(tunnel: Tunnel, within: float = 10.0) -> str:
    await asyncio.wait_for(tunnel.closed.wait(), within)
    return tunnel.exit_reason or ""


def test_a_4_gib_frame_header_written_into_the_relays_stdout_closes_the_tunnel_unbuffered(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="jupyter_tai_sandbox.kernels.tunnel")

    async def main() -> None:
        async with local_session(tmp_path) as session:
            tunnel = await Tunnel.start(session, python=sys.executable, timeout_seconds=120)
            try:
                attack = await session.exec([sys.executable, "-c", HOSTILE_WRITER], timeout_seconds=60)
                assert attack.stdout.startswith(b"relay "), attack
                reason = await closes_promptly(tunnel)
                assert "protocol violation" in reason and "4294967295 bytes" in reason, reason
                assert tunnel.peak_buffered <= SLACK, tunnel.peak_buffered
                assert any("protocol violation" in r.getMessage() for r in caplog.records)
            finally:
                await tunnel.close()

    run(main())


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("unknown-kind", "unknown frame kind 99"),
        ("unknown-connection", "connection 7, which was never opened"),
        ("oversize-data", f"with {MAX_FRAME + 1} bytes"),
        ("past-window", "DATA past the window"),
        ("credit-overflow", "CREDIT for more than was sent"),
    ],
)
def test_a_hostile_relay_breaking_the_protocol_closes_the_tunnel_within_the_window(
    tmp_path, caplog, mode, why
):
    caplog.set_level(logging.WARNING, logger="jupyter_tai_sandbox.kernels.tunnel")
    window = 64 << 10

    async def main() -> None:
        async with local_session(tmp_path) as session:
            handle = await session.exec_start(
                [
                    sys.executable,
                    "-u",
                    "-c",
                    FAKE_RELAY,
                    mode,
                    str(MAX_FRAME if mode != "past-window" else 32 << 10),
                ],
                timeout_seconds=120,
            )
            tunnel = Tunnel(handle, window=window)
            client = None
            try:
                await asyncio.wait_for(asyncio.shield(tunnel._hello), 10)
                if mode not in ("unknown-kind", "unknown-connection"):
                    forward = await tunnel.forward(9)
                    client = await asyncio.open_connection("127.0.0.1", forward.port)  # never reads
                reason = await closes_promptly(tunnel)
                assert "protocol violation" in reason and why in reason, reason
                assert tunnel.peak_buffered <= window + SLACK, tunnel.peak_buffered
                assert tunnel.buffered == 0
                assert any(why in r.getMessage() for r in caplog.records)
                # the hostile relay was killed (a zombie counts: PID 1 here does not reap)
                pid = int(tunnel._stderr_tail.split()[1])
                for _ in range(200):
                    if gone(pid):
                        break
                    await asyncio.sleep(0.05)
                assert gone(pid)
            finally:
                if client is not None:
                    client[1].close()
                await tunnel.close()

    run(main())
