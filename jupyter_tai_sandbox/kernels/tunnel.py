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
OPEN    ->relay    connect connection ``id`` to the payload's port (u16), retrying for u32 ms
DATA    both       bytes of connection ``id``
CREDIT  both       the receiver wrote out u32 more bytes (sent once a quarter window is owed)
EOF     both       the sender's side is done (half-close: ``shutdown(SHUT_WR)``)
RESET   both       the connection is gone (payload: why); forget it
======  =========  ===========================================================

**Back-pressure per connection.** Each side may have at most ``window`` bytes of
one connection's DATA unacknowledged; the receiver queues DATA per connection (it
never blocks reading the shared stream) and returns CREDIT as it writes the bytes
out to that connection's socket. A connection whose far end does not read stops at
its window; the others go on.

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
saying why. So the host never holds more than one frame of the stream plus, per
connection, its window of received DATA (:attr:`Tunnel.peak_buffered`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
from .peers import admitted
from .relay import CREDIT, DATA, EOF, HEADER, HELLO, OPEN, RESET

#: bytes of one connection's data in flight (per direction) before its sender waits for CREDIT
DEFAULT_WINDOW = 4 << 20
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


#: The relay's program, shipped into the session as ``python3 -u -c RELAY_SOURCE WINDOW MAX_FRAME``.
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
    """The host side of one forwarded connection."""

    def __init__(self, tunnel: Tunnel, cid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.tunnel = tunnel
        self.cid = cid
        self.reader = reader
        self.writer = writer
        self.credit = tunnel.window
        self.credit_event = asyncio.Event()
        self.credit_event.set()
        self.inbox: deque[bytes | None] = deque()
        self.inbox_event = asyncio.Event()
        #: bytes of the relay's DATA received and not yet acknowledged with CREDIT (at most the window)
        self.unacked = 0
        self.got_eof_frame = False
        self.sent_eof = False
        self.got_eof = False
        self.dead = False
        self.tasks = [
            asyncio.create_task(self._upstream(), name=f"tunnel-up-{cid}"),
            asyncio.create_task(self._downstream(), name=f"tunnel-down-{cid}"),
        ]

    async def _upstream(self) -> None:
        """Host socket -> relay, within the credit the relay gave."""
        try:
            while not self.dead:
                while self.credit <= 0 and not self.dead:
                    self.credit_event.clear()
                    await self.credit_event.wait()
                if self.dead:
                    return
                data = await self.reader.read(min(self.credit, MAX_FRAME))
                if self.dead:
                    return
                if not data:
                    self.sent_eof = True
                    self.tunnel._send(self.cid, EOF)
                    self._maybe_finished()
                    return
                self.credit -= len(data)
                self.tunnel._send(self.cid, DATA, data)
        except (OSError, ConnectionError) as e:
            self.reset(f"host read failed: {e}")

    async def _downstream(self) -> None:
        """Relay -> host socket; CREDIT goes back as the bytes are written out."""
        owed = 0
        quarter = max(1, self.tunnel.window // 4)
        try:
            while not self.dead:
                if not self.inbox:
                    self.inbox_event.clear()
                    await self.inbox_event.wait()
                    continue
                item = self.inbox.popleft()
                if item is not None:
                    self.tunnel._inbox_bytes -= len(item)
                if item is None:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    self.got_eof = True
                    self._maybe_finished()
                    return
                self.writer.write(item)
                await self.writer.drain()
                owed += len(item)
                if owed >= quarter:
                    self.tunnel._send(self.cid, CREDIT, struct.pack(">I", owed))
                    self.unacked -= owed
                    owed = 0
        except (OSError, ConnectionError, RuntimeError) as e:
            self.reset(f"host write failed: {e}")

    def _maybe_finished(self) -> None:
        if self.sent_eof and self.got_eof and not self.dead:
            self.dead = True
            self.tunnel._forget(self.cid)
            self.writer.close()

    def check(self, kind: int, n: int) -> None:
        """Refuse a frame this connection cannot take, from its header alone (ProtocolViolation)."""
        if kind in (DATA, EOF) and self.got_eof_frame:
            raise ProtocolViolation(
                f"{'DATA' if kind == DATA else 'a second EOF'} after EOF on connection {self.cid}"
            )
        if kind == DATA and self.unacked + n > self.tunnel.window:
            raise ProtocolViolation(
                f"DATA past the window on connection {self.cid} "
                f"({self.unacked + n} bytes unacknowledged, window {self.tunnel.window})"
            )

    def on_frame(self, kind: int, payload: bytes) -> None:
        if kind in (DATA, EOF):
            if kind == DATA:
                self.unacked += len(payload)
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
        self.tunnel._inbox_bytes -= sum(len(item) for item in self.inbox if item is not None)
        self.inbox.clear()
        if tell:
            self.tunnel._send(self.cid, RESET, why.encode()[:1000])
        self.credit_event.set()
        self.inbox_event.set()
        self.writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class Tunnel:
    """A relay in one session and the host listeners forwarding to it.

    Start with :meth:`start`; forward ports with :meth:`forward`; end with
    :meth:`close` (kills the relay). :attr:`closed` is set when the relay is gone
    for whatever reason, and :attr:`exit_reason` says why.
    """

    def __init__(self, handle: ExecHandle, *, window: int = DEFAULT_WINDOW) -> None:
        self.handle = handle
        self.window = window
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
        #: the most the host ever held of the relay's stream (at most a frame and a chunk, plus a window per connection)
        self.peak_buffered = 0
        self._last_id = 0
        self._writer = asyncio.create_task(self._write_loop(), name="tunnel-writer")
        self._reader = asyncio.create_task(self._read_loop(), name="tunnel-reader")

    @classmethod
    async def start(
        cls,
        session: SandboxSession,
        *,
        python: str = "python3",
        timeout_seconds: float,
        window: int = DEFAULT_WINDOW,
        start_timeout_seconds: float = START_TIMEOUT,
    ) -> Tunnel:
        """Start the relay in ``session`` (``python`` is the interpreter there) and wait for it to answer."""
        if not 0 < window < 1 << 31:
            raise ValueError("window must be a positive number of bytes below 2 GiB")
        # a byte transport, not a transcript: through the gate its deadline is held to the operator's
        # ceiling (refused past it) but its output is not scrubbed (a replacement would break the frames)
        try:
            handle = await start_transport(session, ExecRequest(relay_argv(python, window), timeout_seconds))
        except SandboxRequestError as e:
            if e.field != "argv":
                raise
            # the interpreter is absent or not a program (a provider that says so before the start)
            raise TunnelError(f"the tunnel relay did not start: {e}") from None
        tunnel = cls(handle, window=window)
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

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._accept(remote_port, wait_ms, reader, writer)

        server = await asyncio.start_server(accepted, host, port)
        bound = server.sockets[0].getsockname()[1]
        forward = Forward(remote_port, host, bound, server, connect_wait)
        self._forwards.append(forward)
        return forward

    def _accept(
        self, remote_port: int, wait_ms: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        connection = writer.get_extra_info("socket")
        if self.closed.is_set() or connection is None or not admitted(connection):
            writer.transport.abort()  # closed, or another local account: never the kernel's client
            return
        cid = self._last_id = next(self._ids)
        self._send(cid, OPEN, struct.pack(">HI", remote_port, wait_ms))
        self._conns[cid] = _Connection(self, cid, reader, writer)

    @property
    def connections(self) -> int:
        return len(self._conns)

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
            payload = bytes(buf[at + HEADER.size : at + HEADER.size + n])
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


def relay_argv(python: str = "python3", window: int = DEFAULT_WINDOW) -> list[str]:
    """The command that runs the relay in a session."""
    return [python, "-u", "-c", RELAY_SOURCE, str(window), str(MAX_FRAME)]


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
    "DEFAULT_WINDOW",
    "RELAY_SOURCE",
    "Forward",
    "ProtocolViolation",
    "Tunnel",
    "TunnelError",
    "open_tunnel",
    "relay_argv",
]
