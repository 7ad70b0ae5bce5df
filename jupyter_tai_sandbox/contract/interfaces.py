"""The contract's interfaces: what a provider implements.

A provider subclasses :class:`Sandbox` (creates, finds, lists and reaps sessions) and
:class:`SandboxSession` (exec, files, teardown); an interactive command is an
:class:`ExecHandle`. A provider without file operations of its own can take the
workspace file operations from ``jupyter_tai_sandbox.providers._shell_files.ShellFileOps``
(shell commands run through :meth:`SandboxSession.exec`).
"""

from __future__ import annotations

import abc
import builtins
import socket
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import Any

from .egress import EgressHooks, EgressPolicy
from .errors import (
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnsupportedError,
)
from .limits import SessionLimits
from .values import (
    ExecRequest,
    ExecResult,
    HeldCommand,
    OutputItem,
    SandboxIsolation,
    SessionInfo,
    SessionSpec,
)


class ExecHandle(abc.ABC):
    """An interactive command.

    ``output`` yields :class:`OutputChunk` items and ends with exactly one
    :class:`ExitItem` -- or raises :class:`SandboxExecTimeoutError` when the
    deadline killed the command, or :class:`SandboxError` when the provider
    cannot read the exit status or the command itself failed. A consumer done
    with a handle calls :meth:`kill`, which is safe at any time and repeatable.
    """

    @property
    @abc.abstractmethod
    def output(self) -> AsyncIterator[OutputItem]:
        """The command's output, then one exit item."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Write to the command's stdin; SandboxError once it is closed or the command exited."""

    @abc.abstractmethod
    async def close_stdin(self) -> None:
        """Close the command's stdin (EOF). Idempotent."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """Stop the command's process group; idempotent, never raises after the exit."""

    async def resize(self, rows: int, cols: int) -> None:
        """Resize the command's terminal (pty handles only)."""
        raise SandboxError("this command has no terminal to resize: start it with pty=True")

    async def detach(self) -> None:
        """Let the command run on without this handle: a session that holds its commands
        (:attr:`SandboxSession.holds_commands`) keeps it, and its output, for a later
        :meth:`SandboxSession.attach_command` (this server's or another's); this handle's output ends and a
        server stop no longer ends the command. The default, for a provider whose commands live in the server
        and so cannot outlive it, kills the command."""
        await self.kill()


class PortConnection(abc.ABC):
    """A TCP connection to a port inside a session (:meth:`SandboxSession.open_port`), as a byte stream."""

    @abc.abstractmethod
    async def read(self) -> bytes | None:
        """The next bytes the peer sent; None once it closed its side. ConnectionResetError when the
        connection broke."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes (waits while the peer does not read them). ConnectionResetError when it broke."""

    @abc.abstractmethod
    async def close_write(self) -> None:
        """Half-close: the peer reads an end of stream, and may still send. Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close both ways and free what the connection holds. Idempotent, never raises."""

    def take_socket(self) -> socket.socket | None:
        """The connected socket itself, when the connection is one socket of this process that nothing has
        read or written yet (a forwarder then joins it to another socket, no byte copied through Python):
        the caller owns it from then on, and this object only closes. None (the default): read and write."""
        return None


class SandboxSession(abc.ABC):
    """One live session: a workspace, exec and file transfer, until destroyed or reaped."""

    @property
    @abc.abstractmethod
    def id(self) -> str: ...

    @abc.abstractmethod
    async def info(self) -> SessionInfo: ...

    def known_info(self) -> SessionInfo | None:
        """The session's info as the provider read it when it found the session, without asking again
        (None: only :meth:`info` knows). Its owner and spec never change; its end may have moved since.
        For a check of who may use a session just found, not for whether it still exists."""
        return None

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run ``argv`` to its end; its stdin is fed while its output is read."""
        request = ExecRequest(argv, timeout_seconds, env={} if env is None else env, cwd=cwd, stdin=stdin)
        return await self.run(request)

    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        pty: bool = False,
        rows: int | None = None,
        cols: int | None = None,
    ) -> ExecHandle:
        """Start ``argv`` and return its handle (on a terminal of ``rows`` x ``cols`` when ``pty``)."""
        request = ExecRequest(
            argv, timeout_seconds, env={} if env is None else env, cwd=cwd, pty=pty, rows=rows, cols=cols
        )
        return await self.start(request)

    @abc.abstractmethod
    async def run(self, request: ExecRequest) -> ExecResult:
        """Run a validated one-shot request to its end (what :meth:`exec` calls)."""

    @abc.abstractmethod
    async def start(self, request: ExecRequest) -> ExecHandle:
        """Start a validated interactive request (what :meth:`exec_start` calls)."""

    @abc.abstractmethod
    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        """Write a workspace file (parents created); ``data`` may be streamed."""

    @abc.abstractmethod
    async def get_file(self, path: str) -> bytes:
        """Read a whole workspace file."""

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """Stream a workspace file. Providers override this to avoid buffering it whole."""
        data = await self.get_file(path)
        for i in range(0, len(data), chunk_size):
            yield data[i : i + chunk_size]

    @abc.abstractmethod
    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        """List a workspace folder: ``[{"name", "type": "file"|"directory"|"symlink"|"other", "size"}]``."""

    @abc.abstractmethod
    async def remove_path(self, path: str) -> None:
        """Delete a workspace file, or a folder with everything in it; never the workspace itself."""

    @abc.abstractmethod
    async def move_path(self, path: str, new_path: str) -> None:
        """Rename or move a workspace file or folder; the new path must not exist yet (parents are made)."""

    @abc.abstractmethod
    async def make_folder(self, path: str) -> None:
        """Make a workspace folder (and its parents); an existing file there is a conflict."""

    @abc.abstractmethod
    def resolve(self, path: str) -> str:
        """The absolute path of ``path`` as the session's commands see it; SandboxError outside the workspace."""

    async def resolve_path(self, path: str) -> str:
        """:meth:`resolve` as a coroutine, on the provider's own bounded path (its engine's workers, an
        async request). The default runs :meth:`resolve` in a thread; the built-in providers override it."""
        import asyncio

        return await asyncio.to_thread(self.resolve, path)

    @abc.abstractmethod
    async def destroy(self, remove_workspace: bool = False) -> None:
        """Tear the session down; a persistent workspace survives unless ``remove_workspace``."""

    async def set_expiry(self, expires_at: float) -> SessionInfo:
        """Move the session's end to ``expires_at`` (epoch seconds), durably: the reaper, get()/list()
        and a restarted server all honour it. Limits (the operator's maximum, not in the past) are the
        caller's to check. The default refuses: the provider cannot change a session's TTL."""
        raise SandboxSpecRejectedError(
            f"the {(await self.info()).kind} provider cannot change a session's TTL: start a new session "
            "with the ttl_seconds you need"
        )

    #: whether the session itself holds its interactive commands (a session agent does), so they outlive
    #: the server that started them: a later server lists them (:meth:`held_commands`) and attaches
    holds_commands: bool = False

    async def held_commands(self) -> list[HeldCommand]:
        """The interactive commands the session holds: running, or ended and not yet read to their end.
        None for a provider whose commands live in the server (the default)."""
        return []

    async def attach_command(self, command_id: str, offsets: Mapping[str, int] | None = None) -> ExecHandle:
        """Take over a held command (from whichever connection read it before), its output resumed at
        ``offsets`` per stream (0: the oldest held). SandboxNotFoundError when the session holds none such."""
        raise SandboxNotFoundError(f"session {self.id} holds no command {command_id!r}")

    #: whether :meth:`pause` and :meth:`resume` work on this session
    pausable: bool = False

    async def pause(self) -> SessionInfo:
        """Freeze every process of the session where it is: a paused session runs nothing and answers
        exec and file calls with SandboxConflictError until :meth:`resume`; its commands stay held, its TTL
        still runs (the reaper destroys a paused session past its end), and it stays paused across a
        server restart. Pausing a paused session is a no-op. SandboxUnsupportedError where the provider
        cannot (``pausable`` False)."""
        raise SandboxUnsupportedError(
            f"session {self.id}'s provider cannot pause a session", operation="pause"
        )

    async def resume(self) -> SessionInfo:
        """Let a paused session run on from where it was (a running one: a no-op)."""
        raise SandboxUnsupportedError(
            f"session {self.id}'s provider cannot resume a session", operation="resume"
        )

    #: whether :meth:`fork` works on this session
    forkable: bool = False

    async def fork(self) -> SandboxSession:
        """A new session of the same owner and spec (its own id, its TTL counted from now), started from this
        one's state at this moment: what the copy keeps is the provider's to say (a vm: memory and every
        process). Both then run on apart. Consumers fork through the gate (:class:`GatedSession`), which
        counts the copy against its owner's quota like a create. SandboxUnsupportedError where the provider
        cannot (``forkable`` False)."""
        raise SandboxUnsupportedError(f"session {self.id}'s provider cannot fork a session", operation="fork")

    #: whether :meth:`open_port` reaches ports inside the session (works with network ``none`` too)
    opens_ports: bool = False

    async def open_port(self, port: int, host: str = "127.0.0.1") -> PortConnection:
        """A TCP connection to ``host:port`` as seen from inside the session (its own network). Refused:
        ConnectionRefusedError. The default cannot: a consumer forwards ports some other way (the kernel
        tunnel's relay runs over exec)."""
        raise SandboxError(f"session {self.id}'s provider cannot open its ports")

    async def set_egress(self, policy: EgressPolicy) -> None:
        """Put ``policy`` in force for the session's new connections and DNS queries (within a second),
        durably (a restarted server, or another of the deployment, sees it). The policy is the gate's to
        decide (within the operator's ceiling, the session's secrets kept); the provider applies it. The
        default refuses: the provider cannot change a session's egress policy."""
        raise SandboxSpecRejectedError(
            f"the {(await self.info()).kind} provider cannot change a session's egress policy"
        )

    async def usage(self) -> dict[str, Any]:
        """What the session uses now, as far as the provider can tell (see :data:`USAGE_FIELDS`).

        Bounded in cost (the provider's engine timeout, a bounded walk); a field the provider
        cannot measure is None and ``note`` says why. The default knows nothing: ``{}``.
        """
        return {}


class Sandbox(abc.ABC):
    """A provider: creates, finds, lists and reaps sessions."""

    #: the kind row's value, e.g. "local" or "docker"
    kind: str = ""
    #: the strongest isolation this provider gives
    max_isolation: SandboxIsolation = "none"
    #: the network settings this provider can honour
    networks: frozenset[str] = frozenset({"egress"})
    #: whether cpu / memory_mb caps can be enforced
    supports_limits: bool = False
    #: the provider's own words where its isolation is weaker than its level says (a vm provider under
    #: emulation); None: none. The status route and the panel show them.
    isolation_note: str | None = None
    #: whether its sessions can be paused and resumed (SandboxSession.pause)
    pausable: bool = False
    #: whether its sessions can be forked (SandboxSession.fork)
    forkable: bool = False
    #: whether it enforces a spec's egress policy (SessionSpec.egress: allow/deny lists, secrets by
    #: placeholder) through an egress gateway; a provider that cannot refuses such a spec (400)
    egress_policy: bool = False
    #: the provider's own words when it refuses an egress policy ("": a plain refusal naming its kind)
    egress_refusal: str = ""
    #: what its egress gateway asks of the server (a secret's real value, where audit lines go); the
    #: gate sets it (GatedSandbox), None until then
    egress_hooks: EgressHooks | None = None

    def session_limits(self) -> SessionLimits:
        """What this provider can give a session, as data (its isolation, networks, cpu and memory bounds and
        defaults, images): the policy decides a spec within them, and :meth:`create` runs
        the policy's ``within_limits(spec, self.session_limits())`` itself for a spec handed to it directly. A provider with settings of
        its own (maxima, defaults, an image list) overrides this."""
        return SessionLimits(
            kind=self.kind,
            settings=type(self).__name__,
            max_isolation=self.max_isolation,
            networks=frozenset(self.networks),
            supports_limits=self.supports_limits,
            egress_policy=self.egress_policy,
            egress_refusal=self.egress_refusal,
        )

    def image_allowed(self, image: str | None) -> bool:
        """Whether a non-admin caller may ask for ``image`` (the operator's allow-list); any by default."""
        return self.session_limits().image_allowed(image)

    @abc.abstractmethod
    async def create(self, spec: SessionSpec) -> SandboxSession: ...

    @abc.abstractmethod
    async def get(self, session_id: str) -> SandboxSession:
        """The live session; SandboxNotFoundError when there is none."""

    @abc.abstractmethod
    async def list(self) -> list[SessionInfo]: ...

    @abc.abstractmethod
    async def reap(self) -> builtins.list[str]:
        """Destroy every session past its TTL (persistent workspaces survive); return their ids."""

    async def check_available(self) -> None:  # noqa: B027 - optional hook
        """Raise SandboxUnavailableError when the provider cannot serve now (its engine unreachable);
        the status route asks, so it says the provider is down before a create waits for it."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release provider resources at server shutdown (sessions are left to their TTL)."""
