"""The preview route's websocket half: a browser's websocket relayed to the app's, message by message.

The seam with the route's handler (``server/preview_handlers.py``, ``PortProxyHandler``): the handler
inherits :class:`WebSocketRelayMixin` (before jupyter_server's APIHandler) and, once a request with
``Upgrade: websocket`` went through what every preview request goes through (jupyter_server's auth, the
Authorizer, the owner rules: another user's session 404, a gone one 410, as JSON and before any upgrade;
the connection counts held), its ``get`` hands it over::

    await self.relay_websocket(session=session, port=port, target=target, headers=headers,
                               settings=settings, release=release)

``target`` is what the app sees (its path and query: prefix stripped or not, ``token`` removed),
``headers`` the Host and X-Forwarded-* the route sets (default: the handler's ``forwarded_headers()``;
anything named Cookie, Authorization, Origin or a handshake header is dropped here anyway), ``settings``
the limits (default: its ``preview_settings``), ``release`` gives the connection counts back: called once,
when the websocket ends or its opening fails (the handler's ``on_finish`` runs at the 101, so it leaves a
websocket's counts to this). :attr:`WebSocketRelayMixin.relaying` is True from the 101 on.

Then, before the upgrade: the websocket auth rule (no user: 403, as ``ws_authenticated``) and the
websocket Origin rule (jupyter_server's WebSocketMixin.check_origin: same host, or the server's
allow_origin/allow_origin_pat), the app's websocket opened over ``session.open_port(port)`` with the
browser's subprotocols (nothing listening or a refused handshake: 502 PreviewUpstreamError; no answer
within the idle timeout: 504), and only then the browser's 101, with the subprotocol the app chose.

Afterwards messages go both ways, text and binary, one at a time, each write awaited (tornado does not
read the browser's next frame before :meth:`on_message` returns; the app is not read while the browser
has not taken the last message): a stalled side stops the other through TCP, and the server holds at most
a message each way (PreviewSettings.max_ws_frame_bytes, 1009 beyond). A close passes through with its
code and reason either way; no message either way for PreviewSettings.idle_timeout_seconds closes both
(1001).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from ..errors import PreviewIdleTimeoutError, PreviewUpstreamError
from .ws_upstream import (
    LOCAL_ONLY_CODES,
    Closed,
    MessageTooBigError,
    UpstreamHandshakeError,
    UpstreamWebSocket,
)

if TYPE_CHECKING:
    from ..contract import SandboxSession
    from .settings import PreviewSettings

__all__ = ["PreviewWebSocketMixin", "WebSocketRelayMixin"]

#: the close code of a websocket closed for want of traffic (going away)
IDLE_CLOSE = 1001
#: the close code when the app's connection broke without a close frame
UPSTREAM_BROKE_CLOSE = 1011
#: the close code of a message over the size limit
TOO_BIG_CLOSE = 1009
#: how long the app's answer to a close is awaited before its connection is cut
CLOSE_WAIT_SECONDS = 5.0


def _reason(text: str) -> str:
    """``text`` cut to a close frame's 123 bytes of UTF-8."""
    data = text.encode()
    return text if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


class WebSocketRelayMixin(WebSocketHandler):
    """The websocket half of the preview route's handler (see the module's docstring)."""

    _ws_upstream: UpstreamWebSocket | None = None
    _ws_settings: PreviewSettings | None = None
    _ws_pump: asyncio.Task[None] | None = None
    _ws_idle: asyncio.Task[None] | None = None
    _ws_closing: asyncio.Future[None] | None = None
    _ws_last_activity = 0.0
    _ws_where = ""
    #: the websocket is open (from the 101 on): the handler's on_finish then must not give back its counts
    relaying = False

    if TYPE_CHECKING:
        log: logging.Logger  # JupyterHandler's, in the handler this is mixed into

    # ------------------------------------------------------------ the handler's side

    def is_websocket_upgrade(self) -> bool:
        """The request asks for a websocket (a GET with ``Upgrade: websocket``)."""
        return self.request.method == "GET" and self.request.headers.get("Upgrade", "").lower() == "websocket"

    def check_origin(self, origin: str | None = None) -> bool:
        """For a websocket, jupyter_server's websocket Origin rule; for any other request, its API rule."""
        if self.is_websocket_upgrade():
            return bool(cast(Any, WebSocketMixin).check_origin(self, origin))
        return bool(JupyterHandler.check_origin(cast(Any, self)))

    @property
    def max_message_size(self) -> int:
        settings = self._ws_settings
        if settings is None or settings.max_ws_frame_bytes <= 0:
            return super().max_message_size
        return int(settings.max_ws_frame_bytes)

    def get_compression_options(self) -> dict[str, Any] | None:
        return None  # messages pass as they are; compressing them again is the app's and the browser's call

    async def relay_websocket(
        self,
        session: SandboxSession,
        port: int,
        target: str,
        headers: Sequence[tuple[str, str]] | None = None,
        settings: PreviewSettings | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Relay this request's websocket to the app on ``port`` in ``session`` until either side closes
        (see the module's docstring for the arguments)."""
        handler: Any = self
        try:
            if headers is None:
                headers = list(handler.forwarded_headers())
            if settings is None:
                settings = cast("PreviewSettings", handler.preview_settings)
            if self.current_user is None:  # ws_authenticated's rule: no redirect, a refusal
                self.log.warning("Couldn't authenticate WebSocket connection")
                raise web.HTTPError(403)
            if not self.check_origin():
                raise web.HTTPError(403, "cross-origin websockets are not allowed")
            self._ws_settings = settings
            self._ws_where = f"port {port} of session {session.id}"
            self._ws_upstream = await self._open_upstream(session, port, target, headers, settings)
            self._ws_last_activity = time.monotonic()
            # the 101, then open() and the browser's frames until the socket ends
            self.relaying = True
            await WebSocketHandler.get(self, *self.path_args, **self.path_kwargs)
        finally:
            try:
                await self._end_relay()
            finally:
                if release is not None:
                    release()

    async def _open_upstream(
        self,
        session: SandboxSession,
        port: int,
        target: str,
        headers: Sequence[tuple[str, str]],
        settings: PreviewSettings,
    ) -> UpstreamWebSocket:
        where = self._ws_where
        offered = self.request.headers.get("Sec-WebSocket-Protocol", "")
        subprotocols = [s.strip() for s in offered.split(",") if s.strip()]
        host = next((value for name, value in headers if name.lower() == "host"), f"127.0.0.1:{port}")
        timeout = settings.idle_timeout_seconds if settings.idle_timeout_seconds > 0 else None
        try:
            connection = await asyncio.wait_for(session.open_port(port), timeout)
            return await UpstreamWebSocket.connect(
                connection,
                host=host,
                target=target,
                subprotocols=subprotocols,
                headers=headers,
                max_message_bytes=self.max_message_size,
                timeout=timeout or 3600.0,
                # a per-session preview origin's handler passes the app's own cookies (never Jupyter's)
                app_cookie=(
                    next((value for name, value in headers if name.lower() == "cookie"), "")
                    if getattr(self, "forwards_app_cookies", False)
                    else ""
                ),
            )
        except TimeoutError:
            raise PreviewIdleTimeoutError(
                f"the app on {where} did not answer the websocket upgrade within "
                f"{settings.idle_timeout_seconds:g} s (PreviewSettings.idle_timeout_seconds)"
            ) from None
        except ConnectionRefusedError:
            raise PreviewUpstreamError(f"nothing listens on {where}") from None
        except UpstreamHandshakeError as e:
            raise PreviewUpstreamError(f"the app on {where} refused the websocket: {e}") from None
        except (ConnectionError, OSError) as e:
            raise PreviewUpstreamError(f"the connection to the app on {where} broke: {e}") from None

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        """The subprotocol the app chose (one the browser offered), or none."""
        chosen = self._ws_upstream.subprotocol if self._ws_upstream is not None else None
        return chosen if chosen in subprotocols else None

    # ------------------------------------------------------------ the relay

    def open(self, *args: Any, **kwargs: Any) -> None:
        self._ws_pump = asyncio.ensure_future(self._pump_upstream())
        settings = self._ws_settings
        if settings is not None and settings.idle_timeout_seconds > 0:
            self._ws_idle = asyncio.ensure_future(self._watch_idle(float(settings.idle_timeout_seconds)))

    async def on_message(self, message: str | bytes) -> None:
        """A browser's message to the app; the browser's next frame is read once the app took this one."""
        upstream = self._ws_upstream
        if upstream is None:
            return
        self._ws_last_activity = time.monotonic()
        try:
            await upstream.send(message)
        except (ConnectionError, OSError) as e:
            self.log.info("preview websocket to %s: the app's connection broke: %s", self._ws_where, e)
            self.close(UPSTREAM_BROKE_CLOSE, "the app's connection broke")
        self._ws_last_activity = time.monotonic()

    def on_ws_connection_close(self, close_code: int | None = None, close_reason: str | None = None) -> None:
        """The browser's socket ended: the relay's side of it first (a handler's on_connection_close that
        does not call super would skip tornado's), then tornado's and the handler's."""
        self.close_code, self.close_reason = close_code, close_reason
        connection = self.ws_connection
        if connection is not None:
            connection.on_connection_close()
            self.ws_connection = None
        self._browser_closed()
        self.on_connection_close()

    def on_close(self) -> None:
        self._browser_closed()

    def _browser_closed(self) -> None:
        """The browser closed (or went): the app gets its close code and reason (once)."""
        upstream = self._ws_upstream
        if upstream is None or self._ws_closing is not None:
            return
        if self._ws_idle is not None:
            self._ws_idle.cancel()
        code = self.close_code
        self._ws_closing = asyncio.ensure_future(
            upstream.send_close(None if code in LOCAL_ONLY_CODES else code, self.close_reason or "")
        )

    async def _pump_upstream(self) -> None:
        """The app's messages to the browser, one at a time, each write flushed before the next read."""
        upstream = self._ws_upstream
        assert upstream is not None
        try:
            while True:
                try:
                    message = await upstream.receive()
                except MessageTooBigError as e:
                    await upstream.send_close(TOO_BIG_CLOSE, "message too big")
                    self.close(TOO_BIG_CLOSE, _reason(str(e)))
                    return
                except (ConnectionError, OSError) as e:
                    self.log.info("preview websocket to %s: %s", self._ws_where, e)
                    self.close(UPSTREAM_BROKE_CLOSE, _reason(f"the app's connection broke: {e}"))
                    return
                if isinstance(message, Closed):
                    if message.clean:
                        code = None if message.code in LOCAL_ONLY_CODES else message.code
                        self.close(code, _reason(message.reason) if code is not None else None)
                    else:
                        self.close(UPSTREAM_BROKE_CLOSE, _reason(message.reason))
                    return
                self._ws_last_activity = time.monotonic()
                await self.write_message(message, binary=isinstance(message, bytes))
                self._ws_last_activity = time.monotonic()
        except (WebSocketClosedError, StreamClosedError):
            return  # the browser went: on_close closes the app's side

    async def _watch_idle(self, idle: float) -> None:
        while True:
            left = self._ws_last_activity + idle - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(left)
        self.log.info("preview websocket to %s: idle for %g s, closed", self._ws_where, idle)
        reason = f"idle for {idle:g} s (PreviewSettings.idle_timeout_seconds)"
        if self._ws_upstream is not None:
            await self._ws_upstream.send_close(IDLE_CLOSE, reason)
        self.close(IDLE_CLOSE, _reason(reason))

    async def _end_relay(self) -> None:
        """After the socket ended (or never opened): the app's close answer awaited a moment, its connection
        closed, the tasks done."""
        if self._ws_idle is not None:
            self._ws_idle.cancel()
        upstream = self._ws_upstream
        if upstream is None:
            return
        if self._ws_closing is not None:
            await self._ws_closing
        else:
            await upstream.send_close(self.close_code, self.close_reason or "")
        pump = self._ws_pump
        if pump is not None and not pump.done():
            # the app's close answer (or the end of its connection): then the pump ends by itself
            await asyncio.wait({pump}, timeout=CLOSE_WAIT_SECONDS)
        await upstream.aclose()
        for task in (self._ws_idle, pump):
            if task is not None and not task.done():
                task.cancel()
            if task is not None:
                with contextlib.suppress(BaseException):
                    await task


#: the same class, by the name the route's docstring first gave it
PreviewWebSocketMixin = WebSocketRelayMixin
