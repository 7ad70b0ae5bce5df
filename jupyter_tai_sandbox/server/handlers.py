"""REST handlers under /api/sandbox: thin, they parse, authorize, call the seam and map errors."""

from __future__ import annotations

import asyncio
import base64
import codecs
import dataclasses
import json
import posixpath
from collections.abc import AsyncIterator
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.escape import url_escape

from ..contract import (
    EgressPolicy,
    ExecRequest,
    SandboxError,
    SandboxForbiddenError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxRequestError,
    SandboxSession,
    SandboxUnavailableError,
    SessionSpec,
)
from ..egress_audit import MEMORY_LINES
from ..errors import UploadTooLargeError
from ..events import ADMIN
from ..gate import GatedSession
from .handler_base import AUTH_RESOURCE, JSONErrorsMixin, SandboxHandlerMixin, parse_json_object

_DOWNLOAD_CHUNK = 1 << 20
#: a one-shot's output is answered in slices of this many bytes (a multiple of 3: see _write_output)
_RESPONSE_SLICE = 3 << 18
_SMALL_BODY = 64 << 10
_UPLOAD_QUEUE_CHUNKS = 8
_ENCODINGS = ("utf-8", "base64")


class SandboxAPIHandler(JSONErrorsMixin, SandboxHandlerMixin, APIHandler):
    """Base of the REST handlers: JSON errors, the caller, body parsing, session lookup by owner."""

    auth_resource = AUTH_RESOURCE

    def read_json(self) -> dict[str, Any]:
        return parse_json_object(self.request.body)

    async def get_session(self, session_id: str, *, manage: bool = False) -> SandboxSession:
        """The caller's session; another user's answers 404 like an unknown one (one this server saw go: a 404
        saying why, reaped at its TTL or destroyed)."""
        caller = await self.caller()
        try:
            session = await self.sessions.get(session_id, caller, manage=manage)
        except SandboxNotFoundError as e:
            gone = self.sandbox_app.execs.gone(session_id, caller)
            if gone is None:
                raise
            raise gone from e
        if caller.sees_all and isinstance(session, GatedSession):
            owner = getattr(session.spec_known(), "owner", None)
            if owner is not None and owner != caller.name:  # an admin acting on another's session
                session.tell(ADMIN, actor=caller.name, action=f"{self.request.method} {self.request.path}")
        return session

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))


class StatusHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        access = self.sandbox_app.access  # this server's own sandbox, not the process slot
        caller = await self.caller()
        status = access.status_info(show_credentials=caller.sees_all)  # adopts a plugin's provider when off
        if access.failure is not None:
            raise SandboxUnavailableError(access.failure)
        if access.gate is not None:
            await access.gate.check_available()  # an engine that cannot be reached: 503 saying so
        self.write_json({**status, "principal": caller.name, "consumer": caller.consumer})


class SessionsHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        infos = await self.sessions.list(await self.caller())
        self.write_json({"sessions": [info.to_json() for info in infos]})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        caller = await self.caller()
        spec = SessionSpec.from_json(self.read_json(), request=True)
        session = await self.sessions.create(spec, caller)
        self.touch()
        self.set_header("Location", self.request.path.rstrip("/") + "/" + session.id)
        self.write_json((await session.info()).to_json(), status=201)


class SessionHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, session_id: str) -> None:
        session = await self.get_session(session_id)
        if self.get_argument("usage", "1").lower() in ("0", "false", "no"):
            self.write_json((await session.info()).to_json())
            return
        info, usage = await asyncio.gather(session.info(), session.usage(), return_exceptions=True)
        if isinstance(info, BaseException):
            raise info
        if isinstance(usage, SandboxNotFoundError):
            raise usage
        if isinstance(usage, BaseException):
            if not isinstance(usage, SandboxError):
                raise usage
            usage = {"note": f"usage could not be measured: {usage}"}
        self.write_json({**info.to_json(), "usage": usage})

    @web.authenticated
    @authorized
    async def patch(self, session_id: str) -> None:
        """``{"ttl_seconds": N}``: the session now ends N seconds after its creation; ``{"egress": {"allow":
        [...] | null, "deny": [...]}}``: its egress policy changes (the gated session narrows it within the
        operator's rule). Both may be given: the egress first."""
        data = self.read_json()
        unknown = sorted(set(data) - {"ttl_seconds", "egress"})
        if unknown or not data:
            raise SandboxRequestError(
                f"unknown field(s): {', '.join(unknown)}; known: ttl_seconds, egress"
                if unknown
                else "give ttl_seconds, egress or both",
                field=unknown[0] if unknown else "ttl_seconds",
            )
        egress = None
        if "egress" in data:
            egress = EgressPolicy.from_json(
                data.pop("egress"), secrets=False
            )  # entries checked before the lookup
        session = await self.get_session(session_id, manage=True)
        changed = None
        if egress is not None:
            changed = await gated(session).change_egress(allow=egress.allow, deny=egress.deny)
        info = await self.sessions.set_ttl(session, data) if data else changed
        assert info is not None
        if changed is not None:  # the policy in force, whether the provider's info shows it yet or not
            info = dataclasses.replace(info, spec=info.spec.replace(egress=changed.spec.egress))
        self.touch()
        self.write_json(info.to_json())

    @web.authenticated
    @authorized
    async def delete(self, session_id: str) -> None:
        remove = self.get_argument("remove_workspace", "0").lower() in ("1", "true", "yes")
        session = await self.get_session(session_id, manage=True)
        execs = self.sandbox_app.execs
        execs.mark_gone(
            session.id, "destroyed", by=(await self.caller()).name
        )  # before: its commands end as it goes
        try:
            await self.sessions.destroy(session, remove_workspace=remove)
        except BaseException:
            execs.unmark_gone(session.id)
            raise
        await execs.end_session(session.id, "destroyed")
        self.set_status(204)
        self.finish()


class SessionStateHandler(SandboxAPIHandler):
    """``POST .../pause`` and ``.../resume``: freeze a session's processes, or let them run on."""

    @web.authenticated
    @authorized
    async def post(self, session_id: str, action: str) -> None:
        session = await self.get_session(session_id, manage=True)
        info = await (session.pause() if action == "pause" else session.resume())
        self.touch()
        self.write_json(info.to_json())


class ForkHandler(SandboxAPIHandler):
    """``POST .../fork``: a new session of the caller's, started from this one's state now."""

    @web.authenticated
    @authorized
    async def post(self, session_id: str) -> None:
        caller = await self.caller()
        source = await self.get_session(session_id, manage=True)
        fork = await self.sessions.fork(source, caller)
        self.touch()
        self.set_header("Location", self.request.path.rsplit("/", 2)[0] + "/" + fork.id)
        self.write_json((await fork.info()).to_json(), status=201)


class ExecHandler(SandboxAPIHandler):
    """One-shot exec; the answer is streamed, so the output is held once (as the gate gave it).

    The session applies the exec-time policy (timeout ceiling, output limit, scrub): this only
    parses the request and encodes the result.
    """

    @web.authenticated
    @authorized(action="execute")
    async def post(self, session_id: str) -> None:
        data = self.read_json()
        encoding = data.get("encoding", "utf-8")
        if encoding not in _ENCODINGS:
            raise SandboxRequestError(
                "encoding: 'utf-8' (text, invalid bytes replaced) or 'base64' (exact bytes)", field="encoding"
            )
        request = ExecRequest.from_json(data, ignore=frozenset({"encoding"}))
        session = await self.get_session(session_id, manage=True)
        self.touch()
        result = await session.run(request)
        self.touch()
        self.set_header("Content-Type", "application/json")
        if len(result.stdout) + len(result.stderr) <= _RESPONSE_SLICE:
            # the usual small answer: one body, one write
            out, err = (_encoded(data, encoding) for data in (result.stdout, result.stderr))
            answer = {"exit_code": result.exit_code, "encoding": encoding, "stdout": out, "stderr": err}
            if result.reason is not None:
                answer["reason"] = result.reason
            self.finish(json.dumps(answer))
            return
        reason = "" if result.reason is None else f'"reason": {json.dumps(result.reason)}, '
        self.write(f'{{"exit_code": {result.exit_code}, {reason}"encoding": "{encoding}", "stdout": "')
        await self._write_output(result.stdout, encoding)
        self.write('", "stderr": "')
        await self._write_output(result.stderr, encoding)
        self.finish('"}')

    async def _write_output(self, data: bytes, encoding: str) -> None:
        """One output stream as the inside of a JSON string, in bounded slices (a multiple of 3 bytes,
        so base64 slices join into one base64 text)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for start in range(0, len(data), _RESPONSE_SLICE):
            piece = data[start : start + _RESPONSE_SLICE]
            if encoding == "base64":
                self.write(base64.b64encode(piece))
            else:
                self.write(
                    json.dumps(decoder.decode(piece, final=start + _RESPONSE_SLICE >= len(data)))[1:-1]
                )
            await self.flush()


def _encoded(data: bytes, encoding: str) -> str:
    return base64.b64encode(data).decode() if encoding == "base64" else data.decode(errors="replace")


class ExecsHandler(SandboxAPIHandler):
    """The session's live commands, websocket and MCP ones (the caller's own; all of them for an admin)."""

    @web.authenticated
    @authorized
    async def get(self, session_id: str) -> None:
        session = await self.get_session(session_id)
        caller = await self.caller()
        self.write_json({"execs": await self.sandbox_app.execs.listed(session, caller)})


class LiveExecHandler(SandboxAPIHandler):
    """DELETE kills one live command beside its websocket (or MCP poller), which still gets the output and the exit.

    A kill sent on the websocket waits behind the stdin frames the server has not taken in yet
    (a command that does not read its stdin holds them); this one does not.
    """

    @web.authenticated
    @authorized(action="execute")
    async def delete(self, session_id: str, exec_id: str) -> None:
        session = await self.get_session(session_id, manage=True)
        live = await self.sandbox_app.execs.find(exec_id, await self.caller(), session)
        await live.handle.kill()
        self.touch()
        self.set_status(204)
        self.finish()


class ResolveHandler(SandboxAPIHandler):
    """``?path=P``: P's absolute path as the session's commands see it; outside the workspace is 400."""

    @web.authenticated
    @authorized
    async def get(self, session_id: str) -> None:
        path = self.get_argument("path", None)
        if not path:
            raise SandboxRequestError("path: a workspace path, e.g. ?path=data/input.csv", field="path")
        session = await self.get_session(session_id)
        # the provider's own bounded path (its engine's workers, within the caller's share)
        self.write_json({"path": path, "resolved": await session.resolve_path(path)})


@web.stream_request_body
class FileHandler(SandboxAPIHandler):
    """GET downloads a file (streamed) or lists a folder; PUT uploads a file (streamed)."""

    _upload: asyncio.Task[None] | None = None
    _rejected: SandboxError | None = None

    @property
    def max_upload_bytes(self) -> int:
        return self.sandbox_app.max_upload_bytes

    async def prepare(self) -> None:  # type: ignore[override]  # APIHandler's, which drops JupyterHandler's keyword
        await super().prepare()
        if self.request.method == "PUT":
            # a streamed body arrives before put() runs: the upload is admitted, by the same decorators, first
            await self._admit_upload()  # type: ignore[misc]  # tornado types @authenticated's result Optional

    @web.authenticated
    @authorized
    async def _admit_upload(self) -> None:
        limit = self.max_upload_bytes
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise UploadTooLargeError(
                f"the upload is {length} bytes; the limit is {limit} (SandboxApp.max_upload_bytes)"
            )
        self.request.connection.set_max_body_size(limit + (1 << 20))  # type: ignore[union-attr]  # an HTTP1Connection
        path = self.path_kwargs.get("path") or ""
        if not path or path.endswith("/"):
            raise SandboxPathError("PUT needs a file path inside the workspace, e.g. files/data/input.csv")
        session = await self.get_session(self.path_kwargs["session_id"], manage=True)
        self.touch()
        # refuse a bad path before the body streams in (on the provider's own bounded path)
        await session.resolve_path(path)
        self._received = 0
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue(_UPLOAD_QUEUE_CHUNKS)
        self._upload = asyncio.create_task(session.put_file(path, self._body()))

    async def _body(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            yield chunk

    async def data_received(self, chunk: bytes) -> None:
        if self.request.method in ("POST", "PATCH"):
            # a small JSON body (the new path, the kind of entry), kept whole
            self._small_body = getattr(self, "_small_body", b"") + chunk
            if len(self._small_body) > _SMALL_BODY:
                raise SandboxRequestError("the request body is too large for a file operation")
            return
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

    @web.authenticated
    @authorized
    async def delete(self, session_id: str, path: str | None = None) -> None:
        """Delete a file, or a folder with what it holds."""
        session = await self.get_session(session_id, manage=True)
        await session.remove_path(_named(path))
        self.touch()
        self.set_status(204)
        self.finish()

    @web.authenticated
    @authorized
    async def patch(self, session_id: str, path: str | None = None) -> None:
        """Rename or move: ``{"path": "new/path"}``; the new path must not exist (409)."""
        body = parse_json_object(getattr(self, "_small_body", b""))
        new_path = body.get("path")
        if not isinstance(new_path, str) or not new_path:
            raise SandboxRequestError("path: the new workspace path, a non-empty string", field="path")
        session = await self.get_session(session_id, manage=True)
        await session.move_path(_named(path), new_path)
        self.touch()
        self.write_json({"path": new_path})

    @web.authenticated
    @authorized
    async def post(self, session_id: str, path: str | None = None) -> None:
        """Make a folder (and its parents): ``{"type": "directory"}``."""
        body = parse_json_object(getattr(self, "_small_body", b""))
        if body.get("type") != "directory":
            raise SandboxRequestError('type: "directory" (files are made with PUT)', field="type")
        session = await self.get_session(session_id, manage=True)
        await session.make_folder(_named(path))
        self.touch()
        self.write_json({"path": path, "type": "directory"}, status=201)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if self.request.method == "PUT" and not (self._upload is not None and self._upload.done()):
            # the body was refused unread: the connection cannot carry another request, say so
            self.set_header("Connection", "close")
        super().write_error(status_code, **kwargs)

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
        self.touch()
        self.write_json({"path": path, "size": self._received}, status=201)

    @web.authenticated
    @authorized
    async def get(self, session_id: str, path: str | None = None) -> None:
        kind = self.get_argument("type", "")
        if kind not in ("", "file", "directory"):
            raise SandboxRequestError(
                "type: 'file' (the bytes only) or 'directory' (the listing only)", field="type"
            )
        session = await self.get_session(session_id)
        self.touch()
        path = path or "."
        entries = None
        if kind == "directory":
            entries = await session.list_files(path)
        elif kind == "":
            try:
                entries = await session.list_files(path)
            except SandboxNotFoundError:
                pass
            except SandboxPathError:
                if path.endswith("/") or path == ".":
                    raise
        if entries is not None:
            self.write_json({"path": path, "entries": entries})
            return
        chunks = session.iter_file(path, _DOWNLOAD_CHUNK)
        first = await anext(chunks, b"")  # errors surface here, before any header is sent
        name = posixpath.basename(path.rstrip("/")) or "download"
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Disposition", f"attachment; filename*=UTF-8''{url_escape(name, plus=False)}")
        self.write(first)
        await self.flush()
        async for chunk in chunks:
            self.write(chunk)
            await self.flush()
        self.touch()
        self.finish()


class EgressAuditHandler(SandboxAPIHandler):
    """``GET egress/audit?owner=&session=&since=&limit=``: the egress gateways' audit lines kept in memory
    (the operator's file, SandboxPolicy.egress_audit_path, keeps them all). An admin (read on
    jupyter_tai_sandbox:admin) sees every user's; a user their own sessions' only."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        caller = await self.caller()
        owner = self.get_argument("owner", None) or None
        if not caller.sees_all:
            if owner is not None and owner != caller.name:
                raise SandboxForbiddenError(
                    "another user's egress audit needs read on jupyter_tai_sandbox:admin; leave owner unset "
                    "for your own"
                )
            owner = caller.name
        raw_limit = self.get_argument("limit", "1000")
        if not raw_limit.isdigit() or not 0 < int(raw_limit) <= MEMORY_LINES:
            raise SandboxRequestError(f"limit: a whole number from 1 to {MEMORY_LINES}", field="limit")
        since = self.get_argument("since", None) or None
        try:
            lines = self.policy.egress_audit.query(
                owner=owner,
                session=self.get_argument("session", None) or None,
                since=since,
                limit=int(raw_limit),
            )
        except ValueError as e:
            raise SandboxRequestError(str(e), field="since") from None
        self.write_json({"lines": lines})


def gated(session: SandboxSession) -> GatedSession:
    """The session as the registry hands it out: behind the gate (where a live egress change is decided)."""
    if not isinstance(session, GatedSession):  # pragma: no cover - the registry only hands out gated sessions
        raise SandboxUnavailableError("the session is not behind the policy gate")
    return session


def _named(path: str | None) -> str:
    if not path or not path.strip("/"):
        raise SandboxPathError("name a file or folder inside the workspace, e.g. files/data/old.csv")
    return path


SESSION_ID = r"(?P<session_id>[^/]+)"

rest_handlers = [
    (r"/api/sandbox/status", StatusHandler),
    (r"/api/sandbox/sessions", SessionsHandler),
    (r"/api/sandbox/egress/audit", EgressAuditHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}", SessionHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/(?P<action>pause|resume)", SessionStateHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/fork", ForkHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/exec", ExecHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/execs", ExecsHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/execs/(?P<exec_id>[^/]+)", LiveExecHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/resolve", ResolveHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/files(?:/(?P<path>.*))?", FileHandler),
]
