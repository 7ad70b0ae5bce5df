"""A bounded, ordered buffer for a command's output.

Providers take a command's output in as it comes, whether or not anyone reads,
so a finished command's output is all there however late it is read. Past
``memory_limit`` bytes the buffer spills to an anonymous temporary file (outside
any workspace, unlinked from the start), so memory stays bounded. Past
``disk_limit`` unread bytes in that file the spool stops taking output in:
``overflowed`` turns true, ``on_overflow`` is called once (the provider stops the
command there), and the reader gets what was kept, then the end.

A spool is a queue: what its one reader takes is gone from it. The server's
replay window over a live command's output (attach from an offset, poll since
one) is the other buffer, :class:`jupyter_tai_sandbox.server.output_ring.OutputRing`, fed from
the spool's reader.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import struct
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

from .contract import OutputStream

DEFAULT_MEMORY_LIMIT = 8 << 20
#: Unread output one command may keep on the server's disk (SandboxApp.max_spill_bytes sets it).
DEFAULT_DISK_LIMIT = 1 << 30
#: The disk limit of spools made within a call that set one: a server's gate sets its
#: SandboxApp.max_spill_bytes around each command start, so two servers in one process keep their own.
spill_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "tai_sandbox_spill_limit", default=None
)
_HEADER = struct.Struct(">cI")
_STREAM_CODES: dict[str, bytes] = {"stdout": b"o", "stderr": b"e"}
_CODE_STREAMS: dict[bytes, OutputStream] = {b"o": "stdout", b"e": "stderr"}


class OutputSpool:
    """A FIFO of ``(stream, data)`` records fed by a provider and drained by one reader."""

    #: the disk limit of spools made outside a server's gate and without one (a constant default:
    #: a server's SandboxApp.max_spill_bytes reaches its spools through ``spill_limit``, not here)
    default_disk_limit = DEFAULT_DISK_LIMIT

    def __init__(self, memory_limit: int = DEFAULT_MEMORY_LIMIT, disk_limit: int | None = None) -> None:
        self._memory_limit = memory_limit
        if disk_limit is None:
            disk_limit = spill_limit.get()
        self.disk_limit = self.default_disk_limit if disk_limit is None else disk_limit
        self._disk_limit = self.disk_limit
        self.overflowed = False
        self.on_overflow: Callable[[], None] | None = None
        self._memory: collections.deque[tuple[OutputStream, bytes]] = collections.deque()
        self._memory_bytes = 0
        self._file: BinaryIO | None = None
        self._write_pos = 0
        self._read_pos = 0
        self._closed = False
        self._changed = asyncio.Event()

    @property
    def closed(self) -> bool:
        """True once the provider will add nothing more."""
        return self._closed

    def put(self, stream: OutputStream, data: bytes) -> None:
        if self._closed or not data or self.overflowed:
            return
        spilling = self._read_pos < self._write_pos
        if not spilling and self._memory_bytes + len(data) <= self._memory_limit:
            self._memory.append((stream, data))
            self._memory_bytes += len(data)
        elif self._disk_limit and self._write_pos - self._read_pos + len(data) > self._disk_limit:
            self.overflowed = True
            if self.on_overflow is not None:
                self.on_overflow()
        else:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="tai-sandbox-output-")  # noqa: SIM115 - lives with the spool
            self._file.seek(self._write_pos)
            self._file.write(_HEADER.pack(_STREAM_CODES[stream], len(data)))
            self._file.write(data)
            self._write_pos = self._file.tell()
        self._changed.set()

    def close(self) -> None:
        """No more records; a waiting reader wakes and sees the end after draining."""
        self._closed = True
        self._changed.set()

    def discard(self) -> None:
        """Drop everything buffered and release the temporary file."""
        self._closed = True
        self._memory.clear()
        self._memory_bytes = 0
        self._release_file()
        self._changed.set()

    def _release_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._read_pos = self._write_pos = 0

    def get_nowait(self) -> tuple[OutputStream, bytes] | None:
        if self._memory:
            stream, data = self._memory.popleft()
            self._memory_bytes -= len(data)
            return stream, data
        if self._file is not None and self._read_pos < self._write_pos:
            self._file.seek(self._read_pos)
            code, size = _HEADER.unpack(self._file.read(_HEADER.size))
            data = self._file.read(size)
            self._read_pos = self._file.tell()
            if self._read_pos == self._write_pos:
                # caught up: reuse the file from its start
                self._file.seek(0)
                self._file.truncate()
                self._read_pos = self._write_pos = 0
            return _CODE_STREAMS[code], data
        return None

    async def get(self) -> tuple[OutputStream, bytes] | None:
        """The next record, waiting for one; None once closed and drained."""
        while True:
            item = self.get_nowait()
            if item is not None:
                return item
            if self._closed:
                self._release_file()  # drained: the temporary file goes now, not when the spool is collected
                return None
            self._changed.clear()
            await self._changed.wait()


@contextlib.contextmanager
def spilling_at_most(limit: int | None) -> Iterator[None]:
    """Spools made in this block (and the tasks it starts) keep at most ``limit`` unread bytes on disk."""
    token = spill_limit.set(limit)
    try:
        yield
    finally:
        spill_limit.reset(token)
