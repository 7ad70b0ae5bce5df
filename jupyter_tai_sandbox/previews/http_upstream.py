"""One HTTP/1.1 exchange with an app in a session, over its port connection, spoken with h11.

The request head goes out first, then its body a chunk at a time as the browser sends it; the response
head comes back, then its body a chunk at a time as the proxy asks for it (content-length, chunked or
close-delimited: h11 tells which). Nothing is held but the chunk in hand and h11's bounded head buffer;
every read and write waits at most the idle timeout. One exchange per connection: it is closed after.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

import h11

from ..contract import PortConnection
from ..errors import PreviewIdleTimeoutError, PreviewUpstreamError

__all__ = ["HEAD_LIMIT", "HttpUpstream", "UpstreamResponse"]

#: the most bytes a response head may take (h11's incomplete-event limit)
HEAD_LIMIT = 64 << 10

T = TypeVar("T")


class UpstreamResponse:
    """The app's response head: status, reason and headers (as latin-1 text, in order, repeats kept)."""

    def __init__(self, event: h11.Response) -> None:
        self.status = event.status_code
        self.reason = event.reason.decode("latin-1")
        self.headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers]


class HttpUpstream:
    """One request and its response over ``connection`` (see the module's docstring); ``where`` names the
    app in messages (``port 8000 of session sbx-...``)."""

    def __init__(self, connection: PortConnection, *, where: str, idle_timeout: float) -> None:
        self.connection = connection
        self.where = where
        self.idle_timeout = idle_timeout
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)
        self.bytes_in = 0

    async def _within(self, step: Awaitable[T], doing: str) -> T:
        try:
            return await asyncio.wait_for(step, self.idle_timeout if self.idle_timeout > 0 else None)
        except TimeoutError:
            raise PreviewIdleTimeoutError(
                f"the app on {self.where} was idle for {self.idle_timeout:g} s while {doing} "
                "(PreviewSettings.idle_timeout_seconds)"
            ) from None
        except (ConnectionError, OSError) as e:
            raise PreviewUpstreamError(
                f"the connection to the app on {self.where} broke while {doing}: {e}"
            ) from None

    async def _send(self, event: h11.Event, doing: str) -> None:
        try:
            data = self.h11.send(event)
        except h11.LocalProtocolError as e:
            raise PreviewUpstreamError(
                f"the request cannot be passed to the app on {self.where}: {e}"
            ) from None
        if data:
            await self._within(self.connection.write(data), doing)

    async def send_head(self, method: str, target: str, headers: Sequence[tuple[str, str]]) -> None:
        await self._send(
            h11.Request(
                method=method.encode("latin-1"),
                target=target.encode("latin-1"),
                headers=[(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers],
            ),
            "sending the request",
        )

    async def send_body(self, chunk: bytes) -> None:
        if chunk:
            await self._send(h11.Data(data=chunk), "sending the request body")

    async def end_body(self) -> None:
        if self.h11.our_state is h11.SEND_BODY:
            await self._send(h11.EndOfMessage(), "sending the request body")

    async def _next_event(self, doing: str) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as e:
                raise PreviewUpstreamError(
                    f"the app on {self.where} answered {doing} with no valid HTTP/1.1: {e}"
                ) from None
            if event is not h11.NEED_DATA:
                return event
            data = await self._within(self.connection.read(), doing)
            self.bytes_in += len(data or b"")
            self.h11.receive_data(data or b"")

    async def response(self) -> UpstreamResponse:
        """The response head (informational 1xx ones skipped); 502 when the app closed or broke first."""
        while True:
            event = await self._next_event("the request")
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                return UpstreamResponse(event)
            raise PreviewUpstreamError(f"the app on {self.where} closed the connection without an answer")

    async def body(self) -> AsyncIterator[bytes]:
        """The response body's chunks as they come; ends at its end. PreviewUpstreamError when it breaks off
        (the proxy then cuts its own response short)."""
        while True:
            event = await self._next_event("the response body")
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            else:
                raise PreviewUpstreamError(f"the app on {self.where} ended its response before its end")

    async def close(self) -> None:
        await self.connection.close()
