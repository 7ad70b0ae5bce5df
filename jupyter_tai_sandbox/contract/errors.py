"""The contract's errors: what a provider raises and a consumer catches, each owning its JSON.

Every error is a :class:`SandboxError`. Its JSON body is
``{"error": "<ErrorClass>", "message": "...", **details}``: :meth:`SandboxError.to_json`
writes it and :meth:`SandboxError.from_json` reads it back into the same class
with the same fields. A class with fields of its own (byte counts, the failing
field, ...) keeps them in :attr:`SandboxError.details` and overrides one hook,
:meth:`SandboxError._from_json_fields`; nothing else needs to know about it.

The HTTP status of each error, and the table of names a body may carry, are the
doors': :mod:`jupyter_tai_sandbox.errors`. Import these classes from
:mod:`jupyter_tai_sandbox.contract` (or :mod:`jupyter_tai_sandbox.errors`); both
re-export them. The refusals every provider and door words alike (an unknown session,
isolation over what the provider gives) are built here too, so each reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

_E = TypeVar("_E", bound="SandboxError")
_Raised = TypeVar("_Raised", bound=BaseException)


class SandboxError(Exception):
    """Base of every error the sandbox layer raises.

    ``details`` holds the error's JSON-safe fields beyond its message; they are the extra keys
    of its JSON body, in order.
    """

    def __init__(self, *args: object, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(*args)
        self.details: dict[str, Any] = dict(details or {})

    def to_json(self) -> dict[str, Any]:
        """``{"error": "<ErrorClass>", "message": "...", **details}``: the body every door answers."""
        return {"error": type(self).__name__, "message": str(self), **self.details}

    @classmethod
    def from_json(cls: type[_E], data: Mapping[str, Any]) -> _E:
        """This class's error from a JSON body (what :meth:`to_json` gave), with its fields.

        The body's ``error`` name is not read here: :func:`jupyter_tai_sandbox.errors.error_from_json`
        picks the class by it.
        """
        return cls._from_json_fields(str(data.get("message", "")), data)

    @classmethod
    def _from_json_fields(cls: type[_E], message: str, data: Mapping[str, Any]) -> _E:
        """The hook a class with fields overrides: build it from the message and the body's fields."""
        return cls(message)


class SandboxUnavailableError(SandboxError):
    """No provider is installed, or the installed one cannot be reached."""


class SandboxCapacityError(SandboxUnavailableError):
    """An operator-sized resource of the whole deployment is used up (the session network range, ...):
    503, and the message names the setting to configure."""


class SandboxSpecRejectedError(SandboxError):
    """The session spec (or an argument) asks for something that cannot be honoured.

    ``isolation_floor`` is ``(kind, max_isolation, wanted)`` on a refusal of isolation above what
    the provider gives (:func:`isolation_floor_refusal`), so another
    door can re-word its hint; it is not part of the JSON body.
    """

    isolation_floor: tuple[str, str, str] | None = None


class SandboxRequestError(SandboxSpecRejectedError):
    """A malformed request: a field missing, of the wrong type, or out of range.

    ``field`` names the offending field (``argv``, ``timeout_seconds``, ...) when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, details={} if field is None else {"field": field})
        self.field = field

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> SandboxRequestError:
        field = data.get("field")
        return cls(message, field=field if isinstance(field, str) else None)


class SandboxConflictError(SandboxError):
    """The request conflicts with the present state (a workspace in use, a name or path taken, a paused
    session asked to run something)."""


class SandboxUnsupportedError(SandboxSpecRejectedError):
    """The session's provider does not offer this optional operation (``operation``: pause, resume, ...)."""

    def __init__(self, message: str, *, operation: str = "") -> None:
        super().__init__(message, details={"operation": operation})
        self.operation = operation

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> SandboxUnsupportedError:
        return cls(message, operation=str(data.get("operation") or ""))


class SandboxForbiddenError(SandboxError):
    """The caller may not do this (another consumer's label, the admin fence, ...)."""


class SandboxQuotaError(SandboxError):
    """An operator limit on how much a user may hold at once (live sessions, ...)."""


class OutputTooLargeError(SandboxError):
    """A command gave more output than is kept for it (a one-shot's limit, the unread-output cap).

    The command was stopped. Carries the byte counts received and the exit code when there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        stdout_bytes: int = 0,
        stderr_bytes: int = 0,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(
            message,
            details={"stdout_bytes": stdout_bytes, "stderr_bytes": stderr_bytes, "exit_code": exit_code},
        )
        self.stdout_bytes = stdout_bytes
        self.stderr_bytes = stderr_bytes
        self.exit_code = exit_code

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> OutputTooLargeError:
        exit_code = data.get("exit_code")
        return cls(
            message,
            stdout_bytes=_count(data.get("stdout_bytes")),
            stderr_bytes=_count(data.get("stderr_bytes")),
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )


class SandboxNotFoundError(SandboxError):
    """No such session (or file inside a session's workspace)."""


class SandboxPathError(SandboxError):
    """A workspace path that cannot be used: outside the workspace, or of the wrong kind."""


class SandboxPathTooDeepError(SandboxPathError):
    """A workspace path with more than :data:`jupyter_tai_sandbox.contract.MAX_PATH_DEPTH` components
    or :data:`jupyter_tai_sandbox.contract.MAX_PATH_BYTES` bytes, refused before any provider looks
    at it (400)."""


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
        super().__init__(
            message if not note else f"{message} ({note})",
            details={"stdout_bytes": stdout_bytes, "stderr_bytes": stderr_bytes, "note": note},
        )
        self.stdout_bytes = stdout_bytes
        self.stderr_bytes = stderr_bytes
        self.note = note

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> SandboxExecTimeoutError:
        note = data.get("note") or None
        suffix = f" ({note})" if note else ""  # the message carries the note; the constructor adds it again
        if suffix and message.endswith(suffix):
            message = message[: -len(suffix)]
        return cls(
            message,
            stdout_bytes=_count(data.get("stdout_bytes")),
            stderr_bytes=_count(data.get("stderr_bytes")),
            note=note,
        )


def _count(value: Any) -> int:
    """A byte count from a body: an integer (not a bool), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# ---------------------------------------------------------- refusals worded once


def session_gone(session_id: str) -> SandboxNotFoundError:
    """The one 404 for a session id the caller cannot use: never made, expired (reaped), destroyed, or
    another user's; the same words for all, so the message reveals no one else's session."""
    return SandboxNotFoundError(
        f"no sandbox session {str(session_id)[:80]!r} (it may have expired or been destroyed)"
    )


#: How to lower the isolation floor, door by door ({level}: the level to lower it to): a hint names
#: only what works where it is read. "server": a Jupyter server's option (REST, the panel, the MCP
#: door, the magics, a kernel the server starts); "cli": ``jupyter tai-sandbox preset run``; "kernel":
#: a sandboxed kernel a client outside any server starts (jupyter console, a KernelManager script).
ISOLATION_FLOOR_HINTS: dict[str, str] = {
    "server": "--SandboxPolicy.isolation={level} or TAI_MCP_SANDBOX_ISOLATION={level}",
    "cli": "--isolation {level}",
    "kernel": (
        "TAI_MCP_SANDBOX_ISOLATION={level} in the environment of the program that starts the kernel, "
        "or c.SandboxPolicy.isolation = '{level}' in a jupyter_server_config file"
    ),
}


def isolation_floor_refusal(
    kind: str, max_isolation: str, wanted: str, door: str = "server"
) -> SandboxSpecRejectedError:
    """The refusal of a spec over what the provider gives, with the hint valid for ``door``
    (a key of :data:`ISOLATION_FLOOR_HINTS`); ``isolation_floor`` keeps the facts for another door."""
    hint = ISOLATION_FLOOR_HINTS[door].format(level=max_isolation)
    error = SandboxSpecRejectedError(
        f"the {kind} provider gives isolation {max_isolation!r} at most; isolation {wanted!r} was requested. "
        f"Lower the operator's floor to {max_isolation!r} ({hint}), or install a stronger provider"
    )
    error.isolation_floor = (kind, max_isolation, wanted)
    return error


def for_door(error: _Raised, door: str) -> _Raised | SandboxSpecRejectedError:
    """``error`` with its hint made valid for ``door``: an isolation-floor refusal is re-worded, any
    other error is returned as it is."""
    floor = getattr(error, "isolation_floor", None)
    if floor is None:
        return error
    kind, max_isolation, wanted = floor
    return isolation_floor_refusal(kind, max_isolation, wanted, door=door)


#: the error classes (what the server's table registers for the wire); the refusal builders above are not
__all__ = [
    "OutputTooLargeError",
    "SandboxCapacityError",
    "SandboxConflictError",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxForbiddenError",
    "SandboxNotFoundError",
    "SandboxPathError",
    "SandboxPathTooDeepError",
    "SandboxQuotaError",
    "SandboxRequestError",
    "SandboxSpecRejectedError",
    "SandboxUnavailableError",
    "SandboxUnsupportedError",
]
