"""An async Python client of the /api/sandbox REST and websocket API.

The server's typed errors come back as the same exception classes
(``SandboxNotFoundError``, ``SandboxExecTimeoutError`` with its byte counts, ...).

Finding the server: explicit ``url``/``token``, else ``discover_server`` (see ``discovery``).

Use it as an async context manager (or call ``await client.aclose()``)::

    async with SandboxClient() as client:
        info = await client.create(ttl_seconds=600, network="none")
        result = await client.exec(info["id"], ["echo", "hi"], timeout_seconds=30)
        await client.destroy(info["id"])

``destroy_blocking`` removes a session from code that has no event loop at hand
(an ``atexit`` hook, say).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import Any

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ..contract import (
    ExecResult,
    SandboxError,
    SandboxNotFoundError,
    SandboxUnavailableError,
)
from ..errors import error_from_json
from ..previews.urls import port_path
from .discovery import SeveralServersWarning, discover_server, running_servers
from .http_connections import BodyProducer, HTTPConnections, StreamingCallback
from .remote_exec import STDIN_FRAME_BYTES, RemoteExec, _written, read_frames_directly

#: dot segments travel percent-encoded, so nothing between here and the server resolves them
_DOT_SEGMENTS = {".": "%2E", "..": "%2E%2E"}
#: how long a cancelled exec_start waits for the server's answer to its start before it stops the command
_ABANDON_SECONDS = 10.0


def error_from_body(status: int, body: bytes) -> SandboxError:
    """The exception a JSON error body stands for. An answer that is not the API's (a proxy's or a hub's HTML
    page: the server is stopped, restarting or not routed) is the server's unavailability, said in plain
    words, never its page."""
    try:
        data = json.loads(body)
        message = data["message"]
        data["error"]
    except (ValueError, KeyError, TypeError):
        reason = http.client.responses.get(status, "")
        return SandboxUnavailableError(
            f"the sandbox API did not answer (HTTP {status}{f' {reason}' if reason else ''}, not its own "
            "error): its server is stopped, restarting or not reachable; try again shortly"
        )
    return error_from_json(data, fallback=f"HTTP {status}: {message}")


class SandboxClient:
    """REST and websocket calls to one server."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        request_timeout: float = 3600.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``ssl_context``: TLS settings for an https server (CA bundle, client certificate, verification)."""
        if url is None:
            url, found_token = discover_server()
            token = token if token is not None else found_token
        self.url = url.rstrip("/") + "/"
        self.token = token or ""
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self._http = HTTPConnections(self.url, ssl_context)
        self._http_loop: asyncio.AbstractEventLoop | None = None
        #: time.monotonic() of the last request the API did not answer (a SandboxUnavailableError), 0.0: none
        self.unavailable_at = 0.0

    # ---------------------------------------------------------------- plumbing

    def _url(self, *parts: str, params: Mapping[str, str] | None = None, scheme: str | None = None) -> str:
        # Concatenated, never urljoin'ed: a workspace path like "/etc/x" or "../x" must reach the
        # server as written (which refuses it), not be resolved away on this side.
        if len(parts) >= 2 and parts[-2] == "files":  # the last part is a workspace path
            parts = (*parts[:-1], *parts[-1].split("/"))
        path = "/".join(_DOT_SEGMENTS.get(seg, urllib.parse.quote(seg, safe="")) for seg in parts)
        url = self.url + "api/sandbox/" + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        if scheme == "ws":
            url = ("wss" if url.startswith("https:") else "ws") + url[url.index(":") :]
        return url

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    def _connections(self) -> HTTPConnections:
        # connections belong to the event loop that opened them
        loop = asyncio.get_running_loop()
        if loop is not self._http_loop:
            self._http.close()
            self._http_loop = loop
        return self._http

    async def _request(
        self,
        method: str,
        *parts: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        body_producer: BodyProducer | None = None,
        streaming_callback: StreamingCallback | None = None,
    ) -> Any:
        headers = self._headers()
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if body is None and method in ("POST", "PUT") and body_producer is None:
            body = b""
        url = self._url(*parts, params=params)
        try:
            return await self._answer(method, url, headers, body, body_producer, streaming_callback)
        except SandboxUnavailableError:
            self.unavailable_at = time.monotonic()
            raise

    async def _answer(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: Any,
        body_producer: BodyProducer | None,
        streaming_callback: StreamingCallback | None,
    ) -> Any:
        try:
            response = await self._connections().fetch(
                method,
                url[url.index("/", url.index("//") + 2) :],
                headers,
                body=body,
                body_producer=body_producer,
                streaming_callback=streaming_callback,
                timeout=self.request_timeout,
            )
        except TimeoutError:  # the builtin TimeoutError from 3.11 on
            raise SandboxUnavailableError(
                f"no answer from the sandbox API at {self.url} within {self.request_timeout:g} s"
            ) from None
        except OSError as e:
            raise SandboxUnavailableError(f"cannot reach the sandbox API at {self.url}: {e}") from None
        if response.code >= 400:
            raise error_from_body(response.code, response.body)
        if response.code == 204:
            return None
        if response.headers.get("Content-Type", "").startswith("application/json"):
            return json.loads(response.body)
        return response.body

    # ------------------------------------------------------------------- REST

    async def status(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request("GET", "status")
        return answer

    async def sessions(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = (await self._request("GET", "sessions"))["sessions"]
        return answer

    async def create(self, **spec: Any) -> dict[str, Any]:
        answer: dict[str, Any] = await self._request("POST", "sessions", body=spec)
        return answer

    async def info(self, session_id: str, *, usage: bool = False) -> dict[str, Any]:
        """The session; with ``usage`` also what it uses now (``usage``: CPU, memory, disk; costs a
        measurement on the server, so it is off unless asked for)."""
        answer: dict[str, Any] = await self._request(
            "GET", "sessions", session_id, params={"usage": "1" if usage else "0"}
        )
        return answer

    async def extend(self, session_id: str, ttl_seconds: float) -> dict[str, Any]:
        """Set the session's TTL to ``ttl_seconds`` counted from its creation (within the operator's
        maximum); the session's new info."""
        answer: dict[str, Any] = await self._request(
            "PATCH", "sessions", session_id, body={"ttl_seconds": ttl_seconds}
        )
        return answer

    async def set_egress(
        self, session_id: str, *, allow: Sequence[str] | None = None, deny: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Change the running session's egress policy (its new connections, within a second): ``allow`` the
        host names it may reach (None: the operator's rule's, or any name on ports 80 and 443), ``deny``
        those it may not; within the operator's ceiling (else 400 naming the entry). The session's new info."""
        body = {"egress": {"allow": None if allow is None else list(allow), "deny": list(deny)}}
        answer: dict[str, Any] = await self._request("PATCH", "sessions", session_id, body=body)
        return answer

    async def egress_audit(
        self,
        *,
        owner: str | None = None,
        session: str | None = None,
        since: float | str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """The egress gateways' audit lines kept in memory, oldest first (a user sees their own sessions')."""
        params = {
            k: str(v)
            for k, v in (("owner", owner), ("session", session), ("since", since), ("limit", limit))
            if v is not None
        }
        answer: dict[str, Any] = await self._request("GET", "egress", "audit", params=params)
        return list(answer["lines"])

    async def pause(self, session_id: str) -> dict[str, Any]:
        """Freeze every process of the session where it is (its info, ``paused`` true); exec and file calls
        then answer SandboxConflictError until :meth:`resume`. SandboxUnsupportedError where the provider
        cannot."""
        answer: dict[str, Any] = await self._request("POST", "sessions", session_id, "pause")
        return answer

    async def resume(self, session_id: str) -> dict[str, Any]:
        """Let a paused session run on from where it was (its info)."""
        answer: dict[str, Any] = await self._request("POST", "sessions", session_id, "resume")
        return answer

    async def fork(self, session_id: str) -> dict[str, Any]:
        """A new session of yours started from this one's state now (the new session's info); what the copy
        keeps is the provider's to say (vm: memory and processes). SandboxUnsupportedError where it cannot."""
        answer: dict[str, Any] = await self._request("POST", "sessions", session_id, "fork")
        return answer

    async def destroy(self, session_id: str, remove_workspace: bool = False) -> None:
        await self._request(
            "DELETE", "sessions", session_id, params={"remove_workspace": "1" if remove_workspace else "0"}
        )

    async def exec(
        self,
        session_id: str,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        body: dict[str, Any] = {"argv": list(argv), "timeout_seconds": timeout_seconds, "encoding": "base64"}
        if isinstance(stdin, str):
            stdin = stdin.encode()
        if stdin is not None:
            body["stdin_b64"] = base64.b64encode(stdin).decode()
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        data = await self._request("POST", "sessions", session_id, "exec", body=body)
        reason = data.get("reason")
        return ExecResult(
            data["exit_code"],
            base64.b64decode(data["stdout"]),
            base64.b64decode(data["stderr"]),
            reason if isinstance(reason, str) else None,
        )

    async def handoff(self, session_id: str, direction: str, path: str | None = None) -> dict[str, Any]:
        """The workspace handoff: ``direction="in"`` copies the contents folder (or file) ``path`` of the
        server's Jupyter into the session at the same relative path; ``"out"`` brings the session's changes
        under ``path`` (None: under everything handed in) back by the conflict rule (a file changed on both
        sides comes back beside Jupyter's as ``<stem>.sandbox<suffix>``). The result: ``copied``,
        ``unchanged``, ``conflicts``, ``skipped`` (each with why) and ``bytes``."""
        body: dict[str, Any] = {"direction": direction}
        if path is not None:
            body["path"] = path
        answer: dict[str, Any] = await self._request("POST", "sessions", session_id, "handoff", body=body)
        return answer

    async def list_files(self, session_id: str, path: str = "") -> list[dict[str, Any]]:
        """A folder's entries; a path that is a file is SandboxPathError (never its content)."""
        params = {"type": "directory"}
        answer: list[dict[str, Any]] = (
            await self._request("GET", "sessions", session_id, "files", path, params=params)
        )["entries"]
        return answer

    async def remove(self, session_id: str, path: str) -> None:
        """Delete a workspace file, or a folder with what it holds."""
        await self._request("DELETE", "sessions", session_id, "files", path)

    async def move(self, session_id: str, path: str, new_path: str) -> None:
        """Rename or move a workspace file or folder (the new path must not exist)."""
        await self._request("PATCH", "sessions", session_id, "files", path, body={"path": new_path})

    async def resolve(self, session_id: str, path: str) -> str:
        """The absolute path of a workspace path as the session's commands see it (SandboxPathError outside)."""
        answer: str = (await self._request("GET", "sessions", session_id, "resolve", params={"path": path}))[
            "resolved"
        ]
        return answer

    def resolve_blocking(self, session_id: str, path: str, timeout: float | None = None) -> str:
        """``resolve`` without an event loop: one plain blocking request (for a synchronous caller)."""
        url = self._url("sessions", session_id, "resolve", params={"path": path})
        request = urllib.request.Request(url, headers=self._headers())
        try:
            with urllib.request.urlopen(
                request, timeout=timeout or self.request_timeout, context=self._blocking_ssl()
            ) as response:
                answer: str = json.loads(response.read())["resolved"]
                return answer
        except urllib.error.HTTPError as e:
            raise error_from_body(e.code, e.read()) from None
        except OSError as e:
            raise SandboxUnavailableError(f"cannot reach the sandbox API at {self.url}: {e}") from None

    def _blocking_ssl(self) -> ssl.SSLContext | None:
        return self.ssl_context if self.url.startswith("https:") else None

    async def upload(self, session_id: str, path: str, data: bytes | AsyncIterable[bytes]) -> dict[str, Any]:
        """Upload ``data`` (bytes, or chunks streamed as they come) to a workspace path."""
        answer: dict[str, Any]
        if isinstance(data, (bytes, bytearray, memoryview)):
            answer = await self._request("PUT", "sessions", session_id, "files", path, body=bytes(data))
            return answer

        stop = asyncio.Event()

        async def unless_stopped(step: Any) -> Any:
            work, stopped = asyncio.ensure_future(step), asyncio.ensure_future(stop.wait())
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not work.done():
                work.cancel()
                raise SandboxError("the upload was cancelled")  # an error the HTTP client handles: it closes
            return work.result()

        async def produce(write: Any) -> None:
            chunks = aiter(data)
            while True:
                try:
                    chunk = await unless_stopped(anext(chunks))
                except StopAsyncIteration:
                    return
                await unless_stopped(write(chunk))

        try:
            answer = await self._request("PUT", "sessions", session_id, "files", path, body_producer=produce)
            return answer
        except asyncio.CancelledError:
            # the HTTP client runs the body producer on its own: a cancelled upload must stop sending (its
            # connection then closes, and the server drops the partial temp file) rather than go on unseen
            stop.set()
            raise

    async def make_folder(self, session_id: str, path: str) -> None:
        """Make a workspace folder (and its parents); an existing folder is fine."""
        await self._request("POST", "sessions", session_id, "files", path, body={"type": "directory"})

    async def download(self, session_id: str, path: str) -> bytes:
        answer: bytes = await self._request("GET", "sessions", session_id, "files", path)
        return answer

    async def iter_download(self, session_id: str, path: str, queue_chunks: int = 4) -> AsyncIterator[bytes]:
        """A workspace file's bytes as they arrive, never more than ``queue_chunks`` pieces ahead of
        the reader (the transfer waits for it). A folder is SandboxPathError, not its listing."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(queue_chunks)
        transfer = asyncio.ensure_future(
            self._request(
                "GET",
                "sessions",
                session_id,
                "files",
                path,
                params={"type": "file"},
                streaming_callback=queue.put,
            )
        )
        transfer.add_done_callback(lambda _: queue.put_nowait(None) if not queue.full() else None)
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, transfer}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    if not queue.empty():
                        continue  # the transfer ended with pieces still queued: hand them over first
                    await transfer  # raises the transfer's error, if any
                    return
                chunk = getter.result()
                if chunk is None:
                    await transfer
                    return
                yield chunk
        finally:
            if not transfer.done():
                transfer.cancel()  # the reader stopped early: drop the connection
                with contextlib.suppress(BaseException):
                    await transfer

    async def kill_exec(self, session_id: str, exec_id: str) -> bool:
        """Stop an interactive command by its exec id, beside its websocket (so a kill never waits behind
        stdin the server has not taken yet). True when killed, False when it had ended and was forgotten."""
        try:
            await self._request("DELETE", "sessions", session_id, "execs", exec_id)
        except SandboxNotFoundError:
            return False
        return True

    async def download_to(self, session_id: str, path: str, sink: Any) -> int:
        """Stream a workspace file into ``sink`` (anything with ``write(bytes)``); return its size."""
        size = 0

        def write(chunk: bytes) -> None:
            nonlocal size
            size += len(chunk)
            sink.write(chunk)

        await self._request("GET", "sessions", session_id, "files", path, streaming_callback=write)
        return size

    # -------------------------------------------------------------- websocket

    async def exec_start(
        self,
        session_id: str,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        pty: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        rows: int | None = None,
        cols: int | None = None,
    ) -> RemoteExec:
        connection = await self._exec_socket(session_id)
        start: dict[str, Any] = {
            "type": "start",
            "argv": list(argv),
            "timeout_seconds": timeout_seconds,
            "pty": pty,
        }
        if env:
            start["env"] = dict(env)
        if cwd is not None:
            start["cwd"] = cwd
        if rows is not None:
            start["rows"] = rows
        if cols is not None:
            start["cols"] = cols
        remote = RemoteExec(connection)
        sent = False
        try:
            flushed = connection.write_message(json.dumps(start))
            sent = True  # framed into the connection's buffer: it reaches the server
            await _written(flushed)
            await remote._wait_started()
        except BaseException:
            # a start that failed or was cancelled once its message left may still run: stop it, then go
            await asyncio.shield(asyncio.ensure_future(self._abandon(session_id, remote, sent)))
            raise
        return remote

    async def _abandon(self, session_id: str, remote: RemoteExec, sent: bool) -> None:
        """Stop the command of a start nobody will use (the server's answer is awaited, bounded), then close."""
        try:
            if sent and remote.exec_id is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(remote._wait_started(), _ABANDON_SECONDS)
            if remote.exec_id is not None:
                with contextlib.suppress(SandboxError):
                    await self.kill_exec(session_id, remote.exec_id)
        finally:
            remote.disconnect()

    async def attach(
        self,
        session_id: str,
        exec_id: str,
        offset: int = 0,
        offsets: dict[str, int] | None = None,
    ) -> RemoteExec:
        """Attach to a running interactive command (after a disconnect, a server restart, from another process...).

        The output replays what the server's ring still holds from ``offset`` (``RemoteExec.offset``
        says where it really starts), then goes live. ``offsets`` (a previous ``RemoteExec.offsets``: the
        next byte of each stream) resumes each stream exactly where it was, whatever order the two came in.
        """
        connection = await self._exec_socket(session_id)
        request: dict[str, Any] = {"type": "attach", "exec_id": exec_id, "offset": offset}
        if offsets is not None:
            request["offsets"] = offsets
        await connection.write_message(json.dumps(request))
        remote = RemoteExec(connection)
        await remote._wait_started()
        return remote

    async def execs(self, session_id: str) -> list[dict[str, Any]]:
        """The session's running interactive commands: id, argv, pty, started, owner, attached, offset."""
        answer: list[dict[str, Any]] = (await self._request("GET", "sessions", session_id, "execs"))["execs"]
        return answer

    async def listening_ports(self, session_id: str) -> list[dict[str, Any]]:
        """The TCP ports something listens on inside the session, sorted: ``port``, ``address`` (the bound
        address: 0.0.0.0, ::, 127.0.0.1, ...) and ``url`` (the preview's server-relative path; a full URL:
        :meth:`port_url`). A ``local`` session is refused (SandboxUnsupportedError): its ports are the
        host's."""
        answer: list[dict[str, Any]] = (await self._request("GET", "sessions", session_id, "ports"))["ports"]
        return answer

    async def transcript(self, session_id: str) -> dict[str, Any]:
        """The session's commands and their output as an nbformat 4 notebook (a dict: write it with
        ``json.dump`` or ``nbformat.from_dict``), scrubbed and unsigned (it opens untrusted). What the server
        kept: its commands since it started, bounded by TranscriptSettings; a session just destroyed is still
        answered for TranscriptSettings.keep_after_end_seconds."""
        body = await self._request("GET", "sessions", session_id, "transcript.ipynb")
        notebook: dict[str, Any] = json.loads(body)
        return notebook

    def port_url(self, session_id: str, port: int, path: str = "", absolute: bool = False) -> str:
        """The full URL of the web preview of ``port`` inside the session (``path`` inside the app;
        ``absolute``: the route whose app sees the full request path), on this client's server. It never
        carries the token: a browser opens it with its Jupyter login; a script passes the token in the
        ``Authorization`` header."""
        return self.url + port_path(session_id, port, path, absolute=absolute).lstrip("/")

    async def _exec_socket(self, session_id: str) -> WebSocketClientConnection:
        request = HTTPRequest(
            self._url("sessions", session_id, "exec", "ws", scheme="ws"),
            headers=self._headers(),
            ssl_options=self.ssl_context,
            connect_timeout=self.request_timeout,
            request_timeout=self.request_timeout,
        )
        try:
            connection = await websocket_connect(request, max_message_size=64 << 20)
        except HTTPClientError as e:
            if e.response is not None and e.response.body:
                raise error_from_body(e.code, e.response.body) from None
            raise SandboxError(f"the exec websocket was refused: HTTP {e.code}") from None
        except OSError as e:
            raise SandboxUnavailableError(f"cannot reach the sandbox API at {self.url}: {e}") from None
        read_frames_directly(connection)  # output frames: one recv_into each, not tornado's four copies
        return connection

    def destroy_blocking(self, session_id: str, remove_workspace: bool = False, timeout: float = 3.0) -> bool:
        """``destroy`` without an event loop (a plain blocking request): for ``atexit`` hooks and
        other code where the loop, or the executors the async client resolves names with, are gone.

        True when the server destroyed it, False when it was already gone; typed errors as ``destroy``.
        """
        url = self._url("sessions", session_id, params={"remove_workspace": "1" if remove_workspace else "0"})
        request = urllib.request.Request(url, method="DELETE", headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._blocking_ssl()):
                return True
        except urllib.error.HTTPError as e:
            error = error_from_body(e.code, e.read())
            if isinstance(error, SandboxNotFoundError):
                return False
            raise error from None
        except OSError as e:
            raise SandboxUnavailableError(f"cannot reach the sandbox API at {self.url}: {e}") from None

    def close(self) -> None:
        """Close the idle connections (a later call opens new ones). ``aclose`` is the async spelling."""
        self._http.close()

    async def aclose(self) -> None:
        """Close the idle connections; what ``async with SandboxClient(...)`` does on the way out."""
        self.close()

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


__all__ = [
    "STDIN_FRAME_BYTES",
    "RemoteExec",
    "SandboxClient",
    "SeveralServersWarning",
    "discover_server",
    "error_from_body",
    "running_servers",
]
