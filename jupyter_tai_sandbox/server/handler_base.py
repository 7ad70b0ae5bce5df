"""What every sandbox handler shares: typed access to the extension's state, JSON errors, activity.

Handlers reach the app's session registry, policy and tools through
:class:`SandboxHandlerMixin` (as jupyter_server_terminals' ``TerminalsMixin``
reaches its manager), never through string keys in ``settings``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from jupyter_core.utils import ensure_async
from jupyter_server.extension.handler import ExtensionHandlerMixin

from ..contract import SandboxError
from ..errors import TOKEN_HOW, SandboxAuthenticationError, SandboxRequestError, error_body, error_status
from ..sessions import ADMIN_RESOURCE, AUTH_RESOURCE, Caller, principal_name

if TYPE_CHECKING:
    from jupyter_server.base.handlers import JupyterHandler

    from ..policy import SandboxPolicy
    from ..sandboxes import SandboxAccess
    from ..sessions import SessionRegistry
    from ..tools import ToolRegistry
    from .execs import LiveCommands

    # the mixins below are checked as the handlers they are mixed into (every one is a JupyterHandler)
    _Handler = JupyterHandler
else:
    _Handler = object


class SandboxAppState(Protocol):
    """What handlers use of the extension app (SandboxApp), named without importing it."""

    registry: SessionRegistry
    policy: SandboxPolicy
    tools: ToolRegistry
    execs: LiveCommands
    access: SandboxAccess
    max_upload_bytes: int

    def touch(self) -> None: ...


__all__ = ["ADMIN_RESOURCE", "AUTH_RESOURCE", "JSONErrorsMixin", "SandboxHandlerMixin", "parse_json_object"]


_ADMIN_ACTIONS = ("read", "write", "execute")


class SandboxHandlerMixin(ExtensionHandlerMixin):
    """The extension's state, typed, and who the request acts for."""

    _caller: Caller | None = None

    async def caller(self) -> Caller:
        """The request's principal, with the admin actions the Authorizer grants it (asked once)."""
        if self._caller is None:
            handler: Any = self
            user = handler.current_user
            granted = set()
            for action in _ADMIN_ACTIONS:
                if await ensure_async(
                    handler.authorizer.is_authorized(handler, user, action, ADMIN_RESOURCE)
                ):
                    granted.add(action)
            self._caller = Caller(principal_name(handler.identity_provider, user), frozenset(granted))
        return self._caller

    @property
    def sandbox_app(self) -> SandboxAppState:
        return cast("SandboxAppState", self.extensionapp)

    @property
    def sessions(self) -> SessionRegistry:
        return self.sandbox_app.registry

    @property
    def policy(self) -> SandboxPolicy:
        return self.sandbox_app.policy

    @property
    def tools(self) -> ToolRegistry:
        return self.sandbox_app.tools

    def touch(self) -> None:
        """Record sandbox use, so idle culling (the server's and JupyterHub's) sees it."""
        self.sandbox_app.touch()


class JSONErrorsMixin(_Handler):
    """Errors answered as ``{"error": ..., "message": ...}`` with their status; expected ones logged briefly."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        status = error_status(error, status_code)
        if status == 403 and not isinstance(error, SandboxError):
            error = self._authentication_error(error) or error
        body = error_body(error, status)
        if 400 <= status < 500:
            self._tell_refusal(body, status)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def _tell_refusal(self, body: dict[str, Any], status: int) -> None:
        """A 4xx is a refusal: told to the gate's listeners (the audit log), owner the principal refused."""
        try:
            gate = self.extensionapp.access.gate  # type: ignore[attr-defined]  # the sandbox handlers' mixin
            if gate is None or not gate.events.active:
                return
            from tornado.websocket import WebSocketHandler

            from ..events import REFUSAL

            caller = getattr(self, "_caller", None)
            name = caller.name if caller is not None else None
            gate.tell(
                REFUSAL,
                session=(self.path_kwargs or {}).get("session_id"),
                owner=name,
                actor=name,
                door="websocket" if isinstance(self, WebSocketHandler) else "rest",
                error=body.get("error"),
                message=body.get("message"),
                status=status,
                request=f"{self.request.method} {self.request.path}",
            )
        except Exception:  # an error answer never fails for its audit line
            self.log.debug("sandbox: the refusal could not be told", exc_info=True)

    def _authentication_error(self, error: BaseException | None) -> SandboxAuthenticationError | None:
        """jupyter_server's bare 403 for a request with no valid token, or its _xsrf refusal, as a typed
        error saying the token is missing or wrong and how to pass it; None for an authorizer's refusal."""
        message = str(getattr(error, "log_message", None) or "")
        try:
            user = self.current_user
        except Exception:  # the user was never resolved (the refusal came first)
            user = None
        if user is None:
            return SandboxAuthenticationError(f"the server's token is missing or wrong: {TOKEN_HOW}")
        if "_xsrf" in message:
            return SandboxAuthenticationError(
                f"{message}: a request logged in by cookie alone needs the _xsrf token (the X-XSRFToken "
                f"header); a script or agent should {TOKEN_HOW}"
            )
        return None

    #: set when the request ended in an expected error, already logged in one line (see quiet_log_request)
    expected_error: bool = False

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        status = error_status(value)
        if (isinstance(value, SandboxError) and status != 500) or status == 504:
            # an expected outcome (a bad field, a deadline, the engine down or slow): one line, no traceback;
            # what the operator may need to act on (a 5xx: the engine, a used-up range) at warning
            request = self.request
            level = logging.WARNING if status >= 500 and status != 504 else logging.INFO
            self.log.log(level, "%s %s: %d %s: %s", request.method, request.path, status, typ.__name__, value)
            self.expected_error = True
        else:
            super().log_exception(typ, value, tb)


def quiet_log_request(log_request: Callable[[Any], None]) -> Callable[[Any], None]:
    """The server's request log, except that a 5xx an expected error gave (logged already, in one line by
    log_exception) is a debug line, without jupyter_server's ERROR line and request headers."""

    def log(handler: Any) -> None:
        if getattr(handler, "expected_error", False) and handler.get_status() >= 500:
            request = handler.request
            handler.log.debug(
                "%d %s %s %.2fms", handler.get_status(), request.method, request.path,
                1000.0 * request.request_time(),
            )  # fmt: skip
            return
        log_request(handler)

    log.quiet_for_expected_errors = True  # type: ignore[attr-defined]  # a mark on the function, read by getattr
    return log


def parse_json_object(body: bytes | None, what: str = "the request body") -> dict[str, Any]:
    """A request body as a JSON object, or SandboxRequestError saying what is wrong with it."""
    try:
        data = json.loads(body or b"{}")
    except UnicodeDecodeError:
        raise SandboxRequestError(f"{what} is not UTF-8") from None
    except (ValueError, RecursionError) as e:
        raise SandboxRequestError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise SandboxRequestError(f"{what} must be a JSON object")
    return data
