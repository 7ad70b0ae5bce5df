"""A container session on the session agent: exec and files of one container, engine-neutral.

Every command, transfer and path look-up goes through the session's one agent connection
(:class:`AgentChannel`); the engine is asked only about the container itself (is it there,
tear it down). A provider makes sessions with a :class:`ContainerSite`, what all of its
sessions share.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import socket
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ...agent import AgentClient, AgentCommand, AgentError
from ...agent.netns import NotReachableHere
from ...contract import (
    ExecHandle,
    ExecRequest,
    ExecResult,
    HeldCommand,
    PortConnection,
    SandboxConflictError,
    SandboxError,
    SandboxIsolation,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxSession,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
    session_gone,
)
from .._common import run_to_end
from .channel import AgentChannel
from .command import KILL_LIMIT_SECONDS, ContainerCommand, in_background
from .files import WorkspaceFiles
from .ports import AgentPort, SocketPort
from .users import resolve_user

#: A pty command's TERM.
PTY_TERM = "xterm-256color"
#: the workspace of a container session
WORKSPACE = "/workspace"
#: the environment of a command when the container's is unknown
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: how long the synchronous resolve() may take
RESOLVE_LIMIT_SECONDS = 10.0
#: the containers a site remembers users and channels of before it forgets (all users; the idle channels)
MAX_KNOWN_CONTAINERS = 4096
#: the most of /etc/passwd or /etc/group read to find a session user
USER_FILE_LIMIT = 1 << 20


class _Abandonable(Protocol):
    def abandon(self) -> None: ...


C = TypeVar("C", bound=_Abandonable)
T = TypeVar("T")
S = TypeVar("S", bound="ContainerSession")


class CommandRegistry(Generic[C]):
    """The live commands of a provider's sessions, by session id (a session may have several handles)."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[C]] = {}

    def add(self, session_id: str, command: C) -> None:
        self._by_session.setdefault(session_id, set()).add(command)

    def discard(self, session_id: str, command: C) -> None:
        self._by_session.get(session_id, set()).discard(command)

    def abandon(self, session_id: str) -> None:
        """The session is gone: its commands stop taking output in."""
        for command in self._by_session.pop(session_id, set()):
            command.abandon()

    def all(self) -> list[C]:
        return [c for group in self._by_session.values() for c in group]


@dataclass(frozen=True)
class ContainerSite:
    """What every session of one container provider shares."""

    kind: str
    isolation: SandboxIsolation
    #: a new connection to a container's agent: (container id) -> client (any event loop)
    open_agent: Callable[[str], Awaitable[AgentClient]]
    #: the container's record; SandboxNotFoundError when it is gone
    inspect: Callable[[str], Awaitable[Any]]
    #: tears a session down: (session, remove_workspace)
    teardown: Callable[[ContainerSession, bool], Awaitable[None]]
    log: Any
    memory_limit: int = 8 << 20
    commands: CommandRegistry = field(default_factory=CommandRegistry)
    #: moves a session's end durably: (session, expires_at); None: the provider cannot
    retime: Callable[[ContainerSession, float], Awaitable[None]] | None = None
    workspace: str = WORKSPACE
    #: the container's own environment (image and create options), when a session was made without it
    container_env: Callable[[str], Awaitable[Mapping[str, str]]] | None = None
    #: an opener usable on another event loop (the synchronous resolve); None: ``open_agent`` is
    open_agent_elsewhere: Callable[[str], Awaitable[AgentClient]] | None = None
    #: a file transfer that moves no data for this long is aborted (the provider's transfer_idle_seconds)
    transfer_idle_seconds: float = 60.0
    #: an answer (or a write) the agent has not given in this long asks whether its container still runs,
    #: bounded by the engine's own timeout (the provider's engine_timeout_seconds)
    answer_within: float = 2.0
    #: what the site knows of each container its sessions use (see KnownContainer)
    containers: dict[str, KnownContainer] = field(default_factory=dict)
    #: the container of each session found or made here (see vouched)
    session_containers: dict[str, str] = field(default_factory=dict)
    #: the session's current end as its provider records it (None: its labels' end stands); None: no records
    current_end: Callable[[str], Awaitable[float | None]] | None = None
    #: freezes or thaws a session's container: (session, paused); None: the provider cannot
    set_paused: Callable[[ContainerSession, bool], Awaitable[None]] | None = None
    #: the containers known paused here (by this server, or as the engine or a record said when found)
    paused: set[str] = field(default_factory=set)
    #: a new session started from a session's state now; None: the provider cannot
    fork: Callable[[ContainerSession], Awaitable[ContainerSession]] | None = None
    #: a TCP connection (container, host address, port) made by this process inside the container's network
    #: (NotReachableHere where it cannot: the agent dials); None: the agent dials every one
    connect_port: Callable[[str, str, int], Awaitable[socket.socket]] | None = None

    def known(self, container_id: str, session_id: str) -> KnownContainer:
        """The container's record, made on first use (its channel made again once closed)."""
        found = self.containers.get(container_id)
        if found is None:
            if (
                len(self.containers) >= MAX_KNOWN_CONTAINERS
            ):  # containers another server removed: forget the idle ones
                for key in [k for k, c in self.containers.items() if c.channel.idle or c.channel.closed]:
                    del self.containers[key]
                # in place: the site is a frozen dataclass (assigning the field raised FrozenInstanceError)
                for gone in [s for s, c in self.session_containers.items() if c not in self.containers]:
                    del self.session_containers[gone]
            found = self.containers[container_id] = KnownContainer(self._channel_to(container_id, session_id))
        elif found.channel.closed:
            found.channel = self._channel_to(container_id, session_id)
        found.channel.session_id = session_id
        return found

    def remember(self, session: S) -> S:
        """``session``, found or just made by its provider, for :meth:`vouched` to give again."""
        self.known(session.container_id, session.id).session = session
        self.session_containers[session.id] = session.container_id
        return session

    def vouched(self, session_id: str) -> ContainerSession | None:
        """The session :meth:`remember` was given, while its agent connection is open (None otherwise): the
        agent is its container's PID 1, so an open connection is the container running, and finding the
        session needs no engine call. A connection that ended, a destroy on this server (which closes it)
        or the container's removal by anyone (which ends it) sends the next look-up to the engine."""
        container_id = self.session_containers.get(session_id)
        known = self.containers.get(container_id) if container_id is not None else None
        session = known.session if known is not None else None
        if session is None or session.destroyed or not session.agent_connected:
            return None
        return session

    def note_state(self, container_id: str, record: Any) -> None:
        """What an inspect says of the container's pause (another server may have paused or resumed it)."""
        state = record.get("State") if isinstance(record, dict) else None
        if isinstance(state, dict) and "Paused" in state:
            if state["Paused"]:
                self.paused.add(container_id)
            else:
                self.paused.discard(container_id)

    def session_of(self, container_id: str) -> str:
        """The id of the session in a container, as known here (else the container's own id)."""
        known = self.containers.get(container_id)
        return known.channel.session_id if known is not None else container_id

    def _channel_to(self, container_id: str, session_id: str) -> AgentChannel:
        return AgentChannel(
            lambda: self.open_agent(container_id),
            session_id=session_id,
            still_there=lambda: container_runs(self, container_id),
            answer_within=self.answer_within,
        )

    async def warm(self, container_id: str) -> None:
        """Open a container's agent connection and read its environment before any session is made in it (a
        pooled container): its first command then goes at once."""
        known = self.known(container_id, f"pooled {container_id[:12]}")
        await known.channel.client()
        if self.container_env is not None and known.env is None:
            known.env = dict(await self.container_env(container_id))

    async def close(self) -> None:
        """The server goes: its commands here are killed and every agent connection closed (the containers and
        what else they run stay)."""
        await asyncio.gather(*(c.kill() for c in self.commands.all()), return_exceptions=True)
        channels = [known.channel for known in self.containers.values()]
        self.containers.clear()
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)

    def forget(self, container_id: str) -> None:
        """The container is gone: close its channel."""
        known = self.containers.pop(container_id, None)
        if known is not None:
            in_background(known.channel.close())
            if known.session is not None:
                self.session_containers.pop(known.session.id, None)


@dataclass
class KnownContainer:
    """One container as its site knows it: the agent channel every session object of it shares (a get() per
    request), rather than an engine exec each that lives as long as the container, and its session user."""

    channel: AgentChannel
    #: the session user as (uid, gid), once read from the image (see users.resolve_user); None: root
    user_ids: tuple[int, int] | None = None
    users_read: bool = False
    #: the container's own environment, once read
    env: dict[str, str] | None = None
    #: the session last found or made in this container here (see ContainerSite.vouched)
    session: ContainerSession | None = None


async def container_runs(site: ContainerSite, container_id: str) -> bool:
    """False once the container is gone or stopped (its agent with it)."""
    try:
        record = await site.inspect(container_id)
    except SandboxNotFoundError:
        return False
    except SandboxUnavailableError:
        raise  # the engine carrying the agent's stream does not answer: the call fails, bounded
    except SandboxError:
        return True  # no sign the agent is gone
    state = record.get("State") if isinstance(record, dict) else None
    site.note_state(container_id, record)
    if container_id in site.paused:  # its agent answers nothing until it is resumed
        raise paused_error(site.session_of(container_id))
    return not isinstance(state, dict) or bool(state.get("Running", True))


def paused_error(session_id: str) -> SandboxConflictError:
    return SandboxConflictError(f"session {session_id} is paused: resume it first")


class ContainerSession(SandboxSession):
    """One session container, reached through its agent."""

    def __init__(
        self,
        site: ContainerSite,
        container_id: str,
        session_id: str,
        spec: SessionSpec,
        created_at: float,
        expires_at: float,
        *,
        env: Mapping[str, str] | None = None,
        user: str = "",
        root: str = "",
    ) -> None:
        self._site = site
        #: who commands and file operations run as ('uid[:gid]' or names, as Docker reads them); '' = the agent's root
        self._user = user
        #: the folder of the agent's that commands are chrooted into ('' = the agent's own root)
        self._root = root
        self._container = container_id
        self._id = session_id
        self.spec = spec
        self.created_at = created_at
        self.expires_at = expires_at
        self._destroyed = False
        #: every command's base environment (the container's own: the agent passes none of its own on);
        #: None until read from the container
        self._env: dict[str, str] | None = None if env is None else self._base_env(env)
        self._known = site.known(container_id, session_id)
        self._channel = self._known.channel
        self.files = WorkspaceFiles(
            self._client, site.workspace, idle_seconds=site.transfer_idle_seconds, user=self.user_ids
        )

    @property
    def id(self) -> str:
        return self._id

    @property
    def container_id(self) -> str:
        return self._container

    @property
    def user(self) -> str:
        """Who the session's commands run as ('' = root)."""
        return self._user

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    @property
    def agent_connected(self) -> bool:
        """This session's agent connection is open (it ends when the agent, the container's PID 1, does)."""
        return self._channel is self._known.channel and not (self._channel.closed or self._channel.idle)

    def _info(self) -> SessionInfo:
        return SessionInfo(
            id=self._id,
            kind=self._site.kind,
            spec=self.spec,
            isolation=self._site.isolation,
            workspace=self._site.workspace,
            created_at=self.created_at,
            expires_at=self.expires_at,
            paused=self._container in self._site.paused,
        )

    async def info(self) -> SessionInfo:
        """The session as the engine has it now: its container there, its end as last recorded (another
        server of the deployment may have moved it since this object was made)."""
        self._check_live()
        current_end = self._site.current_end
        try:
            if current_end is None:
                record = await self._site.inspect(self._container)
            else:
                record, end = await asyncio.gather(self._site.inspect(self._container), current_end(self._id))
                if end is not None:
                    self.expires_at = end
        except SandboxNotFoundError:
            raise session_gone(self._id) from None
        self._site.note_state(self._container, record)
        return self._info()

    def known_info(self) -> SessionInfo | None:
        return None if self._destroyed else self._info()

    def _check_live(self) -> None:
        if self._destroyed:
            raise SandboxNotFoundError(f"session {self._id} was destroyed")

    def _base_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {"PATH": DEFAULT_PATH, "HOME": self._site.workspace, **env}

    async def _command_env(self) -> dict[str, str]:
        if self._env is None:
            found = self._known.env
            if found is None:
                found = (
                    dict(await self._site.container_env(self._container)) if self._site.container_env else {}
                )
                self._known.env = found
            self._env = self._base_env(found)
        return self._env

    async def user_ids(self) -> tuple[int, int] | None:
        """The session user's ``(uid, gid)``, read once from the image's /etc/passwd and /etc/group (None: the
        agent's own root); a SandboxError when the image does not know the user."""
        if not self._user:
            return None
        if not self._known.users_read:
            self._known.user_ids = await resolve_user(
                self._user, self._image_file_reader(await self._client())
            )
            self._known.users_read = True
        return self._known.user_ids

    def _image_file_reader(self, client: AgentClient) -> Callable[[str], Awaitable[bytes | None]]:
        async def read(path: str) -> bytes | None:
            try:
                # the first MiB only: the image (or root session code) may make the file as large as it likes
                return (await client.read_chunk("/", path, 0, USER_FILE_LIMIT))[1]
            except AgentError as e:
                if e.code in ("ENOENT", "ENOTDIR"):
                    return None
                raise SandboxError(f"reading /{path} in session {self._id}: {e}") from None

        return read

    async def _client(self) -> AgentClient:
        self._check_live()
        if self._container in self._site.paused:
            raise paused_error(self._id)
        try:
            return await self._channel.client()
        except SandboxError:
            if self._destroyed:
                raise SandboxNotFoundError(f"session {self._id} is gone") from None
            raise

    # ----------------------------------------------------------------- exec

    async def _start(self, request: ExecRequest, *, pty: bool) -> ContainerCommand:
        client = await self._client()
        cwd = self._site.workspace if request.cwd is None else await self.files.folder(request.cwd, "cwd")
        env = {**await self._command_env(), "SANDBOX_WORKSPACE": self._site.workspace, **request.env}
        rows, cols = request.window
        if pty:
            env = {"TERM": PTY_TERM, **env}
        ids = await self.user_ids()
        try:
            agent_command = await client.start(
                request.argv,
                env=env,
                cwd=cwd,
                pty=pty,
                rows=rows,
                cols=cols,
                # the agent's own deadline is a backstop for a server that is gone; the handle's comes first
                timeout_seconds=request.timeout_seconds + 2 * KILL_LIMIT_SECONDS,
                label=request.label,
                root=self._root or None,
                **_as(ids),
            )
        except AgentError as e:
            # a program that cannot start is the request's fault, named as the local provider names it
            # (never an invented exit status such as a shell's 127); the cwd was found just above
            if e.code == "ENOENT":
                raise SandboxRequestError(
                    f"argv: cannot run {request.argv[0]!r}: no such program in the session", field="argv"
                ) from None
            if e.code == "EACCES":
                raise SandboxRequestError(
                    f"argv: cannot run {request.argv[0]!r}: it is not an executable program", field="argv"
                ) from None
            raise SandboxError(f"cannot start {request.argv[0]!r}: {e}") from None
        except asyncio.CancelledError:
            raise
        try:
            return self._track(agent_command, timeout_seconds=request.timeout_seconds, pty=pty)
        except BaseException:
            in_background(agent_command.kill())
            raise

    def _track(
        self,
        agent_command: AgentCommand,
        *,
        timeout_seconds: float,
        deadline_in: float | None = None,
        pty: bool,
    ) -> ContainerCommand:
        command = ContainerCommand(
            agent_command,
            timeout_seconds=timeout_seconds,
            deadline_in=deadline_in,
            pty=pty,
            memory_limit=self._site.memory_limit,
            session_memory_mb=self.spec.memory_mb,
            log=self._site.log,
            on_done=lambda c: self._site.commands.discard(self._id, c),
        )
        self._site.commands.add(self._id, command)
        return command

    async def run(self, request: ExecRequest) -> ExecResult:
        command = await self._start(request, pty=False)
        if request.stdin is not None:
            command.feed(request.stdin)
        else:
            await command.close_stdin()
        return await run_to_end(command, request.output_limit)

    async def start(self, request: ExecRequest) -> ExecHandle:
        return await self._start(request, pty=request.pty)

    # --------------------------------------------- commands a server left

    holds_commands = True

    async def held_commands(self) -> list[HeldCommand]:
        try:
            listed = await (await self._client()).list()
        except AgentError as e:
            raise SandboxError(f"listing session {self._id}'s commands: {e}") from None
        return [_held(entry) for entry in listed if entry.get("pid")]  # pid 0: a TCP connection, no command

    async def attach_command(self, command_id: str, offsets: Mapping[str, int] | None = None) -> ExecHandle:
        client = await self._client()
        number = int(command_id) if command_id.isdigit() else 0
        found = next((c for c in await self.held_commands() if c.id == command_id), None)
        if found is None or not number:
            return await super().attach_command(command_id, offsets)
        offsets = offsets or {}
        try:
            agent_command = await client.attach(
                number, stdout=offsets.get("stdout", 0), stderr=offsets.get("stderr", 0)
            )
        except AgentError as e:
            if e.code == "ESRCH":
                return await super().attach_command(command_id, offsets)
            raise SandboxError(f"attaching to command {command_id} of session {self._id}: {e}") from None
        # the agent's deadline is the server's plus the backstop margin (see _start)
        timeout, left = _BACKSTOP_UNKNOWN, None
        if found.deadline is not None:
            end = found.deadline - 2 * KILL_LIMIT_SECONDS
            timeout, left = max(0.001, end - found.started), max(0.001, end - time.time())
        try:
            return self._track(agent_command, timeout_seconds=timeout, deadline_in=left, pty=found.pty)
        except BaseException:
            in_background(agent_command.release())
            raise

    # ---------------------------------------------------------------- ports

    opens_ports = True

    async def open_port(self, port: int, host: str = "127.0.0.1") -> PortConnection:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise SandboxRequestError(f"port: a TCP port number, not {port!r}", field="port")
        client = await self._client()
        if self._site.connect_port is not None and _is_address(host):
            try:
                return SocketPort(await self._site.connect_port(self._container, host, port))
            except NotReachableHere:
                pass  # the agent dials
            except ConnectionRefusedError:
                raise ConnectionRefusedError(
                    f"nothing listens on {host}:{port} in session {self._id}"
                ) from None
            except OSError as e:
                raise SandboxError(f"connecting to {host}:{port} in session {self._id}: {e}") from None
        try:
            return AgentPort(await client.connect_tcp(port, host))
        except AgentError as e:
            if e.code == "ECONNREFUSED":
                raise ConnectionRefusedError(
                    f"nothing listens on {host}:{port} in session {self._id}"
                ) from None
            raise SandboxError(f"connecting to {host}:{port} in session {self._id}: {e}") from None

    # ---------------------------------------------------------------- paths

    def resolve(self, path: str) -> str:
        """:meth:`resolve_path` for synchronous callers: one look-up on a connection of its own, in a
        worker thread (the contract makes resolve synchronous; async callers use resolve_path)."""
        self._check_live()
        self.files.relative(path)  # the lexical checks, raised here without a thread

        async def look() -> str:
            client = await (self._site.open_agent_elsewhere or self._site.open_agent)(self._container)
            try:
                known = self._known
                ids = (
                    known.user_ids
                    if known.users_read or not self._user
                    else await resolve_user(self._user, self._image_file_reader(client))
                )
                files = WorkspaceFiles(lambda: _ready(client), self._site.workspace, user=lambda: _ready(ids))
                return await files.resolve(path)
            finally:
                await client.close()

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            try:
                return pool.submit(asyncio.run, look()).result(RESOLVE_LIMIT_SECONDS)
            except concurrent.futures.TimeoutError:
                raise SandboxError(
                    f"looking up {path!r} took longer than {RESOLVE_LIMIT_SECONDS:g} s"
                ) from None
            except AgentError as e:
                raise SandboxError(f"looking up {path!r}: the session agent failed: {e}") from None

    async def resolve_path(self, path: str) -> str:
        return await self.files.resolve(path)

    # ---------------------------------------------------------------- files

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        await self.files.put(path, data)

    async def get_file(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.iter_file(path)])

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        async for chunk in self.files.iter(path, chunk_size):
            yield chunk

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        return await self.files.listdir(path)

    async def remove_path(self, path: str) -> None:
        await self.files.remove(path)

    async def move_path(self, path: str, new_path: str) -> None:
        await self.files.move(path, new_path)

    async def make_folder(self, path: str) -> None:
        await self.files.mkdir(path)

    # ------------------------------------------------------------ TTL, teardown

    async def set_expiry(self, expires_at: float) -> SessionInfo:
        self._check_live()
        if self._site.retime is None:
            return await super().set_expiry(expires_at)
        await self._site.retime(self, expires_at)
        self.expires_at = expires_at
        return self._info()

    # ---------------------------------------------------------- pause, resume

    @property
    def pausable(self) -> bool:  # type: ignore[override]  # the site's; SandboxSession has a plain attribute
        return self._site.set_paused is not None

    async def pause(self) -> SessionInfo:
        return await self._set_paused(True)

    async def resume(self) -> SessionInfo:
        return await self._set_paused(False)

    async def _set_paused(self, paused: bool) -> SessionInfo:
        self._check_live()
        if self._site.set_paused is None:
            return await (super().pause() if paused else super().resume())
        await self._site.set_paused(self, paused)
        if paused:
            self._site.paused.add(self._container)
        else:
            self._site.paused.discard(self._container)
        return self._info()

    @property
    def forkable(self) -> bool:  # type: ignore[override]  # as pausable
        return self._site.fork is not None

    async def fork(self) -> SandboxSession:
        self._check_live()
        if self._site.fork is None:
            return await super().fork()
        return await self._site.fork(self)

    async def destroy(self, remove_workspace: bool = False) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._site.commands.abandon(self._id)
        self._site.containers.pop(self._container, None)
        self._site.session_containers.pop(self._id, None)
        self._site.paused.discard(self._container)
        with contextlib.suppress(Exception):
            await self._channel.close()
        await self._site.teardown(self, remove_workspace)


#: the deadline of an attached command that has none of its own (the agent ends it at its backstop)
_BACKSTOP_UNKNOWN = 365 * 86400.0


def _held(entry: Mapping[str, Any]) -> HeldCommand:
    return HeldCommand(
        id=str(entry["id"]),
        label=entry.get("label") or None,
        pty=bool(entry.get("pty")),
        running=bool(entry.get("running")),
        attached=bool(entry.get("attached")),
        started=float(entry.get("started", 0.0)),
        deadline=entry.get("deadline") or None,
        offsets={
            stream: (int(span[0]), int(span[1])) for stream, span in (entry.get("output") or {}).items()
        },
    )


async def _ready(value: T) -> T:
    return value


def _as(ids: tuple[int, int] | None) -> dict[str, int]:
    return {} if ids is None else {"uid": ids[0], "gid": ids[1]}


def _is_address(host: str) -> bool:
    """An IP address (a name is the agent's to resolve, with the session's own resolver)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
