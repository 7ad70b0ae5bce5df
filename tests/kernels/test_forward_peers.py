"""A kernel's forwarded ports admit the server's own user only (issue 50, finding 2): any local account can dial
127.0.0.1, and held connections of another account once locked the owner out of her kernel. The peer of a
loopback TCP connection is told by its socket's owner in /proc/net/tcp (TCP has no SO_PEERCRED)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from jupyter_tai_sandbox.kernels.peers import admitted, peer_uid
from jupyter_tai_sandbox.kernels.tunnel import Tunnel
from tests.support.aio import run
from tests.support.kernels import local_session

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="dialling as another account needs root (CI runs as root)"),
]

NOBODY = 65534
#: an interpreter another account may run (the test's own may live under /root)
SYSTEM_PYTHON = "/usr/bin/python3"
#: a client of another account: connects, says so, holds the connection until its peer closes it
HOLD = """
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
c.settimeout(15)
try:
    print("closed" if c.recv(1) == b"" else "answered", flush=True)
except (socket.timeout, ConnectionResetError) as e:
    print("reset" if isinstance(e, ConnectionResetError) else "held", flush=True)
"""


def as_nobody(port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [SYSTEM_PYTHON, "-c", HOLD, str(port)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_peer_of_a_loopback_connection_is_its_sockets_owner(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.create_server((host, 0), family=family) as listener:
        mine = socket.create_connection(listener.getsockname()[:2])
        accepted, _ = listener.accept()
        assert peer_uid(accepted) == os.getuid() and admitted(accepted)
        mine.close()
        accepted.close()
        if family == socket.AF_INET:
            other = as_nobody(listener.getsockname()[1])
            accepted, _ = listener.accept()
            assert peer_uid(accepted) == NOBODY and not admitted(accepted)
            accepted.close()
            assert other.communicate(timeout=30)[0].split() == ["connected", "closed"]


def test_a_kernel_tunnel_refuses_another_accounts_connections_at_once_and_serves_its_own(tmp_path):
    async def main() -> None:
        async with local_session(tmp_path) as session:
            echo = await session.exec_start(
                [
                    sys.executable,
                    "-c",
                    "import socket\ns=socket.create_server(('127.0.0.1',0));print(s.getsockname()[1],flush=True)\n"
                    "while True:\n c,_=s.accept();c.sendall(c.recv(100));c.close()",
                ],
                timeout_seconds=120,
            )
            port = int((await anext(aiter(echo.output))).data)
            tunnel = await Tunnel.start(session, python=sys.executable, timeout_seconds=120)
            try:
                forward = await tunnel.forward(port)
                started = time.monotonic()
                others = [await asyncio.to_thread(as_nobody, forward.port) for _ in range(8)]
                said = [(await asyncio.to_thread(p.communicate, timeout=30))[0].split() for p in others]
                assert said == [["connected", "closed"]] * 8 and time.monotonic() - started < 15, said
                assert tunnel.connections == 0
                reader, writer = await asyncio.open_connection("127.0.0.1", forward.port)
                writer.write(b"mine")
                assert await asyncio.wait_for(reader.read(), 30) == b"mine"
                writer.close()
            finally:
                await tunnel.close()
                await echo.kill()

    run(main())
