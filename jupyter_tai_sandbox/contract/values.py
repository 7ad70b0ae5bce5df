"""The contract's values: what a consumer asks for and what a provider answers with.

Every door builds the same typed values (:class:`SessionSpec`, :class:`ExecRequest`), each
validated once on construction; a provider reports :class:`SessionInfo`, :class:`ExecResult`
and the items of an interactive command's output. The limits every provider shares (path
depth, command size, terminal sides) live here beside the values they bound.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard, get_args

from .egress import EgressPolicy
from .errors import SandboxRequestError, SandboxSpecRejectedError

SandboxIsolation = Literal["none", "container", "vm"]
SandboxNetwork = Literal["egress", "internal", "none"]
SandboxDurability = Literal["ephemeral", "persistent"]
OutputStream = Literal["stdout", "stderr"]

#: Isolation levels, weakest first: a provider giving level N satisfies every level <= N.
ISOLATION_ORDER: tuple[SandboxIsolation, ...] = get_args(SandboxIsolation)
#: Network reach, narrowest first: a ceiling of N admits every request <= N.
NETWORK_ORDER: tuple[str, ...] = ("none", "internal", "egress")
DURABILITIES: tuple[str, ...] = get_args(SandboxDurability)

DEFAULT_TTL_SECONDS = 3600.0
WORKSPACE_KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


#: The most components a workspace path may have (``a/b/c`` has 3), on every provider.
MAX_PATH_DEPTH = 128
#: the longest consumer label: room for ``user:`` and a 256-character user name percent-encoded, and a sub-label
MAX_CONSUMER_CHARS = 1024
#: The most bytes (UTF-8) a workspace path may have as given, on every provider (Linux's PATH_MAX).
MAX_PATH_BYTES = 4096


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
    ``owner`` is the principal the session belongs to, set by the doors (never
    by a caller's body); ``None`` (direct Python use) means no owner check.
    ``egress`` (with ``network="egress"``) sends the session out through its owner's egress gateway
    under that policy (:class:`~jupyter_tai_sandbox.contract.egress.EgressPolicy`; a mapping is read as
    its JSON); ``None`` is plain egress, unless the operator's policy gives the session one.
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
    owner: str | None = None
    egress: EgressPolicy | None = None

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
        if self.workspace_key is not None and not (
            isinstance(self.workspace_key, str) and WORKSPACE_KEY_PATTERN.match(self.workspace_key)
        ):
            raise _reject(
                f"invalid workspace_key {self.workspace_key!r}: use 1-64 letters, digits, '_', '.' "
                "or '-', starting with a letter or digit"
            )
        if self.workspace_key is not None and self.durability != "persistent":
            raise _reject("workspace_key names a persistent workspace: set durability='persistent'")
        if not is_positive_number(self.ttl_seconds):
            raise _reject(f"ttl_seconds must be a positive number of seconds, not {self.ttl_seconds!r}")
        if self.cpu is not None and not is_positive_number(self.cpu):
            raise _reject(f"cpu must be a positive number of CPUs, not {self.cpu!r}")
        if self.memory_mb is not None and (
            isinstance(self.memory_mb, bool) or not isinstance(self.memory_mb, int) or self.memory_mb <= 0
        ):
            raise _reject(f"memory_mb must be a positive whole number of MiB, not {self.memory_mb!r}")
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()):
            raise _reject("image must be a non-empty image reference, or unset for the provider's default")
        if not isinstance(self.consumer, str) or not self.consumer or len(self.consumer) > MAX_CONSUMER_CHARS:
            raise _reject(f"consumer must be a non-empty label of at most {MAX_CONSUMER_CHARS} characters")
        if self.owner is not None and (
            not isinstance(self.owner, str) or not self.owner or len(self.owner) > 256 or "\x00" in self.owner
        ):
            raise _reject("owner must be a non-empty user name of at most 256 characters")
        if not isinstance(self.env, Mapping):
            raise _reject("env must be a mapping of variable names to string values")
        for name, value in self.env.items():
            if not isinstance(name, str) or not _ENV_NAME_PATTERN.match(name):
                raise _reject(f"invalid environment variable name {name!r}")
            if not isinstance(value, str) or "\x00" in value:
                raise _reject(f"environment variable {name} must be a string without NUL bytes")
        if self.egress is not None:
            if not isinstance(self.egress, EgressPolicy):
                object.__setattr__(self, "egress", EgressPolicy.from_json(self.egress))
            if self.network != "egress":
                raise _reject(
                    f"an egress policy (allow/deny lists, secrets) needs network='egress', not {self.network!r}"
                )
        # A frozen copy, so a caller mutating its dict cannot change a live spec.
        object.__setattr__(self, "env", dict(self.env))

    def replace(self, **changes: Any) -> SessionSpec:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["env"] = dict(self.env)
        data["egress"] = None if self.egress is None else self.egress.to_json()
        return data

    def to_public_json(self) -> dict[str, Any]:
        """The spec with env values hidden (names only), for listings, logs and a container's labels (its
        egress policy whole: a secret grant holds the secret's name and placeholder, never its value)."""
        data = self.to_json()
        data["env"] = sorted(self.env)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, request: bool = False) -> SessionSpec:
        """The spec of :meth:`to_json` (or :meth:`to_public_json` with env values put back). ``request``: a
        caller's body (a door's), where ``egress`` may not name secrets (the operator grants them)."""
        if not isinstance(data, Mapping):
            raise _reject("a session spec must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise _reject(
                f"unknown session spec field(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        if data.get("egress") is not None:
            data = {**data, "egress": EgressPolicy.from_json(data["egress"], secrets=not request)}
        try:
            return cls(**data)
        except TypeError as e:  # pragma: no cover - guarded by the field check above
            raise _reject(str(e)) from None


def is_positive_number(value: Any) -> TypeGuard[float]:
    """A JSON or Python number that is finite and > 0 (bools, strings and 10**400 are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        value = float(value)
    except OverflowError:  # a JSON integer like 10**400
        return False
    return math.isfinite(value) and value > 0


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
    #: every process of the session is frozen where it was (SandboxSession.pause); its TTL still runs
    paused: bool = False

    @property
    def consumer(self) -> str:
        return self.spec.consumer

    @property
    def image(self) -> str | None:
        return self.spec.image

    @property
    def owner(self) -> str | None:
        return self.spec.owner

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
            "owner": self.owner,
            "image": self.image,
            "isolation": self.isolation,
            "network": self.spec.network,
            "durability": self.durability,
            "workspace_key": self.workspace_key,
            "workspace": self.workspace,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "seconds_left": self.seconds_left(),
            "paused": self.paused,
            "spec": self.spec.to_public_json(),
        }


#: the fields of :meth:`SandboxSession.usage` (a provider fills what it can, None for the rest):
#: cpu_seconds (CPU time used so far), memory_bytes (resident, page cache excluded), memory_limit_bytes,
#: disk_bytes (the workspace), disk_partial (the measure stopped at its bound: a lower bound),
#: note (what could not be measured and why), measured_at (epoch seconds)
USAGE_FIELDS = (
    "cpu_seconds", "memory_bytes", "memory_limit_bytes", "disk_bytes", "disk_partial", "note", "measured_at",
)  # fmt: skip


def usage_record(**measured: Any) -> dict[str, Any]:
    """A usage answer with every field present (None where not measured)."""
    unknown = set(measured) - set(USAGE_FIELDS)
    if unknown:  # pragma: no cover - a provider's mistake
        raise ValueError(f"unknown usage field(s): {sorted(unknown)}")
    record: dict[str, Any] = dict.fromkeys(USAGE_FIELDS)
    record["disk_partial"] = False
    record["measured_at"] = time.time()
    record.update(measured)
    return record


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    #: why the command ended where the status alone does not say it (an OOM kill: :func:`out_of_memory`)
    reason: str | None = None


@dataclass(frozen=True)
class OutputChunk:
    stream: OutputStream
    data: bytes


#: the most bytes of an :class:`ExecRequest`'s label
MAX_LABEL_BYTES = 4096


@dataclass(frozen=True)
class HeldCommand:
    """An interactive command a session holds itself (so it outlives the server that started it), as listed.

    ``offsets`` gives each output stream's ``(oldest byte still held, end)``: an attach can resume anywhere
    in between, nothing skipped or repeated.
    """

    id: str
    label: str | None
    pty: bool
    running: bool
    #: a connection (this server's, or another's) reads it now
    attached: bool
    started: float
    deadline: float | None
    offsets: Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class ExitItem:
    exit_code: int
    #: as :attr:`ExecResult.reason`
    reason: str | None = None


def out_of_memory(limit_mb: int | float | None) -> str:
    """The reason of a command the kernel's OOM killer ended (exit status 137), naming the session's limit."""
    if limit_mb:
        return f"killed: out of memory (the session's limit is {limit_mb:g} MiB)"
    return "killed: out of memory"


OutputItem = OutputChunk | ExitItem

#: A terminal's size when a pty command gives none: rows, columns.
DEFAULT_WINDOW = (24, 80)
#: The largest terminal side accepted (rows or columns).
MAX_WINDOW_SIDE = 10_000
#: Total bytes of argv and env one command may carry, counting a pointer per string as the kernel
#: does (Linux takes 2 MiB with the provider's own environment; this leaves room for it).
MAX_COMMAND_BYTES = 1 << 20
#: The longest single argument or environment string Linux passes (MAX_ARG_STRLEN, 32 pages).
MAX_STRING_BYTES = (128 << 10) - 1


def _bad(field: str, message: str) -> SandboxRequestError:
    return SandboxRequestError(f"{field}: {message}", field=field)


def check_window_side(side: str, value: Any) -> int:
    """A terminal's ``rows`` or ``cols``: a whole number from 1 to MAX_WINDOW_SIDE."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_WINDOW_SIDE:
        raise _bad(side, f"a whole number from 1 to {MAX_WINDOW_SIDE}, not {value!r}")
    return value


def _encoded_size(field: str, text: str) -> int:
    """Bytes of ``text`` as the OS gets it; a lone surrogate (from JSON) cannot be passed at all."""
    try:
        size = len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        raise _bad(field, "contains a lone surrogate that no program can receive") from None
    if size > MAX_STRING_BYTES:
        raise _bad(
            field, f"one string is {size} bytes; a program takes at most {MAX_STRING_BYTES} per string"
        )
    return size


@dataclass(frozen=True)
class ExecRequest:
    """One command as every door asks for it, validated once on construction.

    ``stdin`` is for one-shot runs only; ``pty``, ``rows`` and ``cols`` for
    interactive ones. The operator's timeout ceiling is not the request's: the gated
    session (``jupyter_tai_sandbox.gate``) checks it on every
    run and start. Every bad field raises :class:`SandboxRequestError` naming it.
    """

    #: any sequence of strings (a list from JSON); held as a tuple once checked
    argv: Sequence[str]
    timeout_seconds: float
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None
    pty: bool = False
    rows: int | None = None
    cols: int | None = None
    #: most bytes of output a one-shot run keeps; past it the command is stopped (None: no limit)
    output_limit: int | None = None
    #: the server's own note on an interactive command (never a client's: no JSON field sets it), which a
    #: provider that holds commands (:attr:`SandboxSession.holds_commands`) keeps and lists back
    label: str | None = None

    def __post_init__(self) -> None:
        argv = self.argv
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
            raise _bad("argv", "a list of strings, e.g. ['sh', '-c', 'echo hi'], not a single string")
        argv = tuple(argv)
        if not argv:
            raise _bad("argv", "empty: name the program to run")
        size = 0
        for arg in argv:
            if not isinstance(arg, str):
                raise _bad("argv", f"elements must be strings, got {type(arg).__name__}")
            if "\x00" in arg:
                raise _bad("argv", "elements cannot contain NUL bytes")
            size += _encoded_size("argv", arg) + 1 + 8
        if not argv[0]:
            raise _bad("argv", "argv[0] is empty: name the program to run")
        if not is_positive_number(self.timeout_seconds):
            raise _bad(
                "timeout_seconds", f"a positive number of seconds is required, not {self.timeout_seconds!r}"
            )
        if not isinstance(self.env, Mapping):
            raise _bad("env", "an object of variable names to string values")
        for name, value in self.env.items():
            if not isinstance(name, str) or not _ENV_NAME_PATTERN.match(name):
                raise _bad("env", f"invalid environment variable name {name!r}")
            if not isinstance(value, str) or "\x00" in value:
                raise _bad("env", f"variable {name} must be a string without NUL bytes")
            size += len(name) + _encoded_size("env", value) + 2 + 8
        if size > MAX_COMMAND_BYTES:
            raise _bad("argv", f"argv and env together are {size} bytes; the limit is {MAX_COMMAND_BYTES}")
        if self.cwd is not None and (not isinstance(self.cwd, str) or "\x00" in self.cwd or not self.cwd):
            raise _bad("cwd", "a non-empty workspace path string")
        if self.cwd is not None:
            _encoded_size("cwd", self.cwd)
        stdin = self.stdin
        if isinstance(stdin, (bytearray, memoryview)):
            stdin = bytes(stdin)
        if stdin is not None and not isinstance(stdin, bytes):
            raise _bad("stdin", "bytes (or None for no input)")
        if not isinstance(self.pty, bool):
            raise _bad("pty", "true or false")
        for side in ("rows", "cols"):
            value = getattr(self, side)
            if value is not None:
                check_window_side(side, value)
        if self.output_limit is not None and (
            isinstance(self.output_limit, bool)
            or not isinstance(self.output_limit, int)
            or self.output_limit < 0
        ):
            raise _bad("output_limit", "a whole number of bytes >= 0, or None for no limit")
        if self.label is not None and (
            not isinstance(self.label, str) or len(self.label.encode()) > MAX_LABEL_BYTES
        ):
            raise _bad("label", f"a string of at most {MAX_LABEL_BYTES} bytes")
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "timeout_seconds", float(self.timeout_seconds))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "stdin", stdin)

    @property
    def window(self) -> tuple[int, int]:
        """The terminal size a pty command starts with."""
        return (self.rows or DEFAULT_WINDOW[0], self.cols or DEFAULT_WINDOW[1])

    #: the JSON fields of each kind of request
    ONE_SHOT_FIELDS = frozenset({"argv", "timeout_seconds", "env", "cwd", "stdin", "stdin_b64"})
    INTERACTIVE_FIELDS = frozenset({"argv", "timeout_seconds", "env", "cwd", "pty", "rows", "cols"})

    @classmethod
    def from_json(
        cls,
        data: Any,
        *,
        interactive: bool = False,
        ignore: frozenset[str] = frozenset(),
    ) -> ExecRequest:
        """A request from a JSON object (REST body, websocket start, tool binding).

        ``stdin`` is text and ``stdin_b64`` base64 bytes (one-shot only); fields in
        ``ignore`` belong to the door (``type``, ``encoding``) and are skipped.
        """
        import base64
        import binascii

        if not isinstance(data, Mapping):
            raise SandboxRequestError("an exec request is a JSON object")
        known = cls.INTERACTIVE_FIELDS if interactive else cls.ONE_SHOT_FIELDS
        unknown = sorted(set(data) - known - ignore)
        if unknown:
            raise SandboxRequestError(
                f"unknown field(s): {', '.join(unknown)}; known: {', '.join(sorted(known | ignore))}",
                field=unknown[0],
            )
        if "argv" not in data:
            raise _bad("argv", 'required: a non-empty list of strings, e.g. ["sh", "-c", "echo hi"]')
        if not isinstance(data["argv"], list):
            raise _bad("argv", 'a non-empty list of strings, e.g. ["sh", "-c", "echo hi"]')
        if "timeout_seconds" not in data:
            raise _bad("timeout_seconds", "required: a positive number of seconds")
        stdin: bytes | None = None
        if data.get("stdin") is not None and data.get("stdin_b64") is not None:
            raise _bad("stdin", "give stdin (text) or stdin_b64 (base64 bytes), not both")
        if data.get("stdin") is not None:
            if not isinstance(data["stdin"], str):
                raise _bad("stdin", "a string (use stdin_b64 for bytes)")
            stdin = data["stdin"].encode(errors="surrogatepass")
        elif data.get("stdin_b64") is not None:
            try:
                stdin = base64.b64decode(data["stdin_b64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise _bad("stdin_b64", "not valid base64") from None
        env = data.get("env")
        return cls(
            argv=data["argv"],
            timeout_seconds=data["timeout_seconds"],
            env={} if env is None else env,
            cwd=data.get("cwd"),
            stdin=stdin,
            pty=data.get("pty", False),
            rows=data.get("rows"),
            cols=data.get("cols"),
        )
