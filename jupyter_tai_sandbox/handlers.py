"""REST handlers under /api/sandbox: thin, they parse, authorize, call the seam and map errors."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import posixpath
from collections.abc import AsyncIterator
from http.client import responses
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.escape import url_escape

from . import sandboxes
from .contract import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxSession,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionSpec,
)

AUTH_RESOURCE = "jupyter_tai_sandbox:sessions"
_DOWNLOAD_CHUNK = 1 << 20
_UPLOAD_QUEUE_CHUNKS = 8
_EXEC_FIELDS = {"argv", "timeout_seconds", "stdin", "stdin_b64", "env", "cwd", "encoding"}


class UploadTooLargeError(SandboxError):
    """An upload larger than SandboxApp.max_upload_bytes."""


def error_status(error: BaseException | None, fallback: int = 500) -> int:
    """The HTTP status of an error: the one place where errors become status codes."""
    if isinstance(error, web.HTTPError):
        return error.status_code
    declared = getattr(error, "http_status", None)  # e.g. the tools' 403/409/422 errors
    if isinstance(error, SandboxError) and isinstance(declared, int):
        return declared
    for kind, status in (
        (SandboxUnavailableError, 503),
        (SandboxSpecRejectedError, 400),
        (SandboxPathError, 400),
        (SandboxNotFoundError, 404),
        (SandboxExecTimeoutError, 504),
        (UploadTooLargeError, 413),
        (SandboxError, 500),
    ):
        if isinstance(error, kind):
            return status
    return fallback


def error_body(error: BaseException | None, status: int) -> dict[str, Any]:
    """``{"error": "<ErrorClass>", "message": "..."}`` (+ byte counts for a timeout)."""
    if isinstance(error, SandboxError):
        body: dict[str, Any] = {"error": type(error).__name__, "message": str(error)}
        if isinstance(error, SandboxExecTimeoutError):
            body.update(stdout_bytes=error.stdout_bytes, stderr_bytes=error.stderr_bytes, note=error.note)
        body.update(getattr(error, "details", None) or {})  # e.g. {"field": ...} of a tool input error
        return body
    if isinstance(error, web.HTTPError):
        message = error.log_message % error.args if error.log_message else (error.reason or "")
        return {"error": "HTTPError", "message": message or responses.get(status, "error")}
    return {"error": "InternalError", "message": responses.get(status, "Internal Server Error")}


def bad_request(message: str) -> SandboxSpecRejectedError:
    return SandboxSpecRejectedError(message)


class JSONErrorsMixin:
    """Errors answered as ``{"error": ..., "message": ...}`` with their status; expected ones logged briefly."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        status = error_status(error, status_code)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error_body(error, status)))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, SandboxError) and error_status(value) < 500:
            self.log.info("%s %s: %s: %s", self.request.method, self.request.path, typ.__name__, value)
        else:
            super().log_exception(typ, value, tb)


class SandboxAPIHandler(JSONErrorsMixin, ExtensionHandlerMixin, APIHandler):
    """Base of the REST handlers: JSON errors, body parsing, session lookup."""

    auth_resource = AUTH_RESOURCE

    @property
    def registry(self) -> Any:
        return self.settings["tai_sandbox_registry"]

    @property
    def policy(self) -> Any:
        return self.settings["tai_sandbox_policy"]

    def read_json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.body or b"{}")
        except UnicodeDecodeError:
            raise bad_request("the request body is not UTF-8") from None
        except ValueError as e:
            raise bad_request(f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise bad_request("the request body must be a JSON object")
        return data

    async def get_session(self, session_id: str) -> SandboxSession:
        return await sandboxes.require_sandbox().get(session_id)

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))


class StatusHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.write_json(sandboxes.status_info())


class SessionsHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        infos = await sandboxes.require_sandbox().list()
        self.write_json({"sessions": [info.to_json() for info in infos]})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        data = self.read_json()
        data.setdefault("consumer", self.current_user.username)
        session = await self.registry.create(SessionSpec.from_json(data))
        self.set_header("Location", self.request.path.rstrip("/") + "/" + session.id)
        self.write_json((await session.info()).to_json(), status=201)


class SessionHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, session_id: str) -> None:
        session = await self.get_session(session_id)
        self.write_json((await session.info()).to_json())

    @web.authenticated
    @authorized
    async def delete(self, session_id: str) -> None:
        remove = self.get_argument("remove_workspace", "0").lower() in ("1", "true", "yes")
        session = await self.get_session(session_id)
        await session.destroy(remove_workspace=remove)
        self.registry.forget(session_id)
        self.set_status(204)
        self.finish()


def _parse_exec(data: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(data) - _EXEC_FIELDS)
    if unknown:
        raise bad_request(
            f"unknown exec field(s): {', '.join(unknown)}; known: {', '.join(sorted(_EXEC_FIELDS))}"
        )
    argv = data.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise bad_request('argv must be a non-empty list of strings, e.g. ["sh", "-c", "echo hi"]')
    timeout = data.get("timeout_seconds")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise bad_request("timeout_seconds is required: a positive number of seconds")
    if "stdin" in data and "stdin_b64" in data:
        raise bad_request("give stdin (text) or stdin_b64 (base64 bytes), not both")
    stdin: bytes | None = None
    if data.get("stdin") is not None:
        if not isinstance(data["stdin"], str):
            raise bad_request("stdin must be a string (use stdin_b64 for bytes)")
        stdin = data["stdin"].encode()
    elif data.get("stdin_b64") is not None:
        try:
            stdin = base64.b64decode(data["stdin_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise bad_request("stdin_b64 is not valid base64") from None
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise bad_request("env must be an object of string values")
    cwd = data.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise bad_request("cwd must be a workspace path string")
    encoding = data.get("encoding", "utf-8")
    if encoding not in ("utf-8", "base64"):
        raise bad_request("encoding must be 'utf-8' (text, invalid bytes replaced) or 'base64' (exact bytes)")
    return {
        "argv": argv,
        "timeout_seconds": float(timeout),
        "stdin": stdin,
        "env": env,
        "cwd": cwd,
        "encoding": encoding,
    }


class ExecHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, session_id: str) -> None:
        request = _parse_exec(self.read_json())
        encoding = request.pop("encoding")
        session = await self.get_session(session_id)
        result = await session.exec(request.pop("argv"), **request)
        if encoding == "base64":
            out = base64.b64encode(self.policy.scrub_bytes(result.stdout)).decode()
            err = base64.b64encode(self.policy.scrub_bytes(result.stderr)).decode()
        else:
            out = self.policy.scrub(result.stdout.decode(errors="replace"))
            err = self.policy.scrub(result.stderr.decode(errors="replace"))
        self.write_json({"exit_code": result.exit_code, "stdout": out, "stderr": err, "encoding": encoding})


@web.stream_request_body
class FileHandler(SandboxAPIHandler):
    """GET downloads a file (streamed) or lists a folder; PUT uploads a file (streamed)."""

    _upload: asyncio.Task[None] | None = None
    _rejected: SandboxError | None = None

    @property
    def max_upload_bytes(self) -> int:
        return self.settings["tai_sandbox_app"].max_upload_bytes

    async def prepare(self) -> None:
        await super().prepare()
        if self.request.method != "PUT":
            return
        # A streamed body arrives before put() runs: authorize and check everything first.
        if self.current_user is None:
            raise web.HTTPError(403)
        if not await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "write", AUTH_RESOURCE)
        ):
            raise web.HTTPError(403, "not allowed to upload into sandbox sessions")
        limit = self.max_upload_bytes
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise UploadTooLargeError(
                f"the upload is {length} bytes; the limit is {limit} (SandboxApp.max_upload_bytes)"
            )
        self.request.connection.set_max_body_size(limit + (1 << 20))
        path = self.path_kwargs.get("path") or ""
        if not path or path.endswith("/"):
            raise SandboxPathError("PUT needs a file path inside the workspace, e.g. files/data/input.csv")
        session = await self.get_session(self.path_kwargs["session_id"])
        # refuse a bad path before the body streams in; resolve() may ask the engine (blocking)
        await asyncio.to_thread(session.resolve, path)
        self._received = 0
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue(_UPLOAD_QUEUE_CHUNKS)
        self._upload = asyncio.create_task(session.put_file(path, self._body()))

    async def _body(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            yield chunk

    async def data_received(self, chunk: bytes) -> None:
        if self._upload is None or self._rejected is not None:
            return
        self._received += len(chunk)
        if self._received > self.max_upload_bytes:
            self._rejected = UploadTooLargeError(
                f"the upload exceeds the limit of {self.max_upload_bytes} bytes (SandboxApp.max_upload_bytes)"
            )
            self._upload.cancel()
            return
        queued = asyncio.ensure_future(self._chunks.put(chunk))
        await asyncio.wait({queued, self._upload}, return_when=asyncio.FIRST_COMPLETED)
        if not queued.done():
            queued.cancel()

    def on_connection_close(self) -> None:
        if self._upload is not None and not self._upload.done():
            self._upload.cancel()
        super().on_connection_close()

    @web.authenticated
    @authorized
    async def put(self, session_id: str, path: str | None = None) -> None:
        assert self._upload is not None
        if self._rejected is not None:
            raise self._rejected
        if not self._upload.done():
            await self._chunks.put(None)
        await self._upload
        self.write_json({"path": path, "size": self._received}, status=201)

    @web.authenticated
    @authorized
    async def get(self, session_id: str, path: str | None = None) -> None:
        session = await self.get_session(session_id)
        path = path or "."
        try:
            entries = await session.list_files(path)
        except SandboxNotFoundError:
            entries = None
        except SandboxPathError:
            if path.endswith("/") or path == ".":
                raise
            entries = None
        if entries is not None:
            self.write_json({"path": path, "entries": entries})
            return
        chunks = session.iter_file(path, _DOWNLOAD_CHUNK)
        first = await anext(chunks, b"")  # errors surface here, before any header is sent
        name = posixpath.basename(path.rstrip("/")) or "download"
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header(
            "Content-Disposition", f"attachment; filename*=UTF-8''{url_escape(name, plus=False)}"
        )
        self.write(first)
        await self.flush()
        async for chunk in chunks:
            self.write(chunk)
            await self.flush()
        self.finish()


SESSION_ID = r"(?P<session_id>[^/]+)"

rest_handlers = [
    (r"/api/sandbox/status", StatusHandler),
    (r"/api/sandbox/sessions", SessionsHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}", SessionHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/exec", ExecHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/files(?:/(?P<path>.*))?", FileHandler),
]
