"""RemoteExec: the websocket side of an interactive command, as ``SandboxClient.exec_start`` and
``SandboxClient.attach`` hand it back (see ``sandbox_client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, WebSocketProtocol13

from ..contract import ExitItem, OutputChunk, OutputItem, OutputStream, SandboxError, SandboxUnavailableError
from ..errors import error_from_json

_STREAMS: dict[int, OutputStream] = {1: "stdout", 2: "stderr"}
#: largest stdin frame sent over the exec websocket (the server's message limit is 10 MiB)
STDIN_FRAME_BYTES = 1 << 20
#: a frame payload at least this large is read straight into its own buffer (see _DirectReads)
DIRECT_READ_BYTES = 1 << 16


class _DirectReads(WebSocketProtocol13):
    """tornado's websocket protocol, reading a large payload with one ``recv_into`` its own buffer.

    tornado reads 64 KiB at a time into a fresh buffer, appends it to the stream's buffer and copies the
    payload out of it: four passes over each byte (and a copy of the whole buffer when it grows after a
    front cut). Read into a buffer of the payload's size, an exec stream's 256 KiB frames cost the client
    half the CPU (0.45 s per GiB against 0.9-1.0, benchmarks/run.py's websocket row: the client is one of
    the three processes on the benchmark's two cores). The payload is then a bytearray, which the reader
    copies once, without its stream byte (each further copy of a 256 KiB frame is another allocation, and
    the page faults of memory glibc hands back at each frame cost the client as much again); a text
    frame decodes from it as from bytes. A masked frame (a server should not mask) is read as tornado
    reads it: its unmask takes bytes only. Only ``_read_bytes`` differs: if tornado stops calling it, this
    reads as tornado does.
    """

    #: the previous read was 4 bytes: a frame's mask (no other part of a frame's head is 4 bytes)
    _after_mask = False

    async def _read_bytes(self, n: int) -> bytes:
        after_mask, self._after_mask = self._after_mask, n == 4
        if n < DIRECT_READ_BYTES or after_mask:
            return await super()._read_bytes(n)
        buffer = bytearray(n)
        await self.stream.read_into(buffer)
        self._wire_bytes_in += n
        return buffer  # type: ignore[return-value]  # bytes-like: tornado decodes a text one, passes a binary one


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
            message = await self._ws.read_message()
            if message is None:
                # the connection ended (the server went away): no status was read, none is made up
                raise SandboxUnavailableError("the exec websocket closed without an exit message")
            if not isinstance(message, str):  # binary: bytes, or a bytearray read directly
                stream = _STREAMS[message[0]]
                self.offsets[stream] += len(message) - 1
                data = message[1:] if type(message) is bytes else bytes(memoryview(message)[1:])
                yield OutputChunk(stream, data)
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
