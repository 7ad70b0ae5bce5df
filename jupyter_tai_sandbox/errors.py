"""The one error table: every error a door can answer, its HTTP status and its JSON body.

REST handlers, the exec websocket and the code-tool routes answer errors through
:func:`error_status` and :func:`error_body`; :mod:`jupyter_tai_sandbox.client`
turns a body back into the same class with :func:`error_from_json`. Each error
owns its body (:meth:`SandboxError.to_json`, :meth:`SandboxError.from_json`);
this module keeps the two maps: :data:`STATUS_TABLE` (error to HTTP status) and
:data:`ERROR_CLASSES` (a body's name to its class). The contract's own errors
live in :mod:`jupyter_tai_sandbox.contract.errors` (re-exported here and from
:mod:`jupyter_tai_sandbox.contract`); the errors only the server and the tools
raise live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from http.client import responses
from typing import Any

from .contract import errors as contract_errors
from .contract.errors import (
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
)

# ------------------------------------------------------------ server errors


class SandboxAuthenticationError(SandboxForbiddenError):
    """The request carries no valid credential (the server's token missing or wrong, or a cookie without
    its _xsrf token): 403, as jupyter_server answers; the message says how to pass the token."""


#: how a caller passes the server's token, for the messages that say it is missing
TOKEN_HOW = (
    "pass the server's token as the header 'Authorization: token <TOKEN>' or as '?token=<TOKEN>' "
    "(jupyter server list shows it)"
)


class SandboxSessionGoneError(SandboxNotFoundError):
    """The session a command ran in is gone under it: ``reason`` is ``ttl`` (it reached its TTL and was
    reaped) or ``destroyed``. A 404 (a SandboxNotFoundError) whose message says which."""

    REASONS = ("ttl", "destroyed")

    def __init__(self, session_id: str, reason: str, message: str | None = None) -> None:
        if message is None:
            message = (
                f"session {session_id} reached its TTL and was reaped"
                if reason == "ttl"
                else f"session {session_id} was destroyed"
            )
        super().__init__(message, details={"session_id": session_id, "reason": reason})
        self.session_id = session_id
        self.reason = reason

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> SandboxSessionGoneError:
        return cls(str(data.get("session_id") or ""), str(data.get("reason") or "destroyed"), message)


class UploadTooLargeError(SandboxError):
    """An upload larger than SandboxApp.max_upload_bytes."""


class HandoffTooLargeError(UploadTooLargeError):
    """A workspace handoff (contents to a session, or back) over SandboxApp.handoff_max_bytes or
    handoff_max_files (checked on the listing, before any file is copied): 413, the message names the setting."""


# ----------------------------------------------------------- preview errors


class PreviewSessionGoneError(SandboxError):
    """A web preview's session is gone (destroyed, reaped, or never was): 410, so a preview URL of a session
    that ended answers as gone and never reaches another app."""


class PreviewUpstreamError(SandboxError):
    """A web preview's app could not be reached or broke: nothing listening on the port in the session, the
    connection reset, or an answer that is not HTTP/1.1 (502)."""


class PreviewIdleTimeoutError(SandboxError):
    """A web preview's app sent no byte, and took none, for PreviewSettings.idle_timeout_seconds (504)."""


class PreviewBodyTooLargeError(UploadTooLargeError):
    """A request body to a web preview over PreviewSettings.max_request_body_bytes (413)."""


class PreviewGrantError(SandboxForbiddenError):
    """A request on a per-session preview origin (PreviewSettings.origin_template) without a valid grant: a
    one-time code used already, expired or for another session port; no valid cookie of that host; an
    action the Authorizer did not grant; an unsafe method or websocket from another origin (403)."""


class PreviewConnectionsError(SandboxQuotaError):
    """One connection more to web previews than PreviewSettings.max_connections_per_session or
    max_connections_per_user allows (429)."""


# -------------------------------------------------------------- tool errors


class ToolAccessDeniedError(SandboxForbiddenError):
    """The fenced admin tier refused the acting principal."""


class PresetInvalidError(SandboxSpecRejectedError):
    """A preset definition refused at authoring time; ``problems`` names each problem found, when known."""

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message, details=None if problems is None else {"problems": list(problems)})
        self.problems = None if problems is None else list(problems)

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> PresetInvalidError:
        problems = data.get("problems")
        return cls(message, problems=[str(p) for p in problems] if isinstance(problems, list) else None)


class PresetConflictError(SandboxConflictError):
    """The preset's name is taken (a base tool, a config preset, or a stored one without replace)."""


class ToolInputError(SandboxSpecRejectedError):
    """The caller's input fails the tool's declared schema; ``field`` names the failing field."""

    def __init__(self, field: str, message: str) -> None:
        where = f"input field {field!r}" if field else "the input"
        super().__init__(f"{where}: {message}", details={"field": field})
        self.field = field

    @classmethod
    def _from_json_fields(cls, message: str, data: Mapping[str, Any]) -> ToolInputError:
        error = cls(str(data.get("field") or ""), "")
        error.args = (message,)  # the message names the field already
        return error


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
    (PreviewSessionGoneError, 410),
    (SandboxNotFoundError, 404),
    (SandboxConflictError, 409),
    (UploadTooLargeError, 413),
    (OutputTooLargeError, 413),
    (SandboxQuotaError, 429),
    (PreviewUpstreamError, 502),
    (SandboxUnavailableError, 503),
    (PreviewIdleTimeoutError, 504),
    (SandboxExecTimeoutError, 504),
    (SandboxError, 500),
)

#: Every error class a body may name, by name (what the client maps back): the one place a class is
#: registered for the wire; how its body looks is the class's own (``to_json``/``from_json``).
ERROR_CLASSES: dict[str, type[SandboxError]] = {
    cls.__name__: cls
    for cls in (
        *(getattr(contract_errors, name) for name in contract_errors.__all__),
        SandboxAuthenticationError,
        SandboxSessionGoneError,
        UploadTooLargeError,
        HandoffTooLargeError,
        ToolAccessDeniedError,
        PresetInvalidError,
        PresetConflictError,
        ToolInputError,
        PresetStoreError,
        PreviewSessionGoneError,
        PreviewUpstreamError,
        PreviewIdleTimeoutError,
        PreviewBodyTooLargeError,
        PreviewConnectionsError,
        PreviewGrantError,
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
    """``{"error": "<ErrorClass>", "message": "..."}``, with the error's own fields (field, byte counts):
    a SandboxError's :meth:`~SandboxError.to_json`; for anything else, what a client may be shown."""
    if isinstance(error, SandboxError):
        return error.to_json()
    log_message = getattr(error, "log_message", None)
    reason = getattr(error, "reason", None)
    if log_message is not None or reason:
        args = getattr(error, "args", ())
        try:
            message = log_message % args if log_message and args else (log_message or reason or "")
        except TypeError:
            message = log_message or ""
        return {"error": "HTTPError", "message": message or responses.get(status, "error")}
    return {"error": "InternalError", "message": responses.get(status, "Internal Server Error")}


def error_from_json(data: Mapping[str, Any], fallback: str | None = None) -> SandboxError:
    """The exception a JSON error body (REST, or a websocket error message) stands for: the class
    :data:`ERROR_CLASSES` names, built by its :meth:`~SandboxError.from_json`; a plain SandboxError
    (``fallback``, or the name and message) for a name not in the table."""
    name = str(data.get("error", ""))
    cls = ERROR_CLASSES.get(name)
    if cls is None:
        return SandboxError(fallback or f"{name}: {data.get('message', '')!s}")
    return cls.from_json(data)


__all__ = [
    "ERROR_CLASSES",
    "STATUS_TABLE",
    "TOKEN_HOW",
    "HandoffTooLargeError",
    "OutputTooLargeError",
    "PresetConflictError",
    "PresetInvalidError",
    "PresetStoreError",
    "PreviewBodyTooLargeError",
    "PreviewConnectionsError",
    "PreviewGrantError",
    "PreviewIdleTimeoutError",
    "PreviewSessionGoneError",
    "PreviewUpstreamError",
    "SandboxAuthenticationError",
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
    "SandboxSessionGoneError",
    "SandboxSpecRejectedError",
    "SandboxUnavailableError",
    "SandboxUnsupportedError",
    "ToolAccessDeniedError",
    "ToolInputError",
    "UploadTooLargeError",
    "error_body",
    "error_from_json",
    "error_status",
]
