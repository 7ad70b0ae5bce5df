"""A websocket client to an app inside a session, over the session's port connection (wsproto, sans-IO).

The preview route's websocket half (:mod:`.ws_relay`) speaks to the app with this: the opening handshake
carries the browser's path, query and subprotocols and the Host and X-Forwarded-* headers the route sets
(never the browser's Cookie or Authorization, nor its Origin: the route checked the Origin itself);
then whole messages, text or binary, go both ways. Pings from the app are answered here; close frames
carry their code and reason.

Memory stays bounded: a message from the app is gathered up to ``max_message_bytes`` (then
:class:`MessageTooBigError`, and the relay closes both sides with 1009), and nothing is read from the
app while the caller has not taken the last message (so a browser that stops reading stops the app's
writes, through TCP). Every write is awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from ..contract import PortConnection

__all__ = ["Closed", "MessageTooBigError", "UpstreamHandshakeError", "UpstreamWebSocket"]

#: most bytes of a refusal's body kept for the error message
_REJECT_BODY_KEPT = 512
#: headers the client sets itself, or that must never reach the app
_NOT_FORWARDED = frozenset(
    {
        "host",
        "cookie",
        "authorization",
        "origin",
        "connection",
        "upgrade",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-protocol",
        "sec-websocket-extensions",
        "sec-websocket-accept",
        "content-length",
        "transfer-encoding",
    }
)
#: close codes that are never sent in a frame (RFC 6455 7.4.1): passed on as a close without a code
LOCAL_ONLY_CODES = frozenset({1005, 1006, 1015})


class UpstreamHandshakeError(ConnectionError):
    """The app did not accept the websocket: ``status`` is its HTTP status (0: it closed or spoke no HTTP)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class MessageTooBigError(ConnectionError):
    """A message from the app over the frame size limit."""


@dataclass(frozen=True)
class Closed:
    """The app closed the websocket (or its connection ended): its close code (None: none given) and reason."""

    code: int | None
    reason: str = ""
    clean: bool = True


class UpstreamWebSocket:
    """One websocket to an app, over ``connection`` (which it owns and closes)."""

    def __init__(self, connection: PortConnection, max_message_bytes: int) -> None:
        self._conn = connection
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._max = max_message_bytes
        self._events: deque[Event] = deque()
        self._write_lock = asyncio.Lock()
        self._eof = False
        self._closed: Closed | None = None
        self.subprotocol: str | None = None

    # ------------------------------------------------------------ opening

    @classmethod
    async def connect(
        cls,
        connection: PortConnection,
        *,
        host: str,
        target: str,
        subprotocols: Sequence[str] = (),
        headers: Sequence[tuple[str, str]] = (),
        max_message_bytes: int,
        timeout: float,
        app_cookie: str = "",
    ) -> UpstreamWebSocket:
        """The opening handshake to ``target`` (path and query) with ``Host: host``; UpstreamHandshakeError
        when the app answers anything but 101, TimeoutError past ``timeout``. Closes ``connection`` on
        failure. ``app_cookie``: the app's own cookies (a per-session preview origin's, never Jupyter's), sent
        as its Cookie header."""
        upstream = cls(connection, max_message_bytes)
        if app_cookie:
            headers = [*(h for h in headers if h[0].lower() != "cookie"), ("Cookie", app_cookie)]
        try:
            await asyncio.wait_for(
                upstream._handshake(host, target, subprotocols, headers, cookie=bool(app_cookie)), timeout
            )
        except BaseException:
            await connection.close()
            raise
        return upstream

    async def _handshake(
        self,
        host: str,
        target: str,
        subprotocols: Sequence[str],
        headers: Sequence[tuple[str, str]],
        cookie: bool = False,
    ) -> None:
        extra = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in headers
            if name.lower() not in _NOT_FORWARDED or (cookie and name.lower() == "cookie")
        ]
        request = Request(
            host=host, target=target or "/", subprotocols=list(subprotocols), extra_headers=extra
        )
        await self._write(self._ws.send(request))
        status, body = 0, bytearray()
        while True:
            event = await self._next_event()
            if event is None:
                raise UpstreamHandshakeError(
                    f"the app answered HTTP {status} to the websocket upgrade: {bytes(body).decode(errors='replace')}"
                    if status
                    else "the app closed the connection during the websocket handshake",
                    status,
                )
            if isinstance(event, AcceptConnection):
                self.subprotocol = event.subprotocol
                return
            if isinstance(event, RejectConnection):
                status = event.status_code
                if not event.has_body:
                    raise UpstreamHandshakeError(
                        f"the app answered HTTP {status} to the websocket upgrade", status
                    )
            elif isinstance(event, RejectData):
                if len(body) < _REJECT_BODY_KEPT:
                    body += event.data[: _REJECT_BODY_KEPT - len(body)]
                if event.body_finished:
                    raise UpstreamHandshakeError(
                        f"the app answered HTTP {status} to the websocket upgrade: "
                        f"{bytes(body).decode(errors='replace').strip()}",
                        status,
                    )

    # ------------------------------------------------------------ messages

    async def receive(self) -> str | bytes | Closed:
        """The app's next whole message, or :class:`Closed` once it closed (then always that).

        Answers the app's pings; MessageTooBigError for a message over the limit (the caller closes).
        """
        if self._closed is not None:
            return self._closed
        parts: list[str | bytes] = []
        size = 0
        while True:
            event = await self._next_event()
            if event is None:
                self._closed = Closed(None, "the app's connection ended without a close frame", clean=False)
                return self._closed
            if isinstance(event, Ping):
                await self._send_event(event.response())
            elif isinstance(event, CloseConnection):
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    with contextlib.suppress(OSError, LocalProtocolError):
                        await self._send_event(event.response())
                self._closed = Closed(event.code, event.reason or "")
                with contextlib.suppress(OSError):
                    await self._conn.close_write()
                return self._closed
            elif isinstance(event, Message):
                data = event.data
                size += len(data) if isinstance(data, bytes) else len(data.encode())
                if size > self._max:
                    raise MessageTooBigError(f"a message from the app is over {self._max} bytes")
                parts.append(data)
                if event.message_finished:
                    if isinstance(event, TextMessage):
                        return "".join(part for part in parts if isinstance(part, str))
                    return b"".join(part for part in parts if isinstance(part, bytes))

    async def send(self, message: str | bytes) -> None:
        """One whole message to the app (text for str, binary for bytes); waits while the app does not read."""
        event: Event = BytesMessage(data=message) if isinstance(message, bytes) else TextMessage(data=message)
        if self._ws.state is not ConnectionState.OPEN:
            return  # a close is under way (the app's or ours): what crosses it is dropped, as a socket would
        with contextlib.suppress(LocalProtocolError):  # the state changed while the lock was waited for
            await self._send_event(event)

    async def ping(self, payload: bytes = b"") -> None:
        await self._send_event(Ping(payload=payload))

    async def send_close(self, code: int | None = 1000, reason: str = "") -> None:
        """Send a close frame if the websocket is still open (a local-only or missing code: 1000); the app's
        answer comes from :meth:`receive` as :class:`Closed`. Never raises."""
        with contextlib.suppress(OSError, LocalProtocolError, asyncio.TimeoutError):
            if self._ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                if code is None or code in LOCAL_ONLY_CODES:
                    code, reason = 1000, ""
                await asyncio.wait_for(self._send_event(CloseConnection(code=code, reason=reason or None)), 5)

    async def close(self, code: int | None = 1000, reason: str = "") -> None:
        """:meth:`send_close`, then end the connection. Never raises."""
        await self.send_close(code, reason)
        await self._conn.close()

    async def aclose(self) -> None:
        """End the connection without a close frame. Never raises."""
        await self._conn.close()

    # ------------------------------------------------------------ the wire

    async def _send_event(self, event: Event) -> None:
        async with self._write_lock:
            await self._write(self._ws.send(event))

    async def _write(self, data: bytes) -> None:
        if data:
            await self._conn.write(data)

    async def _next_event(self) -> Event | None:
        """The next protocol event, reading the connection when none is pending; None at its end."""
        while not self._events:
            if self._eof:
                return None
            data = await self._conn.read()
            if data is None:
                self._eof = True
            try:
                self._ws.receive_data(data)
                self._events.extend(self._ws.events())
            except RemoteProtocolError as e:
                raise ConnectionResetError(f"the app broke the websocket protocol: {e}") from None
        return self._events.popleft()
