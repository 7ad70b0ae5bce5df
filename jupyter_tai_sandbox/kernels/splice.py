"""Two connected sockets joined both ways on the event loop, no byte copied through Python.

Each direction moves bytes ``splice(2)``-d from one socket into a pipe of its own and from that
pipe into the other socket: the kernel moves the pages, this process only asks. A direction holds
at most its pipe (:data:`PIPE_SIZE`), so a side that does not read stops only the direction toward
it, and the host never buffers more than two pipes per joined pair. An end of stream is passed on
as a half-close (``shutdown(SHUT_WR)``); a broken side (a reset, an error) closes both at once, as
the peer would see it. Used by the kernels' forwarded ports when the session hands a socket of
its own (:meth:`~jupyter_tai_sandbox.contract.PortConnection.take_socket`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
from collections.abc import Callable

#: each direction's pipe: the most bytes in flight between the two sockets, one way
PIPE_SIZE = 1 << 20
#: moves in a row before the direction lets the loop run others (a stream that never runs dry)
_FAIR_MOVES = 16
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK if hasattr(os, "splice") else 0

#: whether this system can splice (Linux, Python 3.10+)
available = hasattr(os, "splice")


class _Broken(Exception):
    """One side failed (reset, refused write): the pair ends."""


async def _ready(fd: int, *, write: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _one_way(
    source: socket.socket, sink: socket.socket, moved: Callable[[], None] | None = None
) -> None:
    """Move ``source``'s bytes into ``sink`` until ``source`` ends, then half-close ``sink``; ``moved`` is called
    each time bytes went into ``sink``."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # best effort: a smaller pipe only means more moves
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, PIPE_SIZE)
        src, dst = source.fileno(), sink.fileno()
        held = 0  # bytes in the pipe
        moves = 0
        while True:
            if held:
                try:
                    held -= os.splice(read_end, dst, held, flags=_SPLICE_FLAGS)
                    if moved is not None:
                        moved()
                except BlockingIOError:
                    await _ready(dst, write=True)
                    continue
                except OSError as e:
                    raise _Broken(f"writing: {e}") from None
                continue
            try:
                n = os.splice(src, write_end, PIPE_SIZE, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                await _ready(src, write=False)
                moves = 0
                continue
            except OSError as e:
                raise _Broken(f"reading: {e}") from None
            if n == 0:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            held = n
            moves += 1
            if moves >= _FAIR_MOVES:
                moves = 0
                await asyncio.sleep(0)
    finally:
        os.close(read_end)
        os.close(write_end)


async def join(a: socket.socket, b: socket.socket, *, moved: Callable[[], None] | None = None) -> None:
    """Carry bytes between ``a`` and ``b`` both ways until both ends are done or one breaks; then close both.
    Both must be connected stream sockets, non-blocking, used by nothing else meanwhile. ``moved`` (if given) is
    called each time bytes went across, either way (an idle watch)."""
    for sock in (a, b):
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ways = [asyncio.ensure_future(_one_way(a, b, moved)), asyncio.ensure_future(_one_way(b, a, moved))]
    try:
        done, _ = await asyncio.wait(ways, return_when=asyncio.FIRST_EXCEPTION)
        if any(not way.cancelled() and way.exception() is not None for way in done):
            for sock in (a, b):  # a broken side: the other goes too, with a reset where data was left
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            await asyncio.gather(*ways)
    finally:
        for way in ways:
            way.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*ways, return_exceptions=True)
        a.close()
        b.close()


__all__ = ["PIPE_SIZE", "available", "join"]
