"""Interactive exec over a websocket, terminal-like, with commands that survive a closed tab.

Protocol (documented in docs/developers/websocket.md):

client -> server
  text  {"type": "start", "argv": [...], "timeout_seconds": N, "pty": false,
         "env": {}, "cwd": ".", "rows": 24, "cols": 80}          first message: a new command
  text  {"type": "attach", "exec_id": "exe-...", "offset": N}    first message: a running one
  binary  bytes for the command's stdin
  text  {"type": "stdin", "data": "text"}                        stdin as text
  text  {"type": "close_stdin"} | {"type": "kill"} | {"type": "resize", "rows": R, "cols": C}

server -> client
  text  {"type": "started", "exec_id": "exe-..."}
  text  {"type": "attached", "exec_id": "exe-...", "offset": N}  N: the first offset replayed
  binary  one byte stream id (1 stdout, 2 stderr) then the bytes
  text  {"type": "rejected", "request": "<type>", "error": ..., "message": ...}  a refused
        request (a write after the exit, a resize without a pty...); the command runs on
  text  {"type": "exit", "exit_code": N}  or  {"type": "error", "error": "<ErrorClass>", "message": ...}
        exactly one of the two, last; then the server closes the socket.
  text  {"type": "detached", ...}  another client attached to the command; this socket closes.

Offsets count the output bytes of both streams together, from the command's start.
A client that disconnects detaches: the command runs on (within its own deadline)
and is killed after SandboxApp.live_command_grace_seconds unless someone attaches again
(or polls it over MCP: the command is an entry of the server's one live-command registry,
:mod:`jupyter_tai_sandbox.execs`, which MCP's session_exec_start feeds too).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..contract import (
    ExecRequest,
    SandboxError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxSession,
    check_window_side,
)
from ..errors import error_body, error_status
from ..events import ADMIN, TERMINAL_CLOSE, TERMINAL_OPEN
from .handler_base import AUTH_RESOURCE, JSONErrorsMixin, SandboxHandlerMixin
from .live_command import STREAM_IDS, LiveCommand
from .output_frames import write_output

#: the close code after the final error of a command whose session went (reaped at its TTL, destroyed)
SESSION_GONE_CLOSE = 4404


class ExecWebSocketHandler(
    JSONErrorsMixin, SandboxHandlerMixin, WebSocketMixin, WebSocketHandler, JupyterHandler
):
    """One interactive command per connection: started here, or attached to by its exec id."""

    auth_resource = AUTH_RESOURCE

    session: SandboxSession
    live: LiveCommand | None = None
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
        # a refusal is answered in JSON (404 for an unknown or another user's session, 503 with no provider)
        caller = await self.caller()
        try:
            self.session = await self.sessions.get(session_id, caller, manage=True)
        except SandboxNotFoundError as e:
            gone = self.sandbox_app.execs.gone(
                session_id, caller
            )  # one this server saw go: why, to whom it concerns
            if gone is None:
                raise
            raise gone from e
        owner = getattr(getattr(self.session, "spec_known", lambda: None)(), "owner", None)
        if caller.manages_all and owner is not None and owner != caller.name:  # an admin on another's session
            self.session.tell(ADMIN, actor=caller.name, action=f"{self.request.method} {self.request.path}")  # type: ignore[attr-defined]  # a GatedSession's
        self.touch()
        await super().get(session_id=session_id)

    def open(self, session_id: str) -> None:
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
            if self.live is None:
                await self.send_final({"type": "error", **error_body(e, error_status(e))})
            else:
                # the command runs on: a refused request is answered, the stream does not end
                with contextlib.suppress(WebSocketClosedError):
                    await self._send(
                        {"type": "rejected", "request": request.get("type"), **error_body(e, 400)}
                    )

    async def _control(self, request: dict[str, Any]) -> None:
        kind = request.get("type")
        if kind in ("start", "attach"):
            if self.live is not None:
                raise SandboxRequestError("this connection already has a command")
            await (self._start(request) if kind == "start" else self._attach(request))
            return
        live = self.live
        if live is None:
            raise SandboxRequestError('send {"type": "start", ...} or {"type": "attach", ...} first')
        if kind == "stdin":
            data = request.get("data")
            if not isinstance(data, str):
                raise SandboxRequestError("stdin messages carry text in 'data' (send bytes as binary frames)")
            await self._stdin(data.encode(errors="surrogatepass"))
        elif kind == "close_stdin":
            await live.handle.close_stdin()
        elif kind == "kill":
            await live.handle.kill()
        elif kind == "resize":
            rows = check_window_side("rows", request.get("rows"))
            cols = check_window_side("cols", request.get("cols"))
            await live.handle.resize(rows, cols)
        else:
            raise SandboxRequestError(f"unknown message type {kind!r}")

    async def _start(self, message: dict[str, Any]) -> None:
        request = ExecRequest.from_json(message, interactive=True, ignore=frozenset({"type"}))
        caller = await self.caller()
        execs = self.sandbox_app.execs
        # the per-user and per-session caps: the slot is held from before the first await (429 beyond)
        with execs.reserve(caller.name, self.session.id):
            ticket = execs.ticket(caller.name, self.session.id, request, "websocket")
            # the gated session applies the timeout ceiling and scrubs the output; one that holds its commands
            # keeps the ticket, so a restarted server finds the command under the same id
            handle = await self.session.start(ticket.labelled(request))
            # this socket reads it from its first byte: attached later (after the "started" flush), a command
            # that wrote more than the output ring holds meanwhile would lose its head
            live = execs.add(handle, ticket, listener=None if self._ended else self, session=self.session)
        self.live = live
        if self._ended:
            # the socket closed while the command started: nobody has its id, nobody can attach
            await live.handle.kill()
            return
        # written at once, before the command's pump first runs, so it comes before any output frame
        await self._send({"type": "started", "exec_id": live.id})
        self._tell_terminal(TERMINAL_OPEN, "start")

    async def _attach(self, message: dict[str, Any]) -> None:
        exec_id, offset, streams = message.get("exec_id"), message.get("offset", 0), message.get("offsets")
        if not isinstance(exec_id, str):
            raise SandboxRequestError("attach needs exec_id: the id 'started' gave", field="exec_id")
        if not _is_offset(offset):
            raise SandboxRequestError("offset: a whole number of bytes >= 0", field="offset")
        if streams is not None and not (
            isinstance(streams, dict)
            and set(streams) <= set(STREAM_IDS)
            and all(map(_is_offset, streams.values()))
        ):
            raise SandboxRequestError(
                'offsets: the next byte of each stream, e.g. {"stdout": 120, "stderr": 8}', field="offsets"
            )
        live = await self.sandbox_app.execs.find(exec_id, await self.caller(), self.session)
        self.live = live
        reply: dict[str, Any] = {
            "type": "attached",
            "exec_id": live.id,
            "offset": max(offset, live.start_offset),
        }
        if streams is not None:
            reply["offsets"] = live.resume_points(streams)
        await self._send(reply)
        self._tell_terminal(TERMINAL_OPEN, "attach")
        await live.attach(self, offset, streams)

    async def _stdin(self, data: bytes) -> None:
        if self.live is None:
            raise SandboxRequestError('send {"type": "start", ...} before stdin')
        self.touch()
        await self.live.write(data)

    # ------------------------------------------------------ the listener

    def send_output(self, stream_id: int, data: bytes) -> Awaitable[None]:
        """One output frame (the stream id, then the bytes); the awaitable is its flush."""
        self.touch()
        return write_output(self, stream_id, data)

    async def _send(self, message: dict[str, Any]) -> None:
        await self.write_message(json.dumps(message))

    async def send_final(self, message: dict[str, Any]) -> None:
        """The last message (exit, error or detached), then close."""
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(WebSocketClosedError, StreamClosedError):
            await self._send(message)
        if message.get("error") == "SandboxSessionGoneError":
            # the close says it too, for clients that read only the close frame (at most 123 bytes)
            self.close(SESSION_GONE_CLOSE, _close_reason(str(message.get("message", ""))))
        else:
            self.close(1000)

    def on_close(self) -> None:
        super().on_close()
        self._ended = True
        if self.live is not None:
            self.live.detach(self)
        if self._told_open:
            self._tell_terminal(TERMINAL_CLOSE, "close")

    _told_open = False

    def _tell_terminal(self, kind: str, how: str) -> None:
        """A terminal opened (a command started or attached to) or closed, told to the gate's listeners."""
        tell = getattr(self.session, "tell", None)  # a GatedSession's
        if tell is None or self.live is None:
            return
        self._told_open = kind == TERMINAL_OPEN
        caller = self._caller
        tell(kind, actor=caller.name if caller is not None else None, exec=self.live.id, how=how)


def _close_reason(text: str) -> str:
    """``text`` cut to a close frame's 123 bytes of UTF-8."""
    data = text.encode()
    if len(data) <= 123:
        return text
    return data[:120].decode(errors="ignore") + "..."


def _is_offset(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
