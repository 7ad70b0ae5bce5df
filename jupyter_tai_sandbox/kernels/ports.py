"""Port forwarding through the session itself: host listeners whose connections the session opens.

Where a session opens its own ports (:attr:`~jupyter_tai_sandbox.contract.SandboxSession.opens_ports`:
a container session's agent dials them inside the container, network ``none`` included), a kernel's
ports need no relay in the session: each connection accepted on a host listener becomes one
:meth:`~jupyter_tai_sandbox.contract.SandboxSession.open_port` connection, bytes pumped both ways with
the connection's own flow control (a peer that does not read stalls only its connection), half-closes
passed on. Nothing in the session speaks for the forwarder, so session code has no frames to forge.

**Bounds.** A connection holds at most, on the host, the session connection's window of the session's
bytes (the agent's, 1 MiB) and one read of the host socket's (:data:`READ_CHUNK`: it is read only
as the session takes it), or, joined socket to socket, two pipes in the kernel (:mod:`.splice`);
at most :data:`MAX_CONNECTIONS` are carried at once, :data:`RESERVED` of them kept for the server's own
process (:func:`~.peers.dialled_from_here`), and one of another process that moves no byte either way
for :data:`~.tunnel.IDLE_TIMEOUT` seconds is closed. Only the server's user may connect
(:func:`~.peers.admitted`).

:class:`SessionPorts` has the face of the relay's :class:`~jupyter_tai_sandbox.kernels.tunnel.Tunnel`
(``forward``, ``closed``, ``exit_reason``, ``close``), so the provisioner takes whichever the session allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from ..contract import PortConnection, SandboxError, SandboxNotFoundError, SandboxSession
from . import splice
from .peers import admitted, dialled_from_here
from .tunnel import IDLE_TIMEOUT, Forward, TunnelError, _Listener, listen

#: the most bytes read from a host socket at once
READ_CHUNK = 256 << 10
#: the most connections one forwarding carries at once (as the agent holds at most 64 of a session's); a kernel's
#: server keeps four or five per client
MAX_CONNECTIONS = 64
#: of those, the slots only the server's own process may take (its kernel clients)
RESERVED = 16
#: the pause between two tries of a refused connect (a kernel still binding its ports)
RETRY_SECONDS = 0.05

log = logging.getLogger(__name__)


class _Carried:
    """What the forwarding knows of one connection it carries."""

    def __init__(self, own: bool) -> None:
        #: dialled by the server's own process (never closed for idleness)
        self.own = own
        #: the loop's time a byte last moved, either way
        self.last_moved = asyncio.get_running_loop().time()

    def moved(self) -> None:
        self.last_moved = asyncio.get_running_loop().time()


class SessionPorts:
    """Host listeners forwarding to ports inside one session, each connection opened by the session.

    ``max_connections``, ``reserved``, ``idle_timeout``: as :data:`MAX_CONNECTIONS`, :data:`RESERVED` and
    :data:`~.tunnel.IDLE_TIMEOUT` say (None: no idle timeout)."""

    def __init__(
        self,
        session: SandboxSession,
        *,
        max_connections: int = MAX_CONNECTIONS,
        reserved: int = RESERVED,
        idle_timeout: float | None = IDLE_TIMEOUT,
    ) -> None:
        self.session = session
        self.closed = asyncio.Event()
        self.exit_reason: str | None = None
        self.max_connections = max_connections
        self.reserved = min(reserved, max_connections)
        self.idle_timeout = idle_timeout
        self._forwards: list[Forward] = []
        self._pumps: dict[asyncio.Future[None], _Carried] = {}
        self._idle: asyncio.Task[None] | None = None

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

        listener = listen(host, port)
        listener.start(self._accept(listener, remote_port, connect_wait))
        if self.idle_timeout is not None and self._idle is None:
            self._idle = asyncio.ensure_future(self._idle_loop(self.idle_timeout))
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
            own = dialled_from_here(client)
            others = sum(1 for carried in self._pumps.values() if not carried.own)
            if len(self._pumps) >= self.max_connections or (
                not own and others >= self.max_connections - self.reserved
            ):  # the user's own flood is refused too, past the slots kept for the server's own clients
                log.debug(
                    "forwarding to port %d: %d connections open (%d of other processes), one more refused",
                    remote_port,
                    len(self._pumps),
                    others,
                )
                client.close()
                continue
            carried = _Carried(own)
            pump = asyncio.ensure_future(self._carry(remote_port, connect_wait, client, carried))
            self._pumps[pump] = carried
            pump.add_done_callback(self._forget)

    def _forget(self, pump: asyncio.Future[None]) -> None:
        self._pumps.pop(pump, None)

    @property
    def connections(self) -> int:
        return len(self._pumps)

    async def _idle_loop(self, timeout: float) -> None:
        """Close each connection of another process that moved no byte either way for ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        while not self.closed.is_set():
            await asyncio.sleep(min(max(timeout / 4, 0.05), 30.0))
            now = loop.time()
            for pump, carried in list(self._pumps.items()):
                if not carried.own and now - carried.last_moved >= timeout:
                    log.debug("forwarded connection idle for %g s: closed", timeout)
                    pump.cancel()

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

    async def _carry(
        self, remote_port: int, connect_wait: float, client: socket.socket, carried: _Carried
    ) -> None:
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
                await splice.join(client, inner, moved=carried.moved)
                return
            await _pump(client, connection, carried.moved)
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
        if self._idle is not None:
            self._idle.cancel()

    async def close(self) -> None:
        """Close the listeners and every connection. Idempotent."""
        self._end("the forwarding was closed")
        if self._pumps:
            await asyncio.wait(list(self._pumps), timeout=5.0)
        for forward in self._forwards:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(forward.server.wait_closed(), 1.0)


async def _pump(client: socket.socket, connection: PortConnection, moved: Callable[[], None]) -> None:
    """Carry bytes between a host socket and a connection the session gives as a byte stream: the host socket is
    read only as the session takes its bytes, and written straight from the session's (nothing copied)."""
    client.setblocking(False)
    with contextlib.suppress(OSError):
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    upstream = asyncio.ensure_future(_host_to_session(client, connection, moved))
    downstream = asyncio.ensure_future(_session_to_host(connection, client, moved))
    try:
        done, _ = await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_EXCEPTION)
        if not any(not t.cancelled() and t.exception() is not None for t in done):
            await asyncio.gather(upstream, downstream, return_exceptions=True)
        # else a broken side: the other goes too (the socket is closed at once)
    finally:
        for task in (upstream, downstream):
            task.cancel()
        # the loop stops watching the socket before it is closed (a new socket may get its number)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(upstream, downstream, return_exceptions=True)
        client.close()


async def _host_to_session(
    client: socket.socket, connection: PortConnection, moved: Callable[[], None]
) -> None:
    loop = asyncio.get_running_loop()
    while data := await loop.sock_recv(client, READ_CHUNK):
        moved()
        await connection.write(data)
        del data  # not held here while the next bytes are awaited
    await connection.close_write()


async def _session_to_host(
    connection: PortConnection, client: socket.socket, moved: Callable[[], None]
) -> None:
    loop = asyncio.get_running_loop()
    while (data := await connection.read()) is not None:
        await loop.sock_sendall(client, data)
        moved()
        del data
    client.shutdown(socket.SHUT_WR)
