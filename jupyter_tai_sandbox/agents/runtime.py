"""One coding agent's process in one sandbox session of one user: :class:`AgentRuntime`.

The runtime makes (or finds again) the session through the server's
:class:`~jupyter_tai_sandbox.sessions.SessionRegistry`, with the chatting user as owner (as a sandboxed
kernel's provisioner does: the operator's configuration acts for the user, so the consumer label
``agent:<key>`` is allowed, and the policy decides the rest: isolation floor, egress ceiling, the secrets
granted to ``agent:<key>``, TTL, quotas). It starts the agent's command there under the label ``acp:<key>``,
or attaches to that command when it is still running (a restarted server, a chat opened again), reading
each output stream from its end. The command's exit on its own (killed, crashed, out of memory) is told to
the runtime's listeners (the personas, which say so in the chat) and the session is destroyed (a persistent
workspace is kept); a detach (the server stops) leaves the command running in its session, whose TTL reaps
it when nobody comes back.

The session is not left in the registry's list of this server's sessions: the server's stop destroys those,
and an agent's session is meant to outlive a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..contract import (
    EgressPolicy,
    ExecRequest,
    SandboxError,
    SandboxSession,
    SessionSpec,
)
from .settings import SandboxAgents
from .spec import AgentPersonaSpec, AgentSpecError

if TYPE_CHECKING:
    from ..sessions import SessionRegistry
    from .transport import AgentProcess

#: the agent's home in its workspace (its settings and caches; the handoff never copies it back)
AGENT_HOME = ".agent-home"
#: a session's life when the operator sets no maximum (as a sandboxed kernel's)
DEFAULT_LIFE = 24 * 3600.0


@dataclass(frozen=True)
class AgentExit:
    """How an agent's command ended on its own: its status (128+N for a signal; -1 when its output ended
    with an error), the provider's reason, and the end of its stderr."""

    code: int | None
    reason: str | None
    stderr_tail: str

    def describe(self) -> str:
        if self.code == -1 and self.reason:
            return f"ended: {self.reason}"  # no exit status: the reason says why (its session destroyed, ...)
        what = f"exited with status {self.code}" if self.code is not None else "ended"
        if self.code is not None and self.code > 128:
            what += f" (signal {self.code - 128})"
        if self.reason:
            what += f": {self.reason}"
        return what


Listener = Callable[[AgentExit], Awaitable[None]]


def command_label(key: str) -> str:
    """The label of an agent's command in its session (``held_commands`` finds it by this)."""
    return f"acp:{key}"


class AgentRuntime:
    """The agent ``spec`` of ``owner``: its session and its command (see the module's docstring)."""

    def __init__(
        self,
        spec: AgentPersonaSpec,
        *,
        registry: SessionRegistry,
        owner: str,
        settings: SandboxAgents,
        log: logging.Logger | None = None,
        workspace_key: str | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.owner = owner
        self.settings = settings
        self.log = log or logging.getLogger(__name__)
        self.workspace_key = workspace_key
        self.session: SandboxSession | None = None
        self.process: AgentProcess | None = None
        #: the session's workspace as its commands see it (the agent's working tree)
        self.workspace: str | None = None
        #: whether the command was found running (attached) rather than started
        self.attached = False
        #: the ACP client of this process (the persona makes it; one per process)
        self.client: asyncio.Task[Any] | None = None
        #: the command's handle (under the AgentProcess)
        self.handle: Any = None
        #: the contents paths copied in through this runtime's persona (``/sandbox copy-in``, ``copy_in``)
        self.copied_in: list[str] = []
        self.ended = False
        self._ending = False
        self._watch: asyncio.Task[None] | None = None
        self._listeners: set[Listener] = set()
        self._started: asyncio.Task[AgentProcess] | None = None

    # ------------------------------------------------------------------ start

    @property
    def label(self) -> str:
        return command_label(self.spec.key)

    def listen(self, listener: Listener) -> None:
        self._listeners.add(listener)

    def unlisten(self, listener: Listener) -> None:
        self._listeners.discard(listener)

    async def start(
        self,
        session_id: str | None = None,
        before_command: Callable[[AgentRuntime], Awaitable[None]] | None = None,
    ) -> AgentProcess:
        """The agent's process (started once; concurrent callers share the start). ``session_id``: the session
        a chat recorded (scope ``chat``), tried first. ``before_command``: awaited once the session is there and
        before a new command starts in it (not when attaching to a running one): files to copy in."""
        if self._started is None or (self._started.done() and self._started.exception() is not None):
            self._started = asyncio.ensure_future(self._start(session_id, before_command))
        return await asyncio.shield(self._started)

    async def _start(
        self, session_id: str | None, before_command: Callable[[AgentRuntime], Awaitable[None]] | None
    ) -> AgentProcess:
        from .transport import AgentProcess

        timeout = self.settings.start_timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                session = await self._find(session_id)
                if session is None:
                    session = await self._create()
                self.session = session
                info = session.known_info() or await session.info()
                self.workspace = info.workspace
                handle = await self._command(session, info.expires_at, before_command)
        except TimeoutError:
            await self._discard()
            raise SandboxError(
                f"the agent {self.spec.key!r} did not start within {timeout:g} s "
                "(SandboxAgents.start_timeout_seconds)"
            ) from None
        except BaseException:
            await self._discard()
            raise
        self.handle = handle
        self.process = process = AgentProcess(handle, log=self.log)
        self._watch = asyncio.ensure_future(self._follow(process))
        self.log.info(
            "coding agent %s of %s: %s command in session %s (%s)",
            self.spec.key,
            self.owner,
            "attached to the running" if self.attached else "started the",
            session.id,
            info.image or "default image",
        )
        return process

    async def _find(self, session_id: str | None) -> SandboxSession | None:
        """The owner's live session of this agent: the one named (scope chat), else (scope persona) the newest."""
        from ..sessions import Caller

        caller = Caller(self.owner)
        consumer = self.spec.consumer
        candidates: list[str] = []
        if session_id:
            candidates.append(session_id)
        if self.spec.scope == "persona":
            infos = [
                i
                for i in await self.registry.list(caller)
                if i.consumer == consumer and i.owner == self.owner
            ]
            candidates += [i.id for i in sorted(infos, key=lambda i: i.created_at, reverse=True)]
        for candidate in candidates:
            try:
                session = await self.registry.get(candidate, caller, manage=True)
                info = session.known_info() or await session.info()
            except SandboxError:
                continue
            if info.consumer == consumer and info.owner == self.owner and info.expires_at > time.time():
                return session
        return None

    def _life(self) -> float:
        """The session's TTL, which is also the agent command's deadline (it runs for all of it)."""
        policy = self.registry.policy
        ceiling = getattr(policy, "max_timeout_seconds", 0) or 0
        if self.spec.ttl_seconds:
            if ceiling and self.spec.ttl_seconds > ceiling:
                raise AgentSpecError(
                    f"SandboxAgents.personas[{self.spec.key!r}].ttl_seconds: {self.spec.ttl_seconds:g} s is over "
                    f"the operator's maximum command deadline of {ceiling:g} s (SandboxPolicy.max_timeout_seconds): "
                    "the agent runs as one command for its session's whole life",
                    field="ttl_seconds",
                )
            return float(self.spec.ttl_seconds)
        life = getattr(policy, "max_ttl_seconds", 0) or DEFAULT_LIFE
        return min(life, ceiling) if ceiling else life

    def session_spec(self) -> SessionSpec:
        spec = self.spec
        return SessionSpec(
            image=spec.image or self.settings.default_image,
            isolation=spec.isolation,  # type: ignore[arg-type]  # checked by AgentPersonaSpec
            network="egress",
            durability="persistent" if self.workspace_key else "ephemeral",
            workspace_key=self.workspace_key,
            ttl_seconds=self._life(),
            cpu=spec.cpu,
            memory_mb=spec.memory_mb,
            consumer=spec.consumer,
            owner=self.owner,
            egress=EgressPolicy(allow=spec.allow_list(self.settings.registries), deny=spec.egress_deny),
        )

    async def _create(self) -> SandboxSession:
        from ..sessions import Caller

        # the operator's configuration acts for the user (as a kernelspec does): the consumer agent:<key>
        operator = Caller(self.owner, frozenset({"write"}))
        session = await self.registry.create(self.session_spec(), operator)
        # not this server's to destroy at its stop: the agent outlives a restart (its TTL reaps it)
        self.registry.forget(session.id)
        return session

    async def _command(
        self,
        session: SandboxSession,
        expires_at: float,
        before_command: Callable[[AgentRuntime], Awaitable[None]] | None,
    ) -> Any:
        """Attach to the agent's running command in ``session``, else start it."""
        with contextlib.suppress(SandboxError):
            held = [c for c in await session.held_commands() if c.label == self.label and c.running]
            if held:
                command = max(held, key=lambda c: c.started)
                offsets = {stream: end for stream, (_, end) in command.offsets.items()}
                handle = await session.attach_command(command.id, offsets)
                self.attached = True
                return handle
        assert self.workspace is not None
        with contextlib.suppress(SandboxError):  # already there (a persistent workspace): fine
            await session.make_folder(AGENT_HOME)
        if before_command is not None:
            await before_command(self)
        env = {**self.spec.env, "HOME": posixpath.join(self.workspace, AGENT_HOME)}
        left = expires_at - time.time()
        ceiling = getattr(self.registry.policy, "max_timeout_seconds", 0) or 0
        deadline = max(1.0, min(left, ceiling) if ceiling else left)
        request = ExecRequest(self.spec.command, deadline, env=env, label=self.label)
        self.attached = False
        return await session.start(request)

    # ------------------------------------------------------------------ life

    async def _follow(self, process: AgentProcess) -> None:
        code = await process.wait()
        if self._ending:
            return
        self.ended = True
        await self._close_client()
        ended = AgentExit(code, process.exit_reason, process.stderr_tail())
        self.log.warning("coding agent %s of %s %s", self.spec.key, self.owner, ended.describe())
        await self._destroy()
        for listener in list(self._listeners):
            try:
                await listener(ended)
            except Exception:
                self.log.exception("telling a persona that agent %s ended failed", self.spec.key)

    async def _destroy(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        try:
            await self.registry.destroy(session, remove_workspace=False)
        except SandboxError as e:
            self.log.info("coding agent %s: session %s: %s", self.spec.key, session.id, e)

    async def _discard(self) -> None:
        """A start that failed: the session it made goes (a found one too: its agent would not start)."""
        self.ended = True
        self._ending = True
        await self._destroy()

    async def detach(self) -> None:
        """Stop talking to the agent; its command runs on in its session (a server stopping, a chat closed)."""
        self._ending = True
        self.ended = True
        if self._started is not None and not self._started.done():
            self._started.cancel()
        if self._watch is not None:
            self._watch.cancel()
        await self._close_client()
        if self.process is not None:
            await self.process.detach()
        if self.handle is not None:
            await self.handle.detach()

    async def stop(self, why: str = "stopped with /sandbox stop") -> None:
        """End the agent and destroy its session (``/sandbox stop``; a persistent workspace is kept). The
        listeners still registered (the other chats of a persona-scoped agent) are told ``why``."""
        self._ending = True
        self.ended = True
        if self._watch is not None:
            self._watch.cancel()
        await self._close_client()
        if self.process is not None:
            with contextlib.suppress(SandboxError):
                await self.process.kill()
        await self._destroy()
        for listener in list(self._listeners):
            try:
                await listener(AgentExit(None, why, ""))
            except Exception:
                self.log.exception("telling a persona that agent %s stopped failed", self.spec.key)

    async def _close_client(self) -> None:
        """End the ACP connection to the agent (its sender and dispatcher tasks, which otherwise wait forever on
        their queues): the agent ended, is stopped, or runs on without us (detach). A new start makes a new
        client."""
        task, self.client = self.client, None
        if task is None:
            return
        if not task.done():
            task.cancel()
            return
        with contextlib.suppress(Exception):
            connection = await asyncio.wait_for(task.result().get_connection(), 1)
            await connection.close()

    async def status(self) -> dict[str, Any]:
        """What ``/sandbox status`` shows."""
        session = self.session
        data: dict[str, Any] = {
            "agent": self.spec.key,
            "owner": self.owner,
            "scope": self.spec.scope,
            "running": self.process is not None and self.process.returncode is None and not self.ended,
            "attached": self.attached,
            "copied_in": list(self.copied_in),
        }
        if session is not None:
            data["session"] = session.id
            with contextlib.suppress(SandboxError):
                info = await session.info()
                data.update(
                    image=info.image,
                    isolation=info.isolation,
                    workspace=info.workspace,
                    workspace_key=info.workspace_key,
                    expires_in_seconds=max(0, round(info.expires_at - time.time())),
                    network=info.spec.network,
                    egress_allow=None if info.spec.egress is None else info.spec.egress.allow,
                    secrets=[] if info.spec.egress is None else [g.name for g in info.spec.egress.secrets],
                )
        return data


def persistent_workspace_key(spec: AgentPersonaSpec, scope_key: str) -> str | None:
    """The persistent workspace of a persona's session (``persistent``): one per persona (scope persona),
    or one per chat (scope chat, named from the chat's id)."""
    if not spec.persistent:
        return None
    if spec.scope == "persona":
        return f"agent-{spec.key}"
    return f"agent-{spec.key}-{hashlib.sha256(scope_key.encode()).hexdigest()[:16]}"


class RuntimePool:
    """The runtimes of this server process, by (persona id, scope key): the chat's id for scope ``chat``, the
    owner for scope ``persona``; each held by the personas using it."""

    def __init__(self) -> None:
        self._runtimes: dict[tuple[str, str], AgentRuntime] = {}
        self._holders: dict[tuple[str, str], set[int]] = {}

    def get(self, key: tuple[str, str]) -> AgentRuntime | None:
        runtime = self._runtimes.get(key)
        if runtime is not None and runtime.ended:
            self._runtimes.pop(key, None)
            self._holders.pop(key, None)
            return None
        return runtime

    def hold(self, key: tuple[str, str], runtime: AgentRuntime, holder: object) -> None:
        self._runtimes[key] = runtime
        self._holders.setdefault(key, set()).add(id(holder))

    def release(self, key: tuple[str, str], holder: object) -> AgentRuntime | None:
        """Let ``holder`` go; the runtime once nobody holds it (for the caller to detach), else None."""
        holders = self._holders.get(key)
        if holders is None:
            return None
        holders.discard(id(holder))
        if holders:
            return None
        self._holders.pop(key, None)
        return self._runtimes.pop(key, None)

    def drop(self, key: tuple[str, str], runtime: AgentRuntime) -> None:
        if self._runtimes.get(key) is runtime:
            self._runtimes.pop(key, None)
            self._holders.pop(key, None)


#: the runtimes of this process
POOL = RuntimePool()

__all__ = [
    "AGENT_HOME",
    "POOL",
    "AgentExit",
    "AgentRuntime",
    "RuntimePool",
    "command_label",
    "persistent_workspace_key",
]
