"""sandbox-remote: the sessions of another server running this extension, over its REST and websocket API.

The remote server is authoritative: its policy (isolation floor, egress ceiling,
limits, allowed images, quotas) applies to every spec this provider sends, and
its refusals come back as the same typed errors (SandboxSpecRejectedError,
SandboxQuotaError, SandboxNotFoundError, SandboxExecTimeoutError with its byte
counts and note...). The session's owner is the remote's principal for the
token: ``SessionSpec.owner`` is never sent, and a spec naming another owner is
refused (SandboxForbiddenError), never made as the token's user. Consumer labels go
under the token's own label on the remote (``user:NAME/<local label>``, the one form a
user who is not the remote's admin may name) and come back as they were. ``kind``, ``max_isolation``,
``networks`` and ``supports_limits`` are the remote's, read from its
``GET /api/sandbox/status`` at the first call and again at most every
``status_refresh_seconds`` (before that they admit everything; the remote decides).

Commands: every command, one-shot or interactive, runs over the remote's exec
websocket (:mod:`.exec`), so stdin and output stream both ways and no
body holds a one-shot's stdin whole. A one-shot is thus an interactive command on
the remote: when it ends, the remote releases its handle, which stops what the
command left in its process group (on a remote ``local`` provider too).
Files stream through ``files/{path}``; ``resolve`` asks the remote
(``GET .../resolve``): the contract makes it synchronous, so it is one blocking
request (lexical escapes are refused here without one).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import os
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

from traitlets import Bool, Float, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from ...client import SandboxClient
from ...contract import (
    ISOLATION_ORDER,
    NETWORK_ORDER,
    EgressPolicy,
    ExecHandle,
    ExecRequest,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxForbiddenError,
    SandboxIsolation,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxSession,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
    network_rank,
)
from ...labels import USER, is_under, kind_of, sub_label, user_label
from ...spool import DEFAULT_MEMORY_LIMIT
from .._common import ProviderMeta, run_to_end, workspace_relative
from .exec import RemoteCommand

__all__ = ["RemoteCommand", "RemoteSandbox", "RemoteSession"]

_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(SessionSpec))


def remote_consumer(own: str | None, consumer: str) -> str:
    """The consumer label the remote is asked for: the local label under the token's own label on the
    remote (``own``, e.g. ``user:alice``: ``user:alice/kernel:1``), the one form the remote lets a user
    who is not its admin name."""
    if own is None or is_under(consumer, own):
        return consumer
    return sub_label(own, consumer)


def local_consumer(own: str | None, consumer: str) -> str:
    """The local label of a remote consumer label (``remote_consumer`` undone)."""
    if own is not None and consumer.startswith(own + "/"):
        return consumer[len(own) + 1 :]
    return consumer


def session_info(
    data: Mapping[str, Any], env: Mapping[str, str] | None = None, own: str | None = None
) -> SessionInfo:
    """A SessionInfo from the remote's JSON (its listing shows env names only: ``env`` gives the values;
    the consumer label comes back without the ``own/`` prefix the remote keeps it under)."""
    try:
        spec_data = {k: v for k, v in dict(data.get("spec") or {}).items() if k in _SPEC_FIELDS}
        spec_data["env"] = dict(env or {})
        if isinstance(spec_data.get("egress"), Mapping):
            # the remote's secret grants are the remote's (its placeholders in env): this server grants none
            spec_data["egress"] = {**spec_data["egress"], "secrets": []}
        if isinstance(spec_data.get("consumer"), str):
            spec_data["consumer"] = local_consumer(own, spec_data["consumer"])
        return SessionInfo(
            id=str(data["id"]),
            kind=str(data["kind"]),
            spec=SessionSpec.from_json(spec_data),
            isolation=data["isolation"],
            workspace=str(data["workspace"]),
            created_at=float(data["created_at"]),
            expires_at=float(data["expires_at"]),
            paused=bool(data.get("paused")),
        )
    except (KeyError, TypeError, ValueError, SandboxError) as e:
        raise SandboxError(
            f"the remote sandbox server sent a session this provider cannot read: {e}"
        ) from None


class RemoteSession(SandboxSession):
    """A session of the remote server; every call goes to it."""

    def __init__(self, sandbox: RemoteSandbox, info: SessionInfo) -> None:
        self._sandbox = sandbox
        self._id = info.id
        self._info = info
        self._env = dict(info.spec.env)  # the values, when this provider made it (the remote shows names)

    @property
    def id(self) -> str:
        return self._id

    @property
    def _client(self) -> SandboxClient:
        return self._sandbox.client

    async def info(self) -> SessionInfo:
        self._info = session_info(await self._client.info(self._id), self._env, self._sandbox.own_consumer)
        return self._info

    async def usage(self) -> dict[str, Any]:
        return dict((await self._client.info(self._id, usage=True)).get("usage") or {})

    async def set_egress(self, policy: EgressPolicy) -> None:
        """The remote's PATCH: its own ceiling (its SandboxPolicy.egress_rules) applies too, refused as 400."""
        self._info = session_info(
            await self._client.set_egress(self._id, allow=policy.allow, deny=policy.deny),
            self._env,
            self._sandbox.own_consumer,
        )

    async def set_expiry(self, expires_at: float) -> SessionInfo:
        """The remote's PATCH: its own limits (its SandboxPolicy.max_ttl_seconds) apply, refused as 400."""
        ttl = expires_at - self._info.created_at
        self._info = session_info(
            await self._client.extend(self._id, ttl), self._env, self._sandbox.own_consumer
        )
        return self._info

    @property
    def pausable(self) -> bool:  # type: ignore[override]  # the remote's; SandboxSession has a plain attribute
        """As the remote's status says (an older remote says nothing: it decides, answering
        SandboxUnsupportedError where it cannot)."""
        return self._sandbox.pausable

    async def pause(self) -> SessionInfo:
        self._info = session_info(await self._client.pause(self._id), self._env, self._sandbox.own_consumer)
        return self._info

    async def resume(self) -> SessionInfo:
        self._info = session_info(await self._client.resume(self._id), self._env, self._sandbox.own_consumer)
        return self._info

    @property
    def forkable(self) -> bool:  # type: ignore[override]  # as pausable
        return self._sandbox.forkable

    async def fork(self) -> SandboxSession:
        data = await self._client.fork(self._id)
        return self._sandbox.session_class(
            self._sandbox, session_info(data, self._env, self._sandbox.own_consumer)
        )

    # ---------------------------------------------------------------- exec

    async def start(self, request: ExecRequest) -> ExecHandle:
        remote = await self._client.exec_start(
            self._id,
            request.argv,
            timeout_seconds=request.timeout_seconds,
            pty=request.pty,
            env=request.env,
            cwd=request.cwd,
            rows=request.rows,
            cols=request.cols,
        )
        return RemoteCommand(
            self._client, self._id, remote, pty=request.pty, memory_limit=self._sandbox.output_memory_bytes
        )

    async def run(self, request: ExecRequest) -> ExecResult:
        """A one-shot over the websocket: stdin streamed in frames while the output is taken in."""
        handle = await self.start(dataclasses.replace(request, stdin=None, output_limit=None))
        assert isinstance(handle, RemoteCommand)
        feeder = asyncio.ensure_future(self._feed(handle, request.stdin or b""))
        try:
            return await run_to_end(handle, request.output_limit)
        finally:
            if not feeder.done():
                feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    @staticmethod
    async def _feed(handle: RemoteCommand, data: bytes) -> None:
        """Write a one-shot's stdin, then EOF. A command that exits or closes its stdin first drops the
        rest; whether that is a failure is the remote's to say, in place of the exit item."""
        with contextlib.suppress(SandboxError):
            if data:
                await handle.write(data)
            await handle.close_stdin()

    # ---------------------------------------------------------------- files

    def _relative(self, path: str) -> str:
        """``path`` relative to the workspace; lexical escapes refused here, symlinks by the remote."""
        return workspace_relative(path, self._info.workspace)

    def resolve(self, path: str) -> str:
        """The remote's answer (one blocking request: the contract makes resolve synchronous)."""
        rel = self._relative(path)
        return self._client.resolve_blocking(
            self._id, rel or ".", timeout=self._sandbox.request_timeout_seconds
        )

    async def resolve_path(self, path: str) -> str:
        """The remote's answer, asked asynchronously."""
        return await self._client.resolve(self._id, self._relative(path) or ".")

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        rel = self._relative(path)
        if not rel:
            raise SandboxPathError(
                "put_file needs a file path inside the workspace, not the workspace itself"
            )
        await self._client.upload(self._id, rel, data)

    async def get_file(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.iter_file(path)])

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """The file as it arrives (a few pieces ahead of the reader at most)."""
        rel = self._relative(path)
        if not rel:
            raise SandboxPathError(
                "get_file needs a file path inside the workspace, not the workspace itself"
            )
        async for chunk in self._client.iter_download(self._id, rel):
            yield chunk

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        return await self._client.list_files(self._id, self._relative(path) or ".")

    async def remove_path(self, path: str) -> None:
        await self._client.remove(self._id, self._named(path))

    async def move_path(self, path: str, new_path: str) -> None:
        await self._client.move(self._id, self._named(path), self._named(new_path))

    async def make_folder(self, path: str) -> None:
        await self._client.make_folder(self._id, self._named(path))

    def _named(self, path: str) -> str:
        rel = self._relative(path)
        if not rel:
            raise SandboxPathError("name a path inside the workspace, not the workspace itself")
        return rel

    async def destroy(self, remove_workspace: bool = False) -> None:
        with contextlib.suppress(SandboxNotFoundError):  # gone already (destroyed, or reaped by the remote)
            await self._client.destroy(self._id, remove_workspace=remove_workspace)


class RemoteSandbox(LoggingConfigurable, Sandbox, metaclass=ProviderMeta):
    """sandbox-remote: the sessions of another server running jupyter_tai_sandbox, over its API."""

    kind = "remote"
    # until the remote's status is read: admit a policy, the remote decides
    egress_policy = True
    egress_refusal = "the remote sandbox server's provider cannot enforce an egress allow-list"
    # until the remote's status is read: admit everything, the remote decides
    max_isolation: SandboxIsolation = ISOLATION_ORDER[-1]
    networks = frozenset(NETWORK_ORDER)
    supports_limits = True
    pausable = True
    forkable = True
    session_class: type[RemoteSession] = RemoteSession

    url = Unicode(
        help="""Base URL of the remote Jupyter server running this extension, e.g.
        https://sandbox.example.org/ or a JupyterHub service's http://hub:8081/services/sandbox/
        (TAI_SANDBOX_REMOTE_URL). Required.""",
    ).tag(config=True)

    token = Unicode(
        help="""API token sent to the remote server (TAI_SANDBOX_REMOTE_TOKEN; else JUPYTERHUB_API_TOKEN
        when set, the user's hub token). The remote decides the sessions' owner from its principal.""",
    ).tag(config=True)

    token_file = Unicode(
        "",
        help="A file holding the token, read once when the provider starts (whitespace stripped); wins over token.",
    ).tag(config=True)

    ca_file = Unicode(
        "",
        help="PEM file of the CA certificates an https remote is verified against (default: the system's).",
    ).tag(config=True)

    client_cert = Unicode(
        "",
        help="PEM client certificate presented to an https remote that asks for one (mutual TLS).",
    ).tag(config=True)

    client_key = Unicode(
        "",
        help="PEM private key of client_cert, when it is not in the certificate file itself.",
    ).tag(config=True)

    validate_cert = Bool(
        True,
        help="Verify an https remote's certificate and host name. Turn off only for a test setup.",
    ).tag(config=True)

    request_timeout_seconds = Float(
        300.0,
        min=0.1,
        help="""Seconds one request to the remote may take, a file transfer whole; also the websocket's
        connect and resolve()'s blocking request. A command's own deadline is its timeout_seconds.""",
    ).tag(config=True)

    status_refresh_seconds = Float(
        30.0,
        help="How often (at most) the remote's status is read again for kind, max_isolation and networks.",
    ).tag(config=True)

    output_memory_bytes = Integer(
        DEFAULT_MEMORY_LIMIT,
        help="Bytes of a command's unread output kept in memory here before it spills to a temporary file.",
    ).tag(config=True)

    @default("url")
    def _url_default(self) -> str:
        return os.environ.get("TAI_SANDBOX_REMOTE_URL", "")

    @default("token")
    def _token_default(self) -> str:
        return os.environ.get("TAI_SANDBOX_REMOTE_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        url = self.url.strip()
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise SandboxUnavailableError(
                f"RemoteSandbox.url (TAI_SANDBOX_REMOTE_URL) must be the http(s) URL of a server running "
                f"jupyter_tai_sandbox, not {url!r}"
            )
        token = self.token
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise SandboxUnavailableError(f"cannot read RemoteSandbox.token_file: {e}") from None
        self.client = SandboxClient(
            url, token, request_timeout=self.request_timeout_seconds, ssl_context=self._tls()
        )
        self._status: dict[str, Any] | None = None
        self._status_at = 0.0
        self.principal: str | None = None
        self.own_consumer: str | None = None

    def _tls(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca_file or None)
            if self.client_cert:
                context.load_cert_chain(self.client_cert, self.client_key or None)
        except (OSError, ssl.SSLError) as e:
            raise SandboxUnavailableError(
                f"RemoteSandbox TLS settings (ca_file, client_cert, client_key): {e}"
            ) from None
        if not self.validate_cert:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    # -------------------------------------------------------------- status

    async def check_available(self) -> None:
        """The remote answers its status, asked now (the status route is the one caller: it is there to
        check): a service that is stopped or restarting is a typed 503 on this server's status route too, not
        a 200 from a cache that creates then fail."""
        await self.remote_status(refresh=True)

    async def remote_status(self, refresh: bool = False) -> dict[str, Any]:
        """The remote's status row; kind, max_isolation, networks and supports_limits follow it."""
        stale = time.monotonic() - self._status_at > self.status_refresh_seconds
        # a call the remote did not answer since: it is read again, so the status route says it is down
        stale = stale or self.client.unavailable_at > self._status_at
        if self._status is None or refresh or stale:
            status = await self.client.status()
            if status.get("kind") in (None, "off"):
                raise SandboxUnavailableError(
                    f"the remote sandbox server {self.client.url} has no provider: {status.get('message', '')}"
                )
            self._learn(status)
            self._status, self._status_at = status, time.monotonic()
        assert self._status is not None
        return self._status

    def _learn(self, status: Mapping[str, Any]) -> None:
        try:
            kind = str(status["kind"])
            isolation = status["max_isolation"]
            ceiling = (status.get("policy") or {}).get("egress", "egress")
            networks = frozenset(
                n
                for n in status["networks"]
                if n in NETWORK_ORDER and network_rank(n) <= network_rank(ceiling)
            )
            limits = bool(status["supports_limits"])
        except (KeyError, TypeError, ValueError) as e:
            raise SandboxUnavailableError(
                f"the remote's status cannot be read ({e!r}): is it this extension?"
            ) from None
        if isolation not in ISOLATION_ORDER:
            raise SandboxUnavailableError(f"the remote reports an unknown isolation {isolation!r}")
        self.kind, self.max_isolation, self.networks, self.supports_limits = kind, isolation, networks, limits
        self.pausable = bool(status.get("pausable", True))  # an older remote says nothing: it decides
        self.forkable = bool(status.get("forkable", True))
        # an older remote says nothing: it has no egress policy to enforce
        self.egress_policy = bool(status.get("egress_policy", False))
        principal = status.get("principal")
        #: who the token is to the remote (its sessions' owner)
        self.principal = principal if isinstance(principal, str) and principal else None
        own = status.get("consumer")
        #: the token's own consumer label on the remote (the prefix of the consumer labels sent)
        self.own_consumer = (
            own
            if kind_of(own) == USER
            else user_label(self.principal)
            if self.principal is not None
            else None
        )

    # ------------------------------------------------------------ sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        """The remote applies its policy and its provider's checks; a refusal comes back typed."""
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        await self.remote_status()
        if spec.owner is not None and self.principal is not None and spec.owner != self.principal:
            raise SandboxForbiddenError(
                f"the remote sandbox server makes this token's sessions as {self.principal!r}, not "
                f"{spec.owner!r}: a session for another user needs that user's own token "
                "(RemoteSandbox.token; in JupyterHub, the user's own server)"
            )
        body = {k: v for k, v in spec.to_json().items() if k != "owner"}  # the remote decides the owner
        body.pop("egress")
        if spec.egress is not None:
            if spec.egress.secrets:
                raise SandboxSpecRejectedError(
                    "the remote provider cannot carry this server's secrets (SandboxPolicy.secrets) to the remote "
                    "sandbox server: declare them on that server instead"
                )
            body["egress"] = {"allow": spec.egress.to_json()["allow"], "deny": list(spec.egress.deny)}
        body["consumer"] = remote_consumer(self.own_consumer, spec.consumer)
        try:
            data = await self.client.create(**body)
        except SandboxSpecRejectedError:
            await self.remote_status(refresh=True)  # its settings may have changed since
            raise
        return self.session_class(self, session_info(data, spec.env, self.own_consumer))

    async def get(self, session_id: str) -> SandboxSession:
        await self.remote_status()
        if not isinstance(session_id, str) or not session_id or "/" in session_id:
            raise SandboxNotFoundError(f"no remote sandbox session {session_id!r}")
        return self.session_class(
            self, session_info(await self.client.info(session_id), own=self.own_consumer)
        )

    async def list(self) -> list[SessionInfo]:
        await self.remote_status()
        return [session_info(data, own=self.own_consumer) for data in await self.client.sessions()]

    async def reap(self) -> builtins.list[str]:
        """Destroy the listed sessions past their TTL (persistent workspaces survive); their ids."""
        now = time.time()
        reaped = []
        for info in await self.list():
            if info.expires_at <= now:
                with contextlib.suppress(SandboxNotFoundError):  # the remote's reaper took it meanwhile
                    await self.client.destroy(info.id)
                reaped.append(info.id)
        if reaped:
            self.log.info("sandbox-remote: reaped %s", ", ".join(reaped))
        return reaped

    async def close(self) -> None:
        await self.client.aclose()
