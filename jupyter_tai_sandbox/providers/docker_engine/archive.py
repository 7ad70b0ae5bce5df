"""Tar archives as the Docker engine's archive API takes and gives them.

Uploads are built by hand as a stream of chunks (headers, the body read in
pieces, padding), so a large file never sits in memory twice; downloads are
read as a streaming tarfile over the engine's chunks.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

_BODY_CHUNK = 1 << 20


def tar_chunks(
    name: str,
    body: IO[bytes],
    size: int,
    *,
    parents: Sequence[str] = (),
    owner: tuple[int, int] = (0, 0),
    mode: int = 0o644,
) -> Iterator[bytes]:
    """A tar archive, as chunks, of the folders ``parents`` (nested, each in the one before) and
    the file ``parents/.../name`` holding ``size`` bytes read from ``body``."""
    now = int(time.time())

    def header(entry: str, kind: bytes, entry_mode: int, length: int = 0) -> bytes:
        info = tarfile.TarInfo(entry)
        info.type, info.mode, info.mtime, info.size = kind, entry_mode, now, length
        info.uid, info.gid = owner
        return info.tobuf(format=tarfile.PAX_FORMAT)

    for i in range(len(parents)):
        yield header("/".join(parents[: i + 1]), tarfile.DIRTYPE, 0o755)
    yield header("/".join([*parents, name]), tarfile.REGTYPE, mode, size)
    while chunk := body.read(_BODY_CHUNK):
        yield chunk
    if size % tarfile.BLOCKSIZE:
        yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def tar_bytes(name: str, data: bytes, *, mode: int = 0o644) -> bytes:
    """A whole (small) one-file archive."""
    return b"".join(tar_chunks(name, io.BytesIO(data), len(data), mode=mode))


class ChunkReader(io.RawIOBase):
    """A file-like view of the engine's archive chunks, for a streaming tarfile."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n
