"""kernels.splice.join: two TCP connections joined on the event loop, as the kernels' forwarded ports use it.

Each test joins the host ends of two real loopback connections and talks through the other ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
from dataclasses import dataclass

import pytest

from jupyter_tai_sandbox.kernels import splice

pytestmark = pytest.mark.skipif(not splice.available, reason="splice(2) is Linux's")


async def connection() -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
    """A loopback TCP connection: the accepted end (to be joined) and the dialling end as streams."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    try:
        dialling = asyncio.ensure_future(asyncio.open_connection("127.0.0.1", listener.getsockname()[1]))
        accepted, _ = await asyncio.get_running_loop().sock_accept(listener)
        reader, writer = await dialling
    finally:
        listener.close()
    return accepted, reader, writer


@dataclass
class Pair:
    """Two connections whose accepted ends (``a``, ``b``) are joined (``joined``, the join's task), and the far
    end of each as streams."""

    joined: asyncio.Future[None]
    a: socket.socket
    b: socket.socket
    a_reader: asyncio.StreamReader
    a_writer: asyncio.StreamWriter
    b_reader: asyncio.StreamReader
    b_writer: asyncio.StreamWriter


async def joined_pair() -> Pair:
    a, a_reader, a_writer = await connection()
    b, b_reader, b_writer = await connection()
    return Pair(asyncio.ensure_future(splice.join(a, b)), a, b, a_reader, a_writer, b_reader, b_writer)


async def read_all(reader: asyncio.StreamReader) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    while chunk := await reader.read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    return n, h.hexdigest()


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    view = memoryview(data)
    for at in range(0, len(data), 1 << 20):
        writer.write(view[at : at + (1 << 20)])
        await writer.drain()
    writer.write_eof()


def test_bytes_go_both_ways_byte_exact_and_each_half_close_is_passed_on() -> None:
    async def main() -> None:
        pair = await joined_pair()
        up, down = os.urandom(24 << 20), os.urandom(24 << 20)
        # both ways at once; each side ends its sending and still reads the other's to the end
        _, _, got_up, got_down = await asyncio.wait_for(
            asyncio.gather(
                send(pair.a_writer, up),
                send(pair.b_writer, down),
                read_all(pair.b_reader),
                read_all(pair.a_reader),
            ),
            60,
        )
        assert got_up == (len(up), hashlib.sha256(up).hexdigest())
        assert got_down == (len(down), hashlib.sha256(down).hexdigest())
        await asyncio.wait_for(pair.joined, 10)  # both ended: the pair is closed
        assert pair.a.fileno() == -1 and pair.b.fileno() == -1
        pair.a_writer.close()
        pair.b_writer.close()

    asyncio.run(main())


def test_an_answer_after_the_clients_end_of_stream_comes_back() -> None:
    """A half-closed client still gets its answer (a server that answers once it read everything)."""

    async def main() -> None:
        pair = await joined_pair()
        pair.a_writer.write(b"question")
        pair.a_writer.write_eof()
        assert await asyncio.wait_for(pair.b_reader.read(), 10) == b"question"
        pair.b_writer.write(b"answer")
        pair.b_writer.write_eof()
        assert await asyncio.wait_for(pair.a_reader.read(), 10) == b"answer"
        await asyncio.wait_for(pair.joined, 10)
        pair.a_writer.close()
        pair.b_writer.close()

    asyncio.run(main())


def test_a_side_that_does_not_read_stops_only_the_way_toward_it_and_the_host_holds_a_pipe_at_most() -> None:
    async def main() -> None:
        pair = await joined_pair()
        # b's end never reads: what a's end can push is bounded by socket buffers and one pipe
        pushed = 0
        chunk = b"x" * (1 << 20)
        with contextlib.suppress(asyncio.TimeoutError):
            while pushed < (256 << 20):
                pair.a_writer.write(chunk)
                await asyncio.wait_for(pair.a_writer.drain(), 2)
                pushed += len(chunk)
        assert pushed < 64 << 20, f"{pushed} bytes went toward a side that never reads"
        # the other way still flows
        pair.b_writer.write(b"still here")
        await pair.b_writer.drain()
        assert await asyncio.wait_for(pair.a_reader.readexactly(10), 10) == b"still here"
        pair.joined.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pair.joined
        assert pair.a.fileno() == -1 and pair.b.fileno() == -1
        pair.a_writer.transport.abort()
        pair.b_writer.transport.abort()

    asyncio.run(main())


def test_a_reset_on_one_side_resets_the_other() -> None:
    async def main() -> None:
        pair = await joined_pair()
        pair.a_writer.write(b"hello")
        assert await asyncio.wait_for(pair.b_reader.readexactly(5), 10) == b"hello"
        raw = pair.b_writer.get_extra_info("socket")
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        pair.b_writer.transport.abort()  # a reset
        await asyncio.wait_for(pair.joined, 10)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(pair.a_reader.read(), 10)
        pair.a_writer.transport.abort()

    asyncio.run(main())
