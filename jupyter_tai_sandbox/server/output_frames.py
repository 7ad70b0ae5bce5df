"""Output frames of the exec websocket, written without copying their bytes (:func:`write_output`).

A frame is the websocket head, the stream id (1 stdout, 2 stderr), then at most :data:`FRAME_BYTES` of output;
a larger chunk (a local command's stdout is read 1 MiB at a time) goes as several frames. When the connection
has nothing waiting to be written, the heads and views of the chunk go to the socket in one ``sendmsg``, and
what the socket does not take at once is handed to the connection's stream, which keeps a large piece as a
view. ``write_message`` would copy each frame twice, and a frame joined into one bytes object copies it once
and adds a second large allocation a chunk.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable

from tornado.iostream import IOStream, StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler, WebSocketProtocol13

#: the most output bytes one frame carries (its payload is one more: the stream id); a larger chunk is sent as
#: several frames, in one ``sendmsg``
FRAME_BYTES = 256 << 10
_BINARY_FINAL = 0x82
_HEAD_SHORT = struct.Struct("!BBB")  # and the stream id
_HEAD_16 = struct.Struct("!BBHB")
_HEAD_64 = struct.Struct("!BBQB")


def _frame_head(stream_id: int, size: int) -> bytes:
    """The head of an unmasked binary frame of ``size`` bytes of output, with its stream id."""
    size += 1
    if size < 126:
        return _HEAD_SHORT.pack(_BINARY_FINAL, size, stream_id)
    if size <= 0xFFFF:
        return _HEAD_16.pack(_BINARY_FINAL, 126, size, stream_id)
    return _HEAD_64.pack(_BINARY_FINAL, 127, size, stream_id)


def write_output(handler: WebSocketHandler, stream_id: int, data: bytes) -> Awaitable[None]:
    """Send ``data`` as output frames of at most :data:`FRAME_BYTES` each on ``handler``'s connection; the
    awaitable is their flush.

    A compressed connection (or another protocol) goes through ``write_message``.
    """
    connection = handler.ws_connection
    if connection is None or connection.is_closing():
        raise WebSocketClosedError()
    written: Awaitable[None] | None = None
    if getattr(connection, "_compressor", None) is not None or not isinstance(
        connection, WebSocketProtocol13
    ):
        for start in range(0, len(data) or 1, FRAME_BYTES):
            written = handler.write_message(
                bytes((stream_id,)) + data[start : start + FRAME_BYTES], binary=True
            )
        assert written is not None
        return written
    parts = _frames(stream_id, data)
    stream = connection.stream
    try:
        if type(stream) is not IOStream or stream.writing() or stream.closed():  # TLS, or queued: in order
            for head, piece in zip(parts[::2], parts[1::2], strict=True):
                written = stream.write(b"".join((head, piece)))  # one copy
            assert written is not None
            return written
        sent = _send_now(stream.socket, parts)
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            written = stream.write(part[sent:] if sent else part)  # a large piece is kept as a view
            sent = 0
    except StreamClosedError:
        raise WebSocketClosedError() from None
    if written is None:  # the socket took it all
        written = asyncio.get_running_loop().create_future()
        written.set_result(None)
    return written


def _frames(stream_id: int, data: bytes) -> list[bytes | memoryview]:
    """Each frame's head and its piece of ``data`` (a view: nothing is copied)."""
    if len(data) <= FRAME_BYTES:
        return [_frame_head(stream_id, len(data)), data]
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    for start in range(0, len(data), FRAME_BYTES):
        piece = view[start : start + FRAME_BYTES]
        parts += (_frame_head(stream_id, len(piece)), piece)
    return parts


def _send_now(sock: socket.socket, parts: list[bytes | memoryview]) -> int:
    """What the socket takes of ``parts`` at once. 0 when it takes nothing, and when the connection is gone:
    the stream's own write then finds that out, closes, and says so as it always does."""
    try:
        return sock.sendmsg(parts)
    except OSError:
        return 0
