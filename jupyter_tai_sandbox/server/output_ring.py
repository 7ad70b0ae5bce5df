"""The replay window of a live command's output, with absolute offsets (:class:`OutputRing`)."""

from __future__ import annotations

import collections
from collections.abc import Iterator

STREAMS = ("stdout", "stderr")


class OutputRing:
    """A command's most recent output, ``limit`` bytes at most, with absolute offsets.

    Offsets count both streams together from the command's start; each piece also knows its offset in
    its own stream, so a reader may resume each stream where it left it (exact whatever the interleaving:
    after a restart the order of the two streams is the session's replay, not the first server's). The
    oldest output goes first; a chunk larger than the whole ring keeps its tail. Reading does not consume:
    every reader (a reattach, each poll) reads from its own offset. (The provider's
    :class:`~jupyter_tai_sandbox.spool.OutputSpool` before it is a queue its one reader drains.)
    """

    def __init__(self, limit: int, start: int = 0, stream_starts: dict[str, int] | None = None) -> None:
        self.limit = limit
        #: (offset, stream, offset in the stream, data)
        self._chunks: collections.deque[tuple[int, str, int, bytes]] = collections.deque()
        self._held = 0
        self.end = start
        #: each stream's next offset
        self.stream_ends = dict.fromkeys(STREAMS, 0) | (stream_starts or {})

    @property
    def start(self) -> int:
        """The oldest offset the ring still holds."""
        return self._chunks[0][0] if self._chunks else self.end

    def stream_start(self, stream: str) -> int:
        """The oldest offset of ``stream`` the ring still holds."""
        return next((at for _, name, at, _ in self._chunks if name == stream), self.stream_ends[stream])

    def append(self, stream: str, data: bytes) -> None:
        self._chunks.append((self.end, stream, self.stream_ends[stream], data))
        self.end += len(data)
        self.stream_ends[stream] += len(data)
        self._held += len(data)
        while self._held > self.limit and len(self._chunks) > 1:
            self._held -= len(self._chunks.popleft()[3])
        if self._held > self.limit:  # one chunk larger than the ring: keep its tail
            offset, chunk_stream, at, chunk = self._chunks.popleft()
            keep = chunk[-self.limit :] if self.limit else b""
            self._held = len(keep)
            if keep:
                cut = len(chunk) - len(keep)
                self._chunks.append((offset + cut, chunk_stream, at + cut, keep))

    def since(self, offset: int, streams: dict[str, int] | None = None) -> Iterator[tuple[int, str, bytes]]:
        """``(offset, stream, data)`` pieces from ``offset`` (or the oldest held) to the end; with ``streams``,
        each stream from its own offset there instead."""
        first = max(offset, self.start)
        for start, stream, at, data in self._chunks:
            skip = (streams.get(stream, 0) - at) if streams is not None else (first - start)
            if skip >= len(data):
                continue
            yield (start + skip, stream, data[skip:]) if skip > 0 else (start, stream, data)
