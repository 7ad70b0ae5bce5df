"""Interactive exec over a websocket, terminal-like.

Protocol (documented in README, "Websocket protocol"):

client -> server
  text  {"type": "start", "argv": [...], "timeout_seconds": N, "pty": false,
         "env": {}, "cwd": ".", "rows": 24, "cols": 80}          first message, once
  binary  bytes for the command's stdin
  text  {"type": "stdin", "data": "text"}                        stdin as text
  text  {"type": "close_stdin"} | {"type": "kill"} | {"type": "resize", "rows": R, "cols": C}

server -> client
  text  {"type": "started"}
  binary  one byte stream id (1 stdout, 2 stderr) then the bytes
  text  {"type": "rejected", "request": "<type>", "error": ..., "message": ...}  a refused
        request (a write after the exit, a resize without a pty...); the command runs on
  text  {"type": "exit", "exit_code": N}  or  {"type": "error", "error": "<ErrorClass>", "message": ...}
        exactly one of the two, last; then the server closes the socket.

A client that disconnects kills its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Awaitable
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler, WebSocketProtocol13

from .contract import (
    ExecHandle,
    ExecRequest,
    ExitItem,
    SandboxError,
    SandboxRequestError,
    SandboxSession,
    check_window_side,
)
from .errors import error_body, error_status
from .handler_base import AUTH_RESOURCE, JSONErrorsMixin, SandboxHandlerMixin

STREAM_IDS = {"stdout": 1, "stderr": 2}
# RFC 6455 frame head of an unmasked binary frame with FIN set (server to client), by payload size
_BINARY_FINAL = 0x82
_FRAME_HEAD_SHORT = struct.Struct("!BB")
_FRAME_HEAD_16 = struct.Struct("!BBH")
_FRAME_HEAD_64 = struct.Struct("!BBQ")
_kills: set[asyncio.Future[None]] = set()


class ExecWebSocketHandler(
    JSONErrorsMixin, SandboxHandlerMixin, WebSocketMixin, WebSocketHandler, JupyterHandler
):
    """One interactive command per connection."""

    auth_resource = AUTH_RESOURCE
    _counted = False

    session: SandboxSession
    handle: ExecHandle | None = None
    _pump: asyncio.Task[None] | None = None
    _ended = False

    def set_default_headers(self) -> None:
        """JupyterHandler's headers make no sense on a websocket."""

    def get_compression_options(self) -> Any:
        return self.settings.get("websocket_compression_options", None)

    @ws_authenticated
    async def get(self, session_id: str) -> None:
        # the kernel websocket's pattern: authorize with "execute" here, not per message
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "execute", AUTH_RESOURCE)):
            raise web.HTTPError(403)
        caller = await self.caller()
        # a refusal is answered in JSON (404 for an unknown or another user's session, 503 with no provider)
        self.session = await self.sessions.get(session_id, caller, manage=True)
        self.touch()
        await super().get(session_id=session_id)

    def open(self, session_id: str) -> None:  # type: ignore[override]
        super().open()  # starts the ping loop

    async def on_message(self, message: str | bytes) -> None:
        if self._ended:
            return
        request: Any = {"type": "stdin"}
        try:
            if isinstance(message, bytes):
                await self._stdin(message)
                return
            try:
                request = json.loads(message)
            except ValueError:
                request = {}
                raise SandboxRequestError("control messages are JSON objects") from None
            if not isinstance(request, dict):
                request = {}
                raise SandboxRequestError("control messages are JSON objects")
            await self._control(request)
        except SandboxError as e:
            if self.handle is None:
                await self._finish_with(error_body(e, error_status(e)))
            else:
                # the command runs on: a refused request is answered, the stream does not end
                await self._send({"type": "rejected", "request": request.get("type"), **error_body(e, 400)})

    async def _control(self, request: dict[str, Any]) -> None:
        kind = request.get("type")
        if kind == "start":
            if self.handle is not None:
                raise SandboxRequestError("this connection already started a command")
            start = ExecRequest.from_json(
                request,
                interactive=True,
                max_timeout_seconds=self.policy.max_timeout_seconds,
                ignore=frozenset({"type"}),
            )
            self.handle = await self.session.start(start)
            self.sandbox_app.live_commands += 1
            self._counted = True
            await self._send({"type": "started"})
            self._pump = asyncio.create_task(self._relay_output(self.handle))
            return
        if self.handle is None:
            raise SandboxRequestError('send {"type": "start", ...} first')
        if kind == "stdin":
            data = request.get("data")
            if not isinstance(data, str):
                raise SandboxRequestError(
                    "stdin messages carry text in 'data' (send bytes as binary frames)"
                )
            await self._stdin(data.encode())
        elif kind == "close_stdin":
            await self.handle.close_stdin()
        elif kind == "kill":
            await self.handle.kill()
        elif kind == "resize":
            rows = check_window_side("rows", request.get("rows"))
            cols = check_window_side("cols", request.get("cols"))
            await self.handle.resize(rows, cols)
        else:
            raise SandboxRequestError(f"unknown message type {kind!r}")

    async def _stdin(self, data: bytes) -> None:
        if self.handle is None:
            raise SandboxRequestError('send {"type": "start", ...} before stdin')
        self.touch()
        await self.handle.write(data)

    async def _relay_output(self, handle: ExecHandle) -> None:
        # one frame in flight while the next is read: memory stays bounded by a frame or two,
        # and reading the handle overlaps with flushing to the socket
        in_flight: asyncio.Future[None] | None = None
        # with scrub_transcript on, one scrubber per stream (it holds back < len(longest secret) bytes)
        scrubbers = {s: self.policy.stream_scrubber() for s in STREAM_IDS}
        scrubbers = {s: scrubber for s, scrubber in scrubbers.items() if scrubber is not None}

        async def drain_scrubbers() -> None:
            for stream, scrubber in scrubbers.items():
                tail = scrubber.flush()
                if tail:
                    await self._write_output(STREAM_IDS[stream], tail)

        try:
            async for item in handle.output:
                if isinstance(item, ExitItem):
                    if in_flight is not None:
                        await in_flight
                    await drain_scrubbers()
                    await self._finish_with({"type": "exit", "exit_code": item.exit_code})
                    return
                data = item.data
                scrubber = scrubbers.get(item.stream)
                if scrubber is not None:
                    data = scrubber.feed(data)
                    if not data:
                        continue
                frame = self._write_output(STREAM_IDS[item.stream], data)
                if in_flight is not None:
                    await in_flight
                in_flight = frame
        except (WebSocketClosedError, StreamClosedError):
            return
        except SandboxError as e:
            with contextlib.suppress(WebSocketClosedError, StreamClosedError):
                if in_flight is not None:
                    await in_flight
                await drain_scrubbers()
            await self._finish_with(error_body(e, error_status(e)))

    def _write_output(self, stream_id: int, data: bytes) -> Awaitable[None]:
        """Send one output frame (the stream id, then the bytes); the returned awaitable is its flush.

        Without compression the frame is built here in one copy and handed to the connection's
        stream in one write: tornado's write_message copies a payload twice, and 256 MiB streamed
        that way ran at 0.35x the direct handle against 0.45x this way (benchmarks/run.py). A
        compressed connection goes through write_message.
        """
        connection = self.ws_connection
        if connection is None or connection.is_closing():
            raise WebSocketClosedError()
        payload = bytes((stream_id,))
        if getattr(connection, "_compressor", None) is not None or not isinstance(connection, WebSocketProtocol13):
            return self.write_message(payload + data, binary=True)
        size = len(data) + 1
        if size < 126:
            header = _FRAME_HEAD_SHORT.pack(_BINARY_FINAL, size)
        elif size <= 0xFFFF:
            header = _FRAME_HEAD_16.pack(_BINARY_FINAL, 126, size)
        else:
            header = _FRAME_HEAD_64.pack(_BINARY_FINAL, 127, size)
        try:
            return connection.stream.write(b"".join((header, payload, data)))
        except StreamClosedError:
            raise WebSocketClosedError() from None

    async def _send(self, message: dict[str, Any]) -> None:
        await self.write_message(json.dumps(message))

    async def _finish_with(self, message: dict[str, Any]) -> None:
        if self._ended:
            return
        self._ended = True
        if "type" not in message:
            message = {"type": "error", **message}
        with contextlib.suppress(WebSocketClosedError):
            await self._send(message)
        self.close(1000)
        self._uncount()
        if self.handle is not None:
            await self.handle.kill()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.sandbox_app.live_commands -= 1
            self.touch()

    def on_close(self) -> None:
        super().on_close()
        self._uncount()
        if self.handle is not None and not self._ended:
            self._ended = True
            if self._pump is not None:
                self._pump.cancel()
            # on_close cannot await: keep the task referenced until it is done
            task = asyncio.ensure_future(self.handle.kill())
            _kills.add(task)
            task.add_done_callback(_kills.discard)
