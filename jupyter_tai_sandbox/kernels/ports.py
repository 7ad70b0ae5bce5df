"""Port forwarding through the session itself: host listeners whose connections the session opens.

Where a session opens its own ports (:attr:`~jupyter_tai_sandbox.contract.SandboxSession.opens_ports`:
a container session's agent dials them inside the container, network ``none`` included), a kernel's
ports need no relay in the session: each connection accepted on a host listener becomes one
:meth:`~jupyter_tai_sandbox.contract.SandboxSession.open_port` connection, bytes pumped both ways with
the connection's own flow control (a peer that does not read stalls only its connection), half-closes
passed on. Nothing in the session speaks for the forwarder, so session code has no frames to forge.

:class:`SessionPorts` has the face of the relay's :class:`~jupyter_tai_sandbox.kernels.tunnel.Tunnel`
(``forward``, ``closed``, ``exit_reason``, ``close``), so the provisioner takes whichever the session allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Coroutine
from typing import Any

from ..contract import PortConnection, SandboxError, SandboxNotFoundError, SandboxSession
from . import splice
from .peers import admitted
from .tunnel import Forward, TunnelError

#: the most bytes read from a host socket at once
READ_CHUNK = 256 << 10
#: the most connections one forwarding carries at once (as the agent holds at most 64 of a session's); a kernel
#: keeps five open
MAX_CONNECTIONS = 64
#: the pause between two tries of a refused connect (a kernel still binding its ports)
RETRY_SECONDS = 0.05

log = logging.getLogger(__name__)


class SessionPorts:
    """Host listeners forwarding to ports inside one session, each connection opened by the session."""

    def __init__(self, session: SandboxSession) -> None:
        self.session = session
        self.closed = asyncio.Event()
        self.exit_reason: str | None = None
        self._forwards: list[Forward] = []
        self._pumps: set[asyncio.Task[None]] = set()

    async def forward(
        self, remote_port: int, *, host: str = "127.0.0.1", port: int = 0, connect_wait: float = 0.0
    ) -> Forward:
        """Listen on ``host:port`` (0: an ephemeral port) and forward each connection to ``remote_port``.

        ``connect_wait``: seconds a refused connect is tried again (a kernel still starting: its client's
        first bytes wait in the host socket meanwhile); 0 closes the client's connection at once.
        """
        if self.closed.is_set():
            raise TunnelError(f"the forwarding is closed: {self.exit_reason}")
        if not 0 < remote_port < 65536:
            raise ValueError(f"remote_port must be a TCP port number, not {remote_port!r}")

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = _Listener(socket.create_server((host, port), family=family))
        listener.start(self._accept(listener, remote_port, connect_wait))
        forward = Forward(remote_port, host, listener.sock.getsockname()[1], listener, connect_wait)
        self._forwards.append(forward)
        return forward

    async def _accept(self, listener: _Listener, remote_port: int, connect_wait: float) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed.is_set():
            try:
                client, _ = await loop.sock_accept(listener.sock)
            except OSError as e:  # out of descriptors, or the listener closed: this port forwards no more
                if not self.closed.is_set() and not listener.closing:
                    log.warning("forwarding to port %d stopped accepting: %s", remote_port, e)
                return
            if self.closed.is_set():
                client.close()
                return
            if not admitted(client):  # another local account: never the kernel's client
                client.close()
                continue
            if len(self._pumps) >= MAX_CONNECTIONS:  # the user's own flood is refused too
                log.debug(
                    "forwarding to port %d: %d connections open, one more refused",
                    remote_port,
                    len(self._pumps),
                )
                client.close()
                continue
            pump = asyncio.ensure_future(self._carry(remote_port, connect_wait, client))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    @property
    def connections(self) -> int:
        return len(self._pumps)

    async def _open(self, remote_port: int, connect_wait: float) -> PortConnection | None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + connect_wait
        while True:
            try:
                return await self.session.open_port(remote_port)
            except ConnectionRefusedError:
                if loop.time() >= give_up:
                    return None
                await asyncio.sleep(RETRY_SECONDS)
            except SandboxNotFoundError as e:
                self._end(f"the session is gone: {e}")
                return None
            except SandboxError as e:
                log.debug("forwarding to port %d: %s", remote_port, e)
                return None

    async def _carry(self, remote_port: int, connect_wait: float, client: socket.socket) -> None:
        try:
            connection = await self._open(remote_port, connect_wait)
        except BaseException:
            # closed while still dialling (a kernel restart's teardown): a connection left open here would
            # hold its client, which waits for the peer's greeting (ZeroMQ: 30 s) before it dials again
            client.close()
            raise
        if connection is None:
            client.close()
            return
        try:
            inner = connection.take_socket() if splice.available else None
            if inner is not None:
                await splice.join(client, inner)
                return
            await _pump(client, connection)
        finally:
            await connection.close()

    def _end(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.exit_reason = reason
        self.closed.set()
        for forward in self._forwards:
            forward.close()
        for pump in list(self._pumps):
            pump.cancel()

    async def close(self) -> None:
        """Close the listeners and every connection. Idempotent."""
        self._end("the forwarding was closed")
        if self._pumps:
            await asyncio.wait(list(self._pumps), timeout=5.0)
        for forward in self._forwards:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(forward.server.wait_closed(), 1.0)


class _Listener:
    """A host listener's socket and the task accepting on it (what :class:`Forward` closes)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.task: asyncio.Future[None] | None = None
        self.closing = False

    def start(self, accepting: Coroutine[Any, Any, None]) -> None:
        self.task = asyncio.ensure_future(accepting)
        # closed once the task is done: the loop has stopped watching the descriptor by then, so a new
        # socket given the same number is never unwatched by this one's late clean-up
        self.task.add_done_callback(lambda _: self.sock.close())

    def close(self) -> None:
        self.closing = True
        if self.task is not None:
            self.task.cancel()

    async def wait_closed(self) -> None:
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


async def _pump(client: socket.socket, connection: PortConnection) -> None:
    """Carry bytes between a host socket and a connection the session gives as a byte stream."""
    reader, writer = await asyncio.open_connection(sock=client, limit=READ_CHUNK)
    upstream = asyncio.ensure_future(_host_to_session(reader, connection))
    downstream = asyncio.ensure_future(_session_to_host(connection, writer))
    try:
        done, _ = await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_EXCEPTION)
        if any(not t.cancelled() and t.exception() is not None for t in done):
            writer.transport.abort()  # a broken side: the other goes too (a reset, as the kernel would see)
        else:
            await asyncio.gather(upstream, downstream, return_exceptions=True)
    finally:
        for task in (upstream, downstream):
            task.cancel()
        with contextlib.suppress(Exception):
            writer.close()


async def _host_to_session(reader: asyncio.StreamReader, connection: PortConnection) -> None:
    while data := await reader.read(READ_CHUNK):
        await connection.write(data)
    await connection.close_write()


async def _session_to_host(connection: PortConnection, writer: asyncio.StreamWriter) -> None:
    while (data := await connection.read()) is not None:
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
