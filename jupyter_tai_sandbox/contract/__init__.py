"""The sandbox contract: what every provider gives and every consumer may rely on.

A provider implements :class:`Sandbox` (sessions) and :class:`SandboxSession`
(exec, files, teardown): the interfaces (``interfaces``), over the values every door
builds and every provider answers with (``values``), and the errors each side may raise,
each owning its JSON (``errors``). This face hands all of them on. Consumers never construct providers themselves; they
call :func:`jupyter_tai_sandbox.sandboxes.require_sandbox`, which hands out the
installed provider behind the policy gate.

Glossary
--------
session
    One live workspace with exec, file transfer and a TTL, made by a provider.
consumer
    The label a session is made for; the operator grants credentials per consumer.
owner
    The principal (user) who made a session; only it, or an admin, sees and uses it.
door
    A way in from outside: REST, the exec websocket, the magics, the panel, the CLI,
    the code-tool runs. Every door builds the same typed values (:class:`SessionSpec`,
    :class:`ExecRequest`) and goes through the one chokepoint.
chokepoint
    ``require_sandbox()``: the only way to a provider, behind the operator's policy.
fence
    The admin tier of code tools: authoring or running one needs
    ``jupyter_tai_sandbox:admin``, checked at the tool chokepoints, not per route.
workspace key
    The name of a persistent workspace that outlives sessions, within its owner's names: alice's
    ``notes`` and bob's ``notes`` are two workspaces (see ``providers/_workspaces``).
egress policy
    A session's allow and deny lists of host names and the operator's secrets granted to it
    (:class:`EgressPolicy`), enforced by its owner's egress gateway (providers that have one).
holder
    The small shell process a provider keeps in a command's process group, so the
    group keeps its id (and a stop never signals a reused one) until the handle is done.
"""

from .egress import EgressHooks, EgressPolicy, SecretGrant
from .errors import (
    ISOLATION_FLOOR_HINTS,
    OutputTooLargeError,
    SandboxCapacityError,
    SandboxConflictError,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxForbiddenError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxPathTooDeepError,
    SandboxQuotaError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SandboxUnsupportedError,
    for_door,
    isolation_floor_refusal,
    session_gone,
)
from .interfaces import (
    ExecHandle,
    PortConnection,
    Sandbox,
    SandboxSession,
)
from .limits import SessionLimits, normal_image
from .values import (
    DEFAULT_TTL_SECONDS,
    DEFAULT_WINDOW,
    DURABILITIES,
    ISOLATION_ORDER,
    MAX_COMMAND_BYTES,
    MAX_CONSUMER_CHARS,
    MAX_PATH_BYTES,
    MAX_PATH_DEPTH,
    MAX_STRING_BYTES,
    MAX_WINDOW_SIDE,
    NETWORK_ORDER,
    USAGE_FIELDS,
    WORKSPACE_KEY_PATTERN,
    ExecRequest,
    ExecResult,
    ExitItem,
    HeldCommand,
    OutputChunk,
    OutputItem,
    OutputStream,
    SandboxDurability,
    SandboxIsolation,
    SandboxNetwork,
    SessionInfo,
    SessionSpec,
    check_window_side,
    is_positive_number,
    isolation_rank,
    network_rank,
    out_of_memory,
    usage_record,
)

__all__ = [
    "DEFAULT_TTL_SECONDS",
    "DEFAULT_WINDOW",
    "DURABILITIES",
    "ISOLATION_FLOOR_HINTS",
    "ISOLATION_ORDER",
    "MAX_COMMAND_BYTES",
    "MAX_CONSUMER_CHARS",
    "MAX_PATH_BYTES",
    "MAX_PATH_DEPTH",
    "MAX_STRING_BYTES",
    "MAX_WINDOW_SIDE",
    "NETWORK_ORDER",
    "USAGE_FIELDS",
    "WORKSPACE_KEY_PATTERN",
    "EgressHooks",
    "EgressPolicy",
    "ExecHandle",
    "ExecRequest",
    "ExecResult",
    "ExitItem",
    "HeldCommand",
    "OutputChunk",
    "OutputItem",
    "OutputStream",
    "OutputTooLargeError",
    "PortConnection",
    "Sandbox",
    "SandboxCapacityError",
    "SandboxConflictError",
    "SandboxDurability",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxForbiddenError",
    "SandboxIsolation",
    "SandboxNetwork",
    "SandboxNotFoundError",
    "SandboxPathError",
    "SandboxPathTooDeepError",
    "SandboxQuotaError",
    "SandboxRequestError",
    "SandboxSession",
    "SandboxSpecRejectedError",
    "SandboxUnavailableError",
    "SandboxUnsupportedError",
    "SecretGrant",
    "SessionInfo",
    "SessionLimits",
    "SessionSpec",
    "check_window_side",
    "for_door",
    "is_positive_number",
    "isolation_floor_refusal",
    "isolation_rank",
    "network_rank",
    "normal_image",
    "out_of_memory",
    "session_gone",
    "usage_record",
]
