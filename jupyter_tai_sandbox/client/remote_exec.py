"""RemoteExec: the websocket side of an interactive command, as ``SandboxClient.exec_start`` and
``SandboxClient.attach`` hand it back (see ``sandbox_client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from asyncio import Future
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, WebSocketProtocol13

from ..contract import ExitItem, OutputChunk, OutputItem, OutputStream, SandboxError, SandboxUnavailableError
from ..errors import error_from_json

_STREAMS: dict[int, OutputStream] = {1: "stdout", 2: "stderr"}
#: largest stdin frame sent over the exec websocket (the server's message limit is 10 MiB)
STDIN_FRAME_BYTES = 1 << 20
#: a frame payload at least this large is read straight into the connection's buffer (see _DirectReads)
DIRECT_READ_BYTES = 1 << 16
#: the largest payload buffer a connection keeps between frames (the server's frames are 256 KiB)
KEPT_BUFFER_BYTES = 4 << 20


class StreamFrame(NamedTuple):
    """A large binary frame of the exec protocol as :class:`_DirectReads` hands it on: its stream byte and its
    data, copied once out of the connection's buffer."""

    stream: int
    data: bytes


class _DirectReads(WebSocketProtocol13):
    """tornado's websocket protocol, reading a large payload with one ``recv_into`` a buffer the connection keeps.

    tornado reads 64 KiB at a time into a fresh buffer, appends it to the stream's buffer and copies the
    payload out of it: four passes over each byte. Read into the connection's own buffer, a payload is then
    copied once, without its stream byte, into the bytes the reader gets (a :class:`StreamFrame`). One
    allocation a frame, freed before the next: with two (a fresh buffer, then the copy) glibc gave the heap's
    top back at nearly every frame and faulted it in again, a page fault for every 4 KiB received, which
    cost the client a quarter of its CPU (benchmarks/run.py's websocket row: the client is one of the three
    processes on the benchmark's two cores). The payload is taken out of the buffer before tornado reads
    the next frame (``_handle_message`` is called at once after the read). Anything but a whole binary
    frame (text, a fragment, a masked one: a server should not mask) is handed on as tornado would.
    """

    #: the previous read was 4 bytes: a frame's mask (no other part of a frame's head is 4 bytes)
    _after_mask = False
    #: the buffer payloads are read into; a larger payload than it holds gets one of its own
    _buffer = bytearray()

    async def _read_bytes(self, n: int) -> bytes:
        after_mask, self._after_mask = self._after_mask, n == 4
        if n < DIRECT_READ_BYTES or after_mask:
            return await super()._read_bytes(n)
        if n > len(self._buffer):
            buffer = bytearray(n)
            if n <= KEPT_BUFFER_BYTES:
                self._buffer = buffer
        else:
            buffer = self._buffer
        with memoryview(buffer) as whole:
            payload = whole[:n]
            await self.stream.read_into(payload)  # type: ignore[arg-type]  # any writable buffer of its length
        self._wire_bytes_in += n
        return payload  # type: ignore[return-value]  # taken out by _handle_message before the next read

    def _handle_message(self, opcode: int, data: bytes | memoryview) -> Future[None] | None:
        if not isinstance(data, memoryview):
            return super()._handle_message(opcode, data)
        with data:
            if opcode != 0x2 or self._frame_compressed or self.client_terminated:
                return super()._handle_message(opcode, data.tobytes())
            self._message_bytes_in += len(data)
            frame = StreamFrame(data[0], data[1:].tobytes())
        return self._run_callback(self.handler.on_message, frame)


def read_frames_directly(connection: WebSocketClientConnection) -> None:
    """Have ``connection`` read its large frames as :class:`_DirectReads` does (from its next frame on).

    tornado makes the protocol itself (``websocket_connect`` has no argument for it): it is given the
    subclass's behaviour in place, and only when it is tornado's own protocol of that version.
    """
    protocol = getattr(connection, "protocol", None)
    if type(protocol) is WebSocketProtocol13:
        protocol.__class__ = _DirectReads


async def _written(sending: Any) -> None:
    """Wait for a websocket write without ever cancelling it.

    Cancelling tornado's write (as cancelling a task awaiting it does) cancels the stream's own
    future, which tornado then reports to the event loop; so the write is shielded, and its
    outcome is always retrieved, even when nobody waits for it any more.
    """
    sending = asyncio.ensure_future(sending)
    sending.add_done_callback(lambda done: done.cancelled() or done.exception())
    await asyncio.shield(sending)


class RemoteExec:
    """The websocket side of an interactive command, shaped like ``ExecHandle``."""

    def __init__(self, connection: WebSocketClientConnection) -> None:
        self._ws = connection
        self._ended = False
        #: the command's exec id (to attach again later) and the output offset its stream starts at
        self.exec_id: str | None = None
        self.offset = 0
        #: the next byte of each stream (what the output gave so far): attach again with it to resume exactly
        self.offsets = {"stdout": 0, "stderr": 0}
        #: requests the server refused while the command ran on (e.g. a write after the exit)
        self.rejected: list[SandboxError] = []
        self.output: AsyncIterator[OutputItem] = self._iterate()
        self._start_reply: asyncio.Future[None] | None = None

    async def _wait_started(self) -> None:
        # the read runs as a task of its own that a cancelled start does not cancel: a cancel landing just as
        # the answer arrived would drop it, and the abandoning start could not learn the id to stop it by
        if self._start_reply is None:
            self._start_reply = asyncio.ensure_future(self._read_start_reply())
            self._start_reply.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(self._start_reply)

    async def _read_start_reply(self) -> None:
        message = await self._ws.read_message()
        if message is None:
            raise SandboxError("the exec websocket closed before the command started")
        if not isinstance(message, str):
            raise SandboxError("the exec websocket sent output before saying the command started")
        data = json.loads(message)
        if data.get("type") not in ("started", "attached"):
            self._ws.close()
            raise error_from_json(data)
        self.exec_id = data.get("exec_id")
        self.offset = int(data.get("offset", 0))
        self.offsets.update({name: int(at) for name, at in (data.get("offsets") or {}).items()})

    async def _iterate(self) -> AsyncIterator[OutputItem]:
        while True:
            message: str | bytes | StreamFrame | None = await self._ws.read_message()
            if message is None:
                # the connection ended (the server went away): no status was read, none is made up
                raise SandboxUnavailableError("the exec websocket closed without an exit message")
            if isinstance(message, StreamFrame):  # a large one, read directly
                stream, data = _STREAMS[message.stream], message.data
                self.offsets[stream] += len(data)
                yield OutputChunk(stream, data)
                continue
            if not isinstance(message, str):
                stream = _STREAMS[message[0]]
                self.offsets[stream] += len(message) - 1
                yield OutputChunk(stream, message[1:])
                continue
            data = json.loads(message)
            if data.get("type") == "rejected":
                self.rejected.append(error_from_json(data))
                continue
            if data.get("type") == "detached":
                self._ended = True
                self._ws.close()
                raise SandboxError(f"detached: {data.get('message', 'another client attached')}")
            self._ended = True
            self._ws.close()
            if data.get("type") == "exit":
                reason = data.get("reason")
                yield ExitItem(int(data["exit_code"]), reason if isinstance(reason, str) else None)
                return
            raise error_from_json(data)

    async def _send(self, message: str | bytes) -> None:
        try:
            await _written(self._ws.write_message(message, binary=isinstance(message, bytes)))
        except WebSocketClosedError:
            raise SandboxError("the command has ended: its websocket is closed") from None

    async def write(self, data: bytes) -> None:
        await self._send(bytes(data))

    async def close_stdin(self) -> None:
        await self._send(json.dumps({"type": "close_stdin"}))

    async def kill(self) -> None:
        if not self._ended:
            with contextlib.suppress(SandboxError):
                await self._send(json.dumps({"type": "kill"}))

    async def resize(self, rows: int, cols: int) -> None:
        await self._send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    def disconnect(self) -> None:
        """Drop the connection: the command runs on for the server's detach grace time (attach to keep it)."""
        self._ws.close()
