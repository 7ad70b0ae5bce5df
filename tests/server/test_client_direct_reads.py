"""The client's exec websocket reads large frames straight into the connection's buffer (remote_exec._DirectReads):
whatever the frame (binary, text, masked by a server that should not, fragmented, small), a message has what
tornado's own reading gives; a large binary one comes as a StreamFrame, its data copied out of the buffer
before the next frame is read into it."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct

from tornado.websocket import websocket_connect

from jupyter_tai_sandbox.client.remote_exec import (
    DIRECT_READ_BYTES,
    StreamFrame,
    _DirectReads,
    read_frames_directly,
)
from tests.support.aio import run

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _frame(opcode: int, payload: bytes, mask: bytes | None = None, final: bool = True) -> bytes:
    size = len(payload)
    second = 0x80 if mask else 0
    first = (0x80 if final else 0) | opcode
    if size < 126:
        head = struct.pack("!BB", first, second | size)
    elif size <= 0xFFFF:
        head = struct.pack("!BBH", first, second | 126, size)
    else:
        head = struct.pack("!BBQ", first, second | 127, size)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        head += mask
    return head + payload


def test_every_kind_of_frame_reads_as_tornado_reads_it():
    big = os.urandom(DIRECT_READ_BYTES + 1000)
    larger, smaller = os.urandom(3 * DIRECT_READ_BYTES), os.urandom(DIRECT_READ_BYTES + 10)
    text = "é" * (DIRECT_READ_BYTES // 2 + 10)
    frames = [
        _frame(2, b"\x01small"),
        _frame(2, big),
        _frame(2, larger),  # the buffer grows; the message before keeps its bytes
        _frame(2, smaller),  # read into the grown buffer
        _frame(1, text.encode()),
        _frame(2, big[::-1], mask=b"\x01\x02\x03\x04"),
        _frame(2, larger[:100_000], final=False) + _frame(0, larger[100_000:]),  # one message in two frames
    ]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.05)  # the client swaps its protocol before the frames come
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    async def main() -> list[str | bytes | None]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            connection = await websocket_connect(f"ws://127.0.0.1:{port}/", max_message_size=1 << 20)
            read_frames_directly(connection)
            assert type(connection.protocol) is _DirectReads
            messages = [await connection.read_message() for _ in frames]
            connection.close()
            return messages

    messages = run(main(), timeout=30)
    assert messages == [
        b"\x01small",
        StreamFrame(big[0], big[1:]),
        StreamFrame(larger[0], larger[1:]),
        StreamFrame(smaller[0], smaller[1:]),
        text,
        big[::-1],
        larger,
    ]
    assert [type(m) for m in messages] == [bytes, StreamFrame, StreamFrame, StreamFrame, str, bytes, bytes]
    assert all(type(m.data) is bytes for m in messages if isinstance(m, StreamFrame))
