"""Port forwarding over the exec seam: TCP connections to ports inside a session.

A consumer of the contract, not a provider feature. A small relay program
(:mod:`~jupyter_tai_sandbox.kernels.relay`) is started in the session with ``exec_start``
(``python3 -c RELAY_SOURCE``, its source: the session needs python3 and nothing else,
no network either); it multiplexes TCP
connections to ``127.0.0.1:<port>`` *inside* the session over its stdin and
stdout. On the host, :meth:`Tunnel.forward` listens on ``127.0.0.1`` (an
ephemeral port by default) and hands each accepted connection to the relay.
So it works on every provider, ``network: none`` sessions included.

The wire: frames of ``>IBI`` (connection id, kind, payload length) + payload.

======  =========  ===========================================================
kind    direction  meaning
======  =========  ===========================================================
HELLO   relay->    the relay runs (payload: protocol version)
OPEN    ->relay    connect connection ``id`` to the payload's port (u16), retrying for u32 ms; u8 1: the server's own
DATA    both       bytes of connection ``id``
CREDIT  both       the receiver wrote out u32 more bytes (sent once a quarter window is owed)
EOF     both       the sender's side is done (half-close: ``shutdown(SHUT_WR)``)
RESET   both       the connection is gone (payload: why); forget it
======  =========  ===========================================================

**Back-pressure per connection, bounded per tunnel.** A sender sends a connection's
DATA only within the credit its receiver granted; the receiver queues DATA per
connection (it never blocks reading the shared stream) and grants more CREDIT as it
writes the bytes out to that connection's socket. Each connection starts with
:data:`FLOOR` bytes of credit each way. A receiver's commitment to a connection is the
credit it granted and not yet received plus the bytes it queued; past the floor it
grants only from the tunnel's budget (:data:`DEFAULT_BUDGET`, each side and direction;
its last quarter only to the server's own connections), up to :data:`DEFAULT_WINDOW`
for one connection. So a connection whose far end does not
read stops at what it was granted, the others go on, and no side ever holds more than
its budget of queued DATA over all connections (with at most :data:`MAX_CONNECTIONS`
connections, whose floors fit in it): past it, a connection moves at its floor.

**Who may connect.** Only the server's user (:func:`~jupyter_tai_sandbox.kernels.peers.admitted`);
of the :data:`MAX_CONNECTIONS`, :data:`RESERVED` are kept for the server's own process
(:func:`~jupyter_tai_sandbox.kernels.peers.dialled_from_here`), and a connection of
another process that moves no byte either way for :data:`IDLE_TIMEOUT` seconds is reset
(a peer that never reads stops moving once its credit is used up). Past the cap a new
connection is closed at once.

**Close.** A connection ends normally when both sides sent EOF (each side closes
its socket once it sent and received EOF); an error on either end sends RESET.

**Relay death** (its exit, a kill, the session's destroy or reap, its deadline)
ends every connection at once and closes the listeners: :attr:`Tunnel.closed`.

**The relay is session code.** Anything in the session can write into the relay's
stdout (``/proc/<pid>/fd/1``), so the host side trusts none of it: a frame header
is checked before its payload is awaited, and any protocol violation (a payload over
its kind's maximum, an unknown kind, a connection id the host never opened, DATA
beyond the connection's window or after its EOF, CREDIT beyond what was sent, frames
before HELLO or a second HELLO) kills the relay and closes the tunnel, with a warning
saying why. So the host never holds more than one frame of the stream plus, over
all connections, its budget of received DATA (:attr:`Tunnel.peak_buffered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import socket
import struct
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..contract import (
    ExecHandle,
    ExecRequest,
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxRequestError,
    SandboxSession,
)
from ..gate import start_transport
from . import relay
from .peers import admitted, dialled_from_here
from .relay import CREDIT, DATA, EOF, HEADER, HELLO, OPEN, RESET

#: the most credit one connection holds (per direction, per side): a bulk transfer's bytes in flight, when the
#: budget allows
DEFAULT_WINDOW = 4 << 20
#: the credit every connection has whatever the budget (its first grant): so a connection always progresses
FLOOR = 64 << 10
#: the most bytes of DATA one side may hold or have allowed in, over all a tunnel's connections, per direction
#: (the host for the session's bytes, the relay for the host's): credit past each connection's floor is granted
#: from it; connections of other processes than the server's get credit past their floors only from the first
#: three quarters (the last quarter is the server's own clients')
DEFAULT_BUDGET = 16 << 20
#: the most connections one tunnel carries at once (so their floors fit in the budget); a kernel's server keeps
#: four or five per client
MAX_CONNECTIONS = 256
#: of those, the slots only the server's own process may take (its kernel clients): other processes of the
#: server's user (``jupyter console --existing``, a flood) get the rest
RESERVED = 64
#: seconds a connection of another process may move no byte either way before it is closed (a stalled peer
#: holds its buffered bytes, an idle one a slot). The server's own are never closed for it: a ZeroMQ socket
#: sends nothing while its kernel is idle (no ZMTP heartbeat unless asked; jupyter_server opens no heartbeat
#: channel), and a client would only reconnect
IDLE_TIMEOUT = 600.0
#: the largest DATA payload one frame carries
MAX_FRAME = 256 << 10
#: how long :meth:`Tunnel.start` waits for the relay's HELLO
START_TIMEOUT = 30.0

log = logging.getLogger(__name__)


class TunnelError(SandboxError):
    """The relay could not start, or died."""


class ProtocolViolation(Exception):
    """The relay broke the wire protocol (it is session code: never trusted)."""


#: the largest payload of each kind the relay may send (OPEN never comes from the relay)
_MAX_PAYLOAD = {HELLO: 4, DATA: MAX_FRAME, CREDIT: 4, EOF: 0, RESET: 1000}


#: The relay's program, shipped into the session as ``python3 -u -c RELAY_SOURCE WINDOW MAX_FRAME FLOOR BUDGET``.
RELAY_SOURCE = inspect.getsource(relay)


class Listening(Protocol):
    """A host listener as a :class:`Forward` holds it (an ``asyncio.Server``, or a socket and its accept task)."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


@dataclass
class Forward:
    """One host listener: ``127.0.0.1:port`` on the host reaches ``127.0.0.1:remote_port`` in the session."""

    remote_port: int
    host: str
    port: int
    server: Listening
    connect_wait: float = 0.0

    def close(self) -> None:
        self.server.close()


class _Connection:
    """The host side of one forwarded connection: its socket read only within the relay's credit (nothing of it
    buffered here past that) and written straight from the queue (no copy of it either)."""

    def __init__(self, tunnel: Tunnel, cid: int, sock: socket.socket, own: bool):
        self.tunnel = tunnel
        self.cid = cid
        self.sock = sock
        #: dialled by the server's own process (never closed for idleness)
        self.own = own
        #: bytes the relay lets us send
        self.credit = tunnel.floor
        self.credit_event = asyncio.Event()
        self.credit_event.set()
        self.inbox: deque[bytes | None] = deque()
        self.inbox_event = asyncio.Event()
        #: bytes the relay may still send us (the credit we granted, less what came)
        self.allowed = tunnel.floor
        #: bytes of the relay's DATA received and not yet written out to the socket
        self.queued = 0
        self.released = False
        tunnel._committed += tunnel.floor
        loop = asyncio.get_running_loop()
        #: the loop's time a byte last moved through the host socket, either way
        self.last_moved = loop.time()
        self.got_eof_frame = False
        self.sent_eof = False
        self.got_eof = False
        self.dead = False
        self.tasks = [
            asyncio.create_task(self._upstream(), name=f"tunnel-up-{cid}"),
            asyncio.create_task(self._downstream(), name=f"tunnel-down-{cid}"),
        ]
        # the socket is closed once neither task waits on it: the loop stops watching its descriptor first, so a
        # new socket given the same number is never unwatched by this one's late clean-up
        self._running = len(self.tasks)
        for task in self.tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, _: object) -> None:
        self._running -= 1
        if self._running == 0:
            self.sock.close()

    async def _upstream(self) -> None:
        """Host socket -> relay, within the credit the relay gave."""
        loop = asyncio.get_running_loop()
        try:
            while not self.dead:
                while self.credit <= 0 and not self.dead:
                    self.credit_event.clear()
                    await self.credit_event.wait()
                if self.dead:
                    return
                data = await loop.sock_recv(self.sock, min(self.credit, MAX_FRAME))
                if self.dead:
                    return
                if not data:
                    self.sent_eof = True
                    self.tunnel._send(self.cid, EOF)
                    self._maybe_finished()
                    return
                self.last_moved = loop.time()
                self.credit -= len(data)
                self.tunnel._send(self.cid, DATA, data)
                del data  # not held here while the credit is awaited
        except (OSError, ConnectionError) as e:
            self.reset(f"host read failed: {e}")

    async def _downstream(self) -> None:
        """Relay -> host socket; CREDIT goes back as the bytes are written out, within the budget."""
        loop = asyncio.get_running_loop()
        try:
            while not self.dead:
                if not self.inbox:
                    self.inbox_event.clear()
                    await self.inbox_event.wait()
                    continue
                item = self.inbox.popleft()
                if item is None:
                    self.sock.shutdown(socket.SHUT_WR)
                    self.got_eof = True
                    self._maybe_finished()
                    return
                await loop.sock_sendall(self.sock, item)  # counted as queued until the socket took it all
                if self.dead:
                    return
                self.last_moved = loop.time()
                self._wrote(len(item))
                del item
        except (OSError, ConnectionError) as e:
            self.reset(f"host write failed: {e}")

    def _wrote(self, n: int) -> None:
        """``n`` queued bytes went out: grant the relay more, from the floor and the budget."""
        tunnel = self.tunnel
        floor = tunnel.floor
        held = self.allowed + self.queued
        self.queued -= n
        tunnel._inbox_bytes -= n
        tunnel._committed += max(held - n, floor) - max(held, floor)
        held -= n
        limit = tunnel.budget if self.own else tunnel.budget - tunnel.budget // 4
        room = max(limit - tunnel._committed, 0)
        grant = min(tunnel.window - held, max(floor, held) + room - held)
        if grant <= 0 or (grant < tunnel.window // 4 and held > floor // 2):
            return  # enough in flight: grant in bigger steps
        self.allowed += grant
        tunnel._committed += max(held + grant, floor) - max(held, floor)
        tunnel._send(self.cid, CREDIT, struct.pack(">I", grant))

    def _release(self) -> None:
        """This connection's commitment goes back to the budget (once)."""
        if not self.released:
            self.released = True
            self.tunnel._committed -= max(self.allowed + self.queued, self.tunnel.floor)
            self.tunnel._inbox_bytes -= self.queued
            self.queued = 0

    def _maybe_finished(self) -> None:
        if self.sent_eof and self.got_eof and not self.dead:
            self.dead = True
            self._release()
            self.tunnel._forget(self.cid)

    def check(self, kind: int, n: int) -> None:
        """Refuse a frame this connection cannot take, from its header alone (ProtocolViolation)."""
        if kind in (DATA, EOF) and self.got_eof_frame:
            raise ProtocolViolation(
                f"{'DATA' if kind == DATA else 'a second EOF'} after EOF on connection {self.cid}"
            )
        if kind == DATA and n > self.allowed:
            raise ProtocolViolation(
                f"DATA past the window on connection {self.cid} "
                f"({n} bytes, {self.allowed} allowed, window {self.tunnel.window})"
            )

    def on_frame(self, kind: int, payload: bytes) -> None:
        if kind in (DATA, EOF):
            if kind == DATA:
                self.allowed -= len(payload)
                self.queued += len(payload)
                self.tunnel._inbox_bytes += len(payload)
            else:
                self.got_eof_frame = True
            self.inbox.append(payload if kind == DATA else None)
            self.inbox_event.set()
        elif kind == CREDIT:
            (n,) = struct.unpack(">I", payload)
            if self.credit + n > self.tunnel.window:
                raise ProtocolViolation(f"CREDIT for more than was sent on connection {self.cid}")
            self.credit += n
            self.credit_event.set()
        elif kind == RESET:
            self.reset(payload.decode("utf-8", "replace"), tell=False)

    def reset(self, why: str, *, tell: bool = True) -> None:
        if self.dead:
            return
        self.dead = True
        if why:
            log.debug("tunnel connection %d reset: %s", self.cid, why)
        self.tunnel._forget(self.cid)
        self._release()
        self.inbox.clear()
        if tell:
            self.tunnel._send(self.cid, RESET, why.encode()[:1000])
        self.credit_event.set()
        self.inbox_event.set()
        # nothing more goes either way (the socket itself is closed once its tasks are done)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


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


def listen(host: str, port: int) -> _Listener:
    """A listening socket on ``host:port`` (0: an ephemeral port), not yet accepting."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return _Listener(socket.create_server((host, port), family=family))


class Tunnel:
    """A relay in one session and the host listeners forwarding to it.

    Start with :meth:`start`; forward ports with :meth:`forward`; end with
    :meth:`close` (kills the relay). :attr:`closed` is set when the relay is gone
    for whatever reason, and :attr:`exit_reason` says why.
    """

    def __init__(
        self,
        handle: ExecHandle,
        *,
        window: int = DEFAULT_WINDOW,
        budget: int = DEFAULT_BUDGET,
        max_connections: int = MAX_CONNECTIONS,
        reserved: int = RESERVED,
        idle_timeout: float | None = IDLE_TIMEOUT,
    ) -> None:
        self.handle = handle
        #: the most credit one connection holds, per direction
        self.window = window
        #: every connection's credit whatever the budget
        self.floor = min(FLOOR, window)
        #: the most bytes of the relay's DATA the host holds or allowed in, over every connection
        self.budget = budget
        self.max_connections = max_connections
        self.reserved = min(reserved, max_connections)
        #: seconds a connection of another process may move nothing before it is reset (None: never)
        self.idle_timeout = idle_timeout
        #: the sum over connections of max(credit granted and unused + bytes queued, floor)
        self._committed = 0
        self.closed = asyncio.Event()
        self.exit_reason: str | None = None
        self._hello = asyncio.get_running_loop().create_future()
        self._ids = itertools.count(1)
        self._conns: dict[int, _Connection] = {}
        self._forwards: list[Forward] = []
        self._out: deque[bytes] = deque()
        self._out_event = asyncio.Event()
        self._stderr_tail = b""
        #: bytes of the relay's DATA queued on the host, over every connection
        self._inbox_bytes = 0
        #: the most the host ever held of the relay's stream (at most a frame and a chunk, plus its budget)
        self.peak_buffered = 0
        self._last_id = 0
        self._writer = asyncio.create_task(self._write_loop(), name="tunnel-writer")
        self._reader = asyncio.create_task(self._read_loop(), name="tunnel-reader")
        self._idle = (
            asyncio.create_task(self._idle_loop(idle_timeout), name="tunnel-idle")
            if idle_timeout is not None
            else None
        )

    @classmethod
    async def start(
        cls,
        session: SandboxSession,
        *,
        python: str = "python3",
        timeout_seconds: float,
        window: int = DEFAULT_WINDOW,
        budget: int = DEFAULT_BUDGET,
        max_connections: int = MAX_CONNECTIONS,
        reserved: int = RESERVED,
        idle_timeout: float | None = IDLE_TIMEOUT,
        start_timeout_seconds: float = START_TIMEOUT,
    ) -> Tunnel:
        """Start the relay in ``session`` (``python`` is the interpreter there) and wait for it to answer.

        ``window``, ``budget``, ``max_connections``, ``reserved``, ``idle_timeout``: as :data:`DEFAULT_WINDOW`,
        :data:`DEFAULT_BUDGET`, :data:`MAX_CONNECTIONS`, :data:`RESERVED` and :data:`IDLE_TIMEOUT` say (the
        relay holds the host's DATA to the same budget)."""
        if not 0 < window < 1 << 31:
            raise ValueError("window must be a positive number of bytes below 2 GiB")
        if not 0 < budget < 1 << 40 or max_connections < 1:
            raise ValueError("budget and max_connections must be positive")
        # a byte transport, not a transcript: through the gate its deadline is held to the operator's
        # ceiling (refused past it) but its output is not scrubbed (a replacement would break the frames)
        try:
            handle = await start_transport(
                session, ExecRequest(relay_argv(python, window, budget), timeout_seconds)
            )
        except SandboxRequestError as e:
            if e.field != "argv":
                raise
            # the interpreter is absent or not a program (a provider that says so before the start)
            raise TunnelError(f"the tunnel relay did not start: {e}") from None
        tunnel = cls(
            handle,
            window=window,
            budget=budget,
            max_connections=max_connections,
            reserved=reserved,
            idle_timeout=idle_timeout,
        )
        try:
            await asyncio.wait_for(asyncio.shield(tunnel._hello), start_timeout_seconds)
        except TimeoutError:
            await tunnel.close()
            raise TunnelError(f"the tunnel relay did not answer within {start_timeout_seconds:g} s") from None
        except BaseException:
            await tunnel.close()
            raise
        return tunnel

    # ------------------------------------------------------------ listeners

    async def forward(
        self, remote_port: int, *, host: str = "127.0.0.1", port: int = 0, connect_wait: float = 0.0
    ) -> Forward:
        """Listen on ``host:port`` (0: an ephemeral port) and forward each connection to ``remote_port``.

        ``connect_wait``: seconds the relay keeps retrying a refused connect (a server still starting, such
        as a kernel: its client's first bytes wait in the relay instead of being lost); 0 resets at once.
        """
        if self.closed.is_set():
            raise TunnelError(f"the tunnel is closed: {self.exit_reason}")
        if not 0 < remote_port < 65536:
            raise ValueError(f"remote_port must be a TCP port number, not {remote_port!r}")

        wait_ms = max(0, min(int(connect_wait * 1000), 0xFFFFFFFF))

        listener = listen(host, port)
        listener.start(self._accept_loop(listener, remote_port, wait_ms))
        forward = Forward(remote_port, host, listener.sock.getsockname()[1], listener, connect_wait)
        self._forwards.append(forward)
        return forward

    async def _accept_loop(self, listener: _Listener, remote_port: int, wait_ms: int) -> None:
        loop = asyncio.get_running_loop()
        while not self.closed.is_set():
            try:
                client, _ = await loop.sock_accept(listener.sock)
            except OSError as e:  # out of descriptors, or the listener closed: this port forwards no more
                if not self.closed.is_set() and not listener.closing:
                    log.warning("tunnel to port %d stopped accepting: %s", remote_port, e)
                return
            self._accept(remote_port, wait_ms, client)

    def _accept(self, remote_port: int, wait_ms: int, client: socket.socket) -> None:
        if self.closed.is_set() or not admitted(client):
            client.close()  # closed, or another local account: never the kernel's client
            return
        own = dialled_from_here(client)
        others = sum(1 for conn in self._conns.values() if not conn.own)
        if len(self._conns) >= self.max_connections or (
            not own and others >= self.max_connections - self.reserved
        ):
            log.debug(
                "tunnel to port %d: %d connections open (%d of other processes), one more refused",
                remote_port,
                len(self._conns),
                others,
            )
            client.close()
            return
        client.setblocking(False)
        with contextlib.suppress(OSError):
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cid = self._last_id = next(self._ids)
        self._send(cid, OPEN, struct.pack(">HIB", remote_port, wait_ms, own))
        self._conns[cid] = _Connection(self, cid, client, own)

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def _idle_loop(self, timeout: float) -> None:
        """Reset each connection of another process that moved no byte either way for ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(max(timeout / 4, 0.05), 30.0))
            now = loop.time()
            for conn in list(self._conns.values()):
                if not conn.own and not conn.dead and now - conn.last_moved >= timeout:
                    conn.reset(f"idle for {timeout:g} s")

    # --------------------------------------------------------------- stream

    def _send(self, cid: int, kind: int, payload: bytes = b"") -> None:
        if self.closed.is_set():
            return
        self._out.append(HEADER.pack(cid, kind, len(payload)))
        if payload:
            self._out.append(payload)
        self._out_event.set()

    def _forget(self, cid: int) -> None:
        self._conns.pop(cid, None)

    async def _write_loop(self) -> None:
        try:
            while True:
                if not self._out:
                    self._out_event.clear()
                    await self._out_event.wait()
                    continue
                parts: list[bytes] = []
                size = 0
                while self._out and size < (4 << 20):
                    part = self._out.popleft()
                    parts.append(part)
                    size += len(part)
                await self.handle.write(b"".join(parts))
        except SandboxError as e:
            self._die(f"writing to the relay failed: {e}")

    async def _read_loop(self) -> None:
        buf = bytearray()
        reason = "the relay ended"
        try:
            async for item in self.handle.output:
                if isinstance(item, OutputChunk):
                    if item.stream == "stderr":
                        self._stderr_tail = (self._stderr_tail + item.data)[-4000:]
                        continue
                    buf += item.data
                    self.peak_buffered = max(self.peak_buffered, len(buf) + self._inbox_bytes)
                    at = self._dispatch(buf)
                    if at:
                        del buf[:at]
                elif isinstance(item, ExitItem):
                    reason = f"the relay exited with status {item.exit_code}"
        except ProtocolViolation as e:
            buf.clear()
            reason = f"protocol violation by the relay: {e}"
            log.warning("tunnel closed (relay killed): %s", reason)
            self._die(reason)
            with contextlib.suppress(SandboxError):
                await self.handle.kill()
        except SandboxError as e:
            reason = f"the relay failed: {e}"
        except asyncio.CancelledError:
            reason = "the tunnel was closed"
            raise
        finally:
            tail = self._stderr_tail.decode("utf-8", "replace").strip()
            self._die(reason + (f"; its stderr: {tail[-1000:]}" if tail else ""))

    def _check(self, cid: int, kind: int, n: int) -> _Connection | None:
        """Check one frame's header before its payload is awaited: the connection it is for (None: one
        already forgotten, or HELLO), or ProtocolViolation."""
        limit = _MAX_PAYLOAD.get(kind)
        if limit is None:
            raise ProtocolViolation(f"unknown frame kind {kind} (connection {cid}, {n} bytes)")
        if n > limit or (kind in (CREDIT, HELLO) and n != limit):
            raise ProtocolViolation(f"a frame of kind {kind} with {n} bytes (at most {limit})")
        if kind == HELLO:
            if cid != 0 or self._hello.done():
                raise ProtocolViolation("an unexpected HELLO")
            return None
        if not self._hello.done():
            raise ProtocolViolation(f"a frame of kind {kind} before HELLO")
        if not 0 < cid <= self._last_id:
            raise ProtocolViolation(f"a frame for connection {cid}, which was never opened")
        conn = self._conns.get(cid)
        if conn is not None:
            conn.check(kind, n)
        return conn

    def _dispatch(self, buf: bytearray) -> int:
        at, end = 0, len(buf)
        while end - at >= HEADER.size:
            cid, kind, n = HEADER.unpack_from(buf, at)
            conn = self._check(cid, kind, n)
            if end - at - HEADER.size < n:
                break
            with memoryview(buf) as view:  # one copy, not two (a slice of a bytearray is one)
                payload = bytes(view[at + HEADER.size : at + HEADER.size + n])
            at += HEADER.size + n
            if kind == HELLO:
                self._hello.set_result(payload)
            elif conn is not None:
                conn.on_frame(kind, payload)
        return at

    @property
    def buffered(self) -> int:
        """Bytes of the relay's DATA queued on the host now, over every connection."""
        return self._inbox_bytes

    def _die(self, reason: str) -> None:
        if self.closed.is_set():
            return
        self.exit_reason = reason
        self.closed.set()
        log.debug("tunnel closed: %s", reason)
        if not self._hello.done():
            self._hello.set_exception(TunnelError(f"the tunnel relay did not start: {reason}"))
            self._hello.exception()  # retrieved: start() reports it
        for forward in self._forwards:
            forward.close()
        for conn in list(self._conns.values()):
            conn.reset("", tell=False)
        self._conns.clear()
        self._writer.cancel()
        if self._idle is not None:
            self._idle.cancel()

    async def close(self) -> None:
        """Kill the relay: every connection ends and the listeners close. Idempotent."""
        with contextlib.suppress(SandboxError):
            await self.handle.kill()
        # the output ends promptly after a kill; bound the wait anyway
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._reader), 10.0)
        if not self._reader.done():
            self._reader.cancel()
        self._die("the tunnel was closed")
        for forward in self._forwards:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(forward.server.wait_closed(), 1.0)


def relay_argv(
    python: str = "python3", window: int = DEFAULT_WINDOW, budget: int = DEFAULT_BUDGET
) -> list[str]:
    """The command that runs the relay in a session."""
    return [
        python,
        "-u",
        "-c",
        RELAY_SOURCE,
        str(window),
        str(MAX_FRAME),
        str(min(FLOOR, window)),
        str(budget),
    ]


async def open_tunnel(
    session: SandboxSession,
    ports: Sequence[int],
    *,
    python: str = "python3",
    timeout_seconds: float,
) -> tuple[Tunnel, dict[int, int]]:
    """A tunnel with one host listener per port of ``ports``: ``(tunnel, {remote_port: host_port})``."""
    tunnel = await Tunnel.start(session, python=python, timeout_seconds=timeout_seconds)
    try:
        mapping = {}
        for port in ports:
            mapping[port] = (await tunnel.forward(port)).port
    except BaseException:
        await tunnel.close()
        raise
    return tunnel, mapping


__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_WINDOW",
    "IDLE_TIMEOUT",
    "MAX_CONNECTIONS",
    "RELAY_SOURCE",
    "RESERVED",
    "Forward",
    "ProtocolViolation",
    "Tunnel",
    "TunnelError",
    "open_tunnel",
    "relay_argv",
]
