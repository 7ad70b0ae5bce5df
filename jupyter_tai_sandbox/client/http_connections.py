"""HTTP/1.1 requests to one server over kept-alive connections.

tornado's simple client opens a TCP connection (and resolves the host on a
thread) for every request; a client making many small calls, as the magics and
the sandbox_exec tool do, pays for that each time. This keeps finished
connections open and reuses them, on tornado's own ``HTTP1Connection``. Request
and response bodies can be streamed, with no size cap on a streamed body.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.iostream import IOStream, StreamClosedError
from tornado.tcpclient import TCPClient

#: a response held in memory (not streamed) may be this large
MAX_BUFFERED_BODY = 1 << 30
#: connections kept open while idle
MAX_IDLE = 8

BodyProducer = Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]
#: takes each piece of a streamed response body; one returning an awaitable is awaited (backpressure)
StreamingCallback = Callable[[bytes], "Awaitable[None] | None"]


@dataclass
class Response:
    code: int
    reason: str
    headers: httputil.HTTPHeaders
    body: bytes = b""


@dataclass
class _Reader(httputil.HTTPMessageDelegate):
    on_chunk: StreamingCallback | None
    response: Response | None = None
    chunks: list[bytes] = field(default_factory=list)
    closed_early: bool = False

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        assert isinstance(start_line, httputil.ResponseStartLine)
        self.response = Response(start_line.code, start_line.reason, headers)

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self.on_chunk is not None and self.response is not None and self.response.code < 300:
            ret = self.on_chunk(chunk)
            # tornado awaits what data_received returns before it reads on
            return ret if inspect.isawaitable(ret) else None
        self.chunks.append(chunk)
        return None

    def finish(self) -> None:
        if self.response is not None:
            self.response.body = b"".join(self.chunks)

    def on_connection_close(self) -> None:
        self.closed_early = True


def _still_open(stream: IOStream) -> bool:
    """An idle connection the server has not closed (it may close one at any time)."""
    if stream.closed():
        return False
    try:
        return stream.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True  # nothing to read: still open
    except (OSError, AttributeError):
        return False


class HTTPConnections:
    """Requests to the server at ``url`` (its scheme, host and port), reusing idle connections."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext | None = None) -> None:
        """``ssl_context``: the TLS settings of an https URL (default: the system's CA bundle, verified)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._netloc = parts.netloc.rpartition("@")[2]
        self._ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self._tcp = TCPClient()
        self._idle: list[IOStream] = []

    async def _stream(self) -> tuple[IOStream, bool]:
        """A connection: an idle one if any is still open (True), else a new one (False)."""
        while self._idle:
            stream = self._idle.pop()
            if _still_open(stream):
                return stream, True
            stream.close()
        stream = await self._tcp.connect(self.host, self.port, ssl_options=self._ssl)
        stream.set_nodelay(True)
        return stream, False

    def _keep(self, stream: IOStream) -> None:
        if len(self._idle) < MAX_IDLE and not stream.closed():
            self._idle.append(stream)
        else:
            stream.close()

    async def fetch(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        *,
        body: bytes | None = None,
        body_producer: BodyProducer | None = None,
        streaming_callback: StreamingCallback | None = None,
        timeout: float | None = None,
    ) -> Response:
        """One request (``target``: path and query). A streamed response body goes to
        ``streaming_callback`` when the status is 2xx; otherwise it is returned whole.
        Raises OSError (StreamClosedError included) or TimeoutError when no answer comes."""
        # the server may close an idle connection as a request leaves on it: an idempotent
        # request with its whole body at hand is sent again, once, on a new connection
        retry = body_producer is None and method in ("GET", "HEAD", "PUT", "DELETE")
        while True:
            stream, reused = await self._stream()
            exchange = self._exchange(
                stream, method, target, headers, body, body_producer, streaming_callback
            )
            try:
                return await asyncio.wait_for(exchange, timeout)
            except StreamClosedError:
                if not (reused and retry):
                    raise
                retry = False

    async def _exchange(
        self,
        stream: IOStream,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        body_producer: BodyProducer | None,
        streaming_callback: StreamingCallback | None,
    ) -> Response:
        max_body = (1 << 62) if streaming_callback is not None else MAX_BUFFERED_BODY
        connection = HTTP1Connection(
            stream,
            True,
            HTTP1ConnectionParameters(decompress=True, max_body_size=max_body, chunk_size=1 << 20),
        )
        request_headers = httputil.HTTPHeaders(headers)
        request_headers.setdefault("Host", self._netloc)
        if body is not None:
            request_headers["Content-Length"] = str(len(body))
        kept = False
        try:
            await connection.write_headers(
                httputil.RequestStartLine(method, target, "HTTP/1.1"), request_headers
            )
            if body:
                await connection.write(body)
            elif body_producer is not None:
                await body_producer(connection.write)
            connection.finish()
            reader = _Reader(streaming_callback)
            open_after = await connection.read_response(reader)
            if reader.response is None or reader.closed_early:
                raise StreamClosedError()
            kept = open_after and reader.response.headers.get("Connection", "").lower() != "close"
            return reader.response
        finally:
            if kept:
                connection.detach()
                self._keep(stream)
            else:
                stream.close()

    def close(self) -> None:
        for stream in self._idle:
            with contextlib.suppress(Exception):
                stream.close()
        self._idle.clear()
