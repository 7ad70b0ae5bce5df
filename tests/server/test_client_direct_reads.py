"""The client's exec websocket reads large frames straight into their own buffer (remote_exec._DirectReads):
whatever the frame (binary, text, masked by a server that should not, small), a message has what tornado's own
reading gives (a large binary one as a bytearray, which RemoteExec copies once without its stream byte)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct

from tornado.websocket import websocket_connect

from jupyter_tai_sandbox.client.remote_exec import DIRECT_READ_BYTES, _DirectReads, read_frames_directly
from tests.support.aio import run

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _frame(opcode: int, payload: bytes, mask: bytes | None = None) -> bytes:
    size = len(payload)
    second = 0x80 if mask else 0
    if size < 126:
        head = struct.pack("!BB", 0x80 | opcode, second | size)
    elif size <= 0xFFFF:
        head = struct.pack("!BBH", 0x80 | opcode, second | 126, size)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, second | 127, size)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        head += mask
    return head + payload


def test_every_kind_of_frame_reads_as_tornado_reads_it():
    big = os.urandom(DIRECT_READ_BYTES + 1000)
    text = "é" * (DIRECT_READ_BYTES // 2 + 10)
    frames = [
        _frame(2, b"\x01small"),
        _frame(2, big),
        _frame(1, text.encode()),
        _frame(2, big[::-1], mask=b"\x01\x02\x03\x04"),
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
    assert messages == [b"\x01small", big, text, big[::-1]]
    assert [type(m) for m in messages] == [bytes, bytearray, str, bytes]  # a large binary one: read directly
