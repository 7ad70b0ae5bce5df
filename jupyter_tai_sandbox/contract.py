"""The sandbox contract: what every provider gives and every consumer may rely on.

A provider implements :class:`Sandbox` (sessions) and :class:`SandboxSession`
(exec, files, teardown). Consumers never construct providers themselves; they
call :func:`jupyter_tai_sandbox.sandboxes.require_sandbox`, which hands out the
installed provider behind the policy gate.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

SandboxIsolation = Literal["none", "container", "vm"]
SandboxNetwork = Literal["egress", "internal", "none"]
SandboxDurability = Literal["ephemeral", "persistent"]
OutputStream = Literal["stdout", "stderr"]

#: Isolation levels, weakest first: a provider giving level N satisfies every level <= N.
ISOLATION_ORDER: tuple[str, ...] = get_args(SandboxIsolation)
#: Network reach, narrowest first: a ceiling of N admits every request <= N.
NETWORK_ORDER: tuple[str, ...] = ("none", "internal", "egress")
DURABILITIES: tuple[str, ...] = get_args(SandboxDurability)

DEFAULT_TTL_SECONDS = 3600.0
WORKSPACE_KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --------------------------------------------------------------------- errors


class SandboxError(Exception):
    """Base of every error the sandbox layer raises."""


class SandboxUnavailableError(SandboxError):
    """No provider is installed, or the installed one cannot be reached."""


class SandboxSpecRejectedError(SandboxError):
    """The session spec (or an argument) asks for something that cannot be honoured."""


class SandboxNotFoundError(SandboxError):
    """No such session (or file inside a session's workspace)."""


class SandboxPathError(SandboxError):
    """A workspace path that cannot be used: outside the workspace, or of the wrong kind."""


class SandboxExecTimeoutError(SandboxError):
    """The command was still running at its deadline and was killed.

    Carries byte counts, never the output itself. ``note`` is set when a process
    the command started still held its output after the kill, so the counts only
    cover what was received up to the stop.
    """

    def __init__(
        self,
        message: str,
        *,
        stdout_bytes: int,
        stderr_bytes: int,
        note: str | None = None,
    ) -> None:
        super().__init__(message if not note else f"{message} ({note})")
        self.stdout_bytes = stdout_bytes
        self.stderr_bytes = stderr_bytes
        self.note = note


# ---------------------------------------------------------------- value types


def isolation_rank(level: str) -> int:
    return ISOLATION_ORDER.index(level)


def network_rank(network: str) -> int:
    return NETWORK_ORDER.index(network)


def _reject(message: str) -> SandboxSpecRejectedError:
    return SandboxSpecRejectedError(message)


@dataclass(frozen=True)
class SessionSpec:
    """What a consumer asks of a session. Validated on construction.

    ``env`` is the credential channel: every command of the session sees it.
    ``isolation=None`` inherits the operator's floor (the policy fills it in).
    """

    image: str | None = None
    isolation: SandboxIsolation | None = None
    network: SandboxNetwork = "egress"
    durability: SandboxDurability = "ephemeral"
    workspace_key: str | None = None
    ttl_seconds: float = DEFAULT_TTL_SECONDS
    cpu: float | None = None
    memory_mb: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    consumer: str = "default"

    def __post_init__(self) -> None:
        if self.isolation is not None and self.isolation not in ISOLATION_ORDER:
            raise _reject(
                f"unknown isolation {self.isolation!r}: use one of {', '.join(ISOLATION_ORDER)} "
                "(or leave it unset to inherit the operator's floor)"
            )
        if self.network not in NETWORK_ORDER:
            raise _reject(f"unknown network {self.network!r}: use one of {', '.join(NETWORK_ORDER)}")
        if self.durability not in DURABILITIES:
            raise _reject(f"unknown durability {self.durability!r}: use 'ephemeral' or 'persistent'")
        if self.durability == "persistent" and not self.workspace_key:
            raise _reject("a persistent session needs a workspace_key naming its volume")
        if self.workspace_key is not None and not WORKSPACE_KEY_PATTERN.match(self.workspace_key):
            raise _reject(
                f"invalid workspace_key {self.workspace_key!r}: use 1-64 letters, digits, '_', '.' "
                "or '-', starting with a letter or digit"
            )
        if self.workspace_key is not None and self.durability != "persistent":
            raise _reject("workspace_key names a persistent workspace: set durability='persistent'")
        if not _is_positive_number(self.ttl_seconds):
            raise _reject(f"ttl_seconds must be a positive number of seconds, not {self.ttl_seconds!r}")
        if self.cpu is not None and not _is_positive_number(self.cpu):
            raise _reject(f"cpu must be a positive number of CPUs, not {self.cpu!r}")
        if self.memory_mb is not None and (
            isinstance(self.memory_mb, bool) or not isinstance(self.memory_mb, int) or self.memory_mb <= 0
        ):
            raise _reject(f"memory_mb must be a positive whole number of MiB, not {self.memory_mb!r}")
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()):
            raise _reject("image must be a non-empty image reference, or unset for the provider's default")
        if not isinstance(self.consumer, str) or not self.consumer or len(self.consumer) > 128:
            raise _reject("consumer must be a non-empty label of at most 128 characters")
        if not isinstance(self.env, Mapping):
            raise _reject("env must be a mapping of variable names to string values")
        for name, value in self.env.items():
            if not isinstance(name, str) or not _ENV_NAME_PATTERN.match(name):
                raise _reject(f"invalid environment variable name {name!r}")
            if not isinstance(value, str) or "\x00" in value:
                raise _reject(f"environment variable {name} must be a string without NUL bytes")
        # A frozen copy, so a caller mutating its dict cannot change a live spec.
        object.__setattr__(self, "env", dict(self.env))

    def replace(self, **changes: Any) -> SessionSpec:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["env"] = dict(self.env)
        return data

    def to_public_json(self) -> dict[str, Any]:
        """The spec with env values hidden (names only), for listings and logs."""
        data = self.to_json()
        data["env"] = sorted(self.env)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionSpec:
        if not isinstance(data, Mapping):
            raise _reject("a session spec must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise _reject(
                f"unknown session spec field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        try:
            return cls(**data)
        except TypeError as e:  # pragma: no cover - guarded by the field check above
            raise _reject(str(e)) from None


def _is_positive_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


@dataclass(frozen=True)
class SessionInfo:
    """What a provider reports of a live session."""

    id: str
    kind: str
    spec: SessionSpec
    isolation: SandboxIsolation
    workspace: str
    created_at: float
    expires_at: float

    @property
    def consumer(self) -> str:
        return self.spec.consumer

    @property
    def image(self) -> str | None:
        return self.spec.image

    @property
    def durability(self) -> SandboxDurability:
        return self.spec.durability

    @property
    def workspace_key(self) -> str | None:
        return self.spec.workspace_key

    def seconds_left(self, now: float | None = None) -> float:
        return max(0.0, self.expires_at - (time.time() if now is None else now))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "consumer": self.consumer,
            "image": self.image,
            "isolation": self.isolation,
            "network": self.spec.network,
            "durability": self.durability,
            "workspace_key": self.workspace_key,
            "workspace": self.workspace,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "seconds_left": self.seconds_left(),
            "spec": self.spec.to_public_json(),
        }


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class OutputChunk:
    stream: OutputStream
    data: bytes


@dataclass(frozen=True)
class ExitItem:
    exit_code: int


OutputItem = OutputChunk | ExitItem


# ------------------------------------------------------------------ interfaces


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


class SandboxSession(abc.ABC):
    """One live session: a workspace, exec and file transfer, until destroyed or reaped."""

    @property
    @abc.abstractmethod
    def id(self) -> str: ...

    @abc.abstractmethod
    async def info(self) -> SessionInfo: ...

    @abc.abstractmethod
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

    @abc.abstractmethod
    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        pty: bool = False,
    ) -> ExecHandle:
        """Start ``argv`` and return its handle."""

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
    def resolve(self, path: str) -> str:
        """The absolute path of ``path`` as the session's commands see it; SandboxError outside the workspace."""

    @abc.abstractmethod
    async def destroy(self, remove_workspace: bool = False) -> None:
        """Tear the session down; a persistent workspace survives unless ``remove_workspace``."""


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

    def check_spec(self, spec: SessionSpec) -> None:
        """Reject (loudly) a spec this provider cannot honour; never downgrade it."""
        wanted = spec.isolation or self.max_isolation
        if isolation_rank(wanted) > isolation_rank(self.max_isolation):
            raise SandboxSpecRejectedError(
                f"the {self.kind} provider gives isolation {self.max_isolation!r} at most; "
                f"isolation {wanted!r} was requested (lower TAI_MCP_SANDBOX_ISOLATION or install a "
                "stronger provider)"
            )
        if spec.network not in self.networks:
            raise SandboxSpecRejectedError(
                f"the {self.kind} provider cannot honour network={spec.network!r}; it supports "
                f"{', '.join(sorted(self.networks))}"
            )
        if not self.supports_limits and (spec.cpu is not None or spec.memory_mb is not None):
            raise SandboxSpecRejectedError(
                f"the {self.kind} provider cannot enforce cpu/memory_mb caps and never runs a capped "
                "request uncapped: drop the caps or use a container provider"
            )

    def effective_isolation(self, spec: SessionSpec) -> SandboxIsolation:
        return spec.isolation or self.max_isolation

    @abc.abstractmethod
    async def create(self, spec: SessionSpec) -> SandboxSession: ...

    @abc.abstractmethod
    async def get(self, session_id: str) -> SandboxSession:
        """The live session; SandboxNotFoundError when there is none."""

    @abc.abstractmethod
    async def list(self) -> list[SessionInfo]: ...

    @abc.abstractmethod
    async def reap(self) -> list[str]:
        """Destroy every session past its TTL (persistent workspaces survive); return their ids."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release provider resources at server shutdown (sessions are left to their TTL)."""


__all__ = [
    "DEFAULT_TTL_SECONDS",
    "ISOLATION_ORDER",
    "NETWORK_ORDER",
    "ExecHandle",
    "ExecResult",
    "ExitItem",
    "OutputChunk",
    "OutputItem",
    "Sandbox",
    "SandboxDurability",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxIsolation",
    "SandboxNetwork",
    "SandboxNotFoundError",
    "SandboxPathError",
    "SandboxSession",
    "SandboxSpecRejectedError",
    "SandboxUnavailableError",
    "SessionInfo",
    "SessionSpec",
]
