"""The one error table: every error a door can answer, its HTTP status and its JSON body.

REST handlers, the exec websocket and the code-tool routes answer errors through
:func:`error_status` and :func:`error_body`; :mod:`jupyter_tai_sandbox.client`
turns a body back into the same class with :func:`error_from_json`. The
contract's own errors live in :mod:`jupyter_tai_sandbox.contract`; the errors
only the server and the tools raise live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from http.client import responses
from typing import Any

from . import contract
from .contract import (
    OutputTooLargeError,
    SandboxConflictError,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
)

# ------------------------------------------------------------ server errors


class SandboxForbiddenError(SandboxError):
    """The caller may not do this (another consumer's label, the admin fence, ...)."""


class SandboxAuthenticationError(SandboxForbiddenError):
    """The request carries no valid credential (the server's token missing or wrong, or a cookie without
    its _xsrf token): 403, as jupyter_server answers; the message says how to pass the token."""


#: how a caller passes the server's token, for the messages that say it is missing
TOKEN_HOW = (
    "pass the server's token as the header 'Authorization: token <TOKEN>' or as '?token=<TOKEN>' "
    "(jupyter server list shows it)"
)


class SandboxQuotaError(SandboxError):
    """An operator limit on how much a user may hold at once (live sessions, ...)."""


class SandboxCapacityError(SandboxUnavailableError):
    """An operator-sized resource of the whole deployment is used up (the session network range, ...):
    503, and the message names the setting to configure."""


class UploadTooLargeError(SandboxError):
    """An upload larger than SandboxApp.max_upload_bytes."""


# -------------------------------------------------------------- tool errors


class ToolAccessDeniedError(SandboxForbiddenError):
    """The fenced admin tier refused the acting principal."""


class PresetInvalidError(SandboxSpecRejectedError):
    """A preset definition refused at authoring time."""


class PresetConflictError(SandboxConflictError):
    """The preset's name is taken (a base tool, a config preset, or a stored one without replace)."""


class ToolInputError(SandboxSpecRejectedError):
    """The caller's input fails the tool's declared schema; ``field`` names the failing field."""

    def __init__(self, field: str, message: str) -> None:
        where = f"input field {field!r}" if field else "the input"
        super().__init__(f"{where}: {message}")
        self.field = field
        self.details = {"field": field}


class PresetStoreError(SandboxError):
    """The preset store on disk cannot be read or written."""


# ------------------------------------------------------------------ the table

#: Most specific first: the first class an error is an instance of gives its status.
STATUS_TABLE: tuple[tuple[type[BaseException], int], ...] = (
    (ToolInputError, 422),
    (SandboxRequestError, 400),
    (SandboxSpecRejectedError, 400),
    (SandboxPathError, 400),
    (SandboxForbiddenError, 403),
    (SandboxNotFoundError, 404),
    (SandboxConflictError, 409),
    (UploadTooLargeError, 413),
    (OutputTooLargeError, 413),
    (SandboxQuotaError, 429),
    (SandboxUnavailableError, 503),
    (SandboxExecTimeoutError, 504),
    (SandboxError, 500),
)

#: Every error class a body may name, by name (what the client maps back).
ERROR_CLASSES: dict[str, type[SandboxError]] = {
    cls.__name__: cls
    for cls in (
        *(getattr(contract, name) for name in contract.__all__ if name.endswith("Error")),
        SandboxForbiddenError,
        SandboxAuthenticationError,
        SandboxQuotaError,
        SandboxCapacityError,
        UploadTooLargeError,
        ToolAccessDeniedError,
        PresetInvalidError,
        PresetConflictError,
        ToolInputError,
        PresetStoreError,
    )
}


def error_status(error: BaseException | None, fallback: int = 500) -> int:
    """The HTTP status of an error: the one place where errors become status codes."""
    status_code = getattr(error, "status_code", None)  # tornado's HTTPError
    if not isinstance(error, SandboxError) and isinstance(status_code, int):
        return status_code
    for kind, status in STATUS_TABLE:
        if isinstance(error, kind):
            return status
    return fallback


def error_body(error: BaseException | None, status: int) -> dict[str, Any]:
    """``{"error": "<ErrorClass>", "message": "..."}``, with the error's own fields (field, byte counts)."""
    if isinstance(error, SandboxError):
        body: dict[str, Any] = {"error": type(error).__name__, "message": str(error)}
        if isinstance(error, SandboxExecTimeoutError):
            body.update(stdout_bytes=error.stdout_bytes, stderr_bytes=error.stderr_bytes, note=error.note)
        field = getattr(error, "field", None)
        if field is not None:
            body["field"] = field
        body.update(getattr(error, "details", None) or {})
        return body
    log_message = getattr(error, "log_message", None)
    if log_message is not None or getattr(error, "reason", None):
        args = getattr(error, "args", ())
        try:
            message = log_message % args if log_message and args else (log_message or error.reason or "")
        except TypeError:
            message = log_message or ""
        return {"error": "HTTPError", "message": message or responses.get(status, "error")}
    return {"error": "InternalError", "message": responses.get(status, "Internal Server Error")}


def error_from_json(data: Mapping[str, Any], fallback: str | None = None) -> SandboxError:
    """The exception a JSON error body (REST, or a websocket error message) stands for."""
    name, message = str(data.get("error", "")), str(data.get("message", ""))
    cls = ERROR_CLASSES.get(name)
    if cls is SandboxExecTimeoutError:
        return SandboxExecTimeoutError(
            _strip_note(message, data.get("note")),
            stdout_bytes=_int(data.get("stdout_bytes")),
            stderr_bytes=_int(data.get("stderr_bytes")),
            note=data.get("note") or None,
        )
    if cls is OutputTooLargeError:
        exit_code = data.get("exit_code")
        return OutputTooLargeError(
            message,
            stdout_bytes=_int(data.get("stdout_bytes")),
            stderr_bytes=_int(data.get("stderr_bytes")),
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )
    if cls is ToolInputError:
        error = ToolInputError(str(data.get("field") or ""), "")
        error.args = (message,)
        return error
    if cls is PresetInvalidError and isinstance(data.get("problems"), list):
        error = PresetInvalidError(message)
        error.problems = [str(p) for p in data["problems"]]  # type: ignore[attr-defined]
        error.details = {"problems": error.problems}  # type: ignore[attr-defined]
        return error
    if cls is SandboxRequestError:
        field = data.get("field")
        return SandboxRequestError(message, field=field if isinstance(field, str) else None)
    if cls is not None:
        return cls(message)
    return SandboxError(fallback or f"{name}: {message}")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _strip_note(message: str, note: Any) -> str:
    """The timeout's message without the note the server appended (the error adds it again)."""
    suffix = f" ({note})" if note else ""
    return message[: -len(suffix)] if suffix and message.endswith(suffix) else message


__all__ = [
    "ERROR_CLASSES",
    "STATUS_TABLE",
    "OutputTooLargeError",
    "PresetConflictError",
    "PresetInvalidError",
    "PresetStoreError",
    "SandboxCapacityError",
    "SandboxConflictError",
    "SandboxForbiddenError",
    "SandboxQuotaError",
    "SandboxRequestError",
    "ToolAccessDeniedError",
    "ToolInputError",
    "UploadTooLargeError",
    "error_body",
    "error_from_json",
    "error_status",
]
