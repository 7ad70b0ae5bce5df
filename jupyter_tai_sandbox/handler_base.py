"""What every sandbox handler shares: typed access to the extension's state, JSON errors, activity.

Handlers reach the app's session registry, policy and tools through
:class:`SandboxHandlerMixin` (as jupyter_server_terminals' ``TerminalsMixin``
reaches its manager), never through string keys in ``settings``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol, cast

from jupyter_core.utils import ensure_async
from jupyter_server.extension.handler import ExtensionHandlerMixin

from .contract import SandboxError
from .errors import TOKEN_HOW, SandboxAuthenticationError, SandboxRequestError, error_body, error_status
from .sessions import ADMIN_RESOURCE, AUTH_RESOURCE, Caller, principal_name

if TYPE_CHECKING:
    from .execs import ExecRegistry
    from .policy import SandboxPolicy
    from .sessions import SessionRegistry
    from .tools import ToolRegistry


class SandboxAppState(Protocol):
    """What handlers use of the extension app (SandboxApp), named without importing it."""

    registry: SessionRegistry
    policy: SandboxPolicy
    tools: ToolRegistry
    execs: ExecRegistry
    max_upload_bytes: int
    max_output_bytes: int

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
                if await ensure_async(handler.authorizer.is_authorized(handler, user, action, ADMIN_RESOURCE)):
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


class JSONErrorsMixin:
    """Errors answered as ``{"error": ..., "message": ...}`` with their status; expected ones logged briefly."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        status = error_status(error, status_code)
        if status == 403 and not isinstance(error, SandboxError):
            error = self._authentication_error(error) or error
        self.set_status(status)  # type: ignore[attr-defined]
        self.set_header("Content-Type", "application/json")  # type: ignore[attr-defined]
        self.finish(json.dumps(error_body(error, status)))  # type: ignore[attr-defined]

    def _authentication_error(self, error: BaseException | None) -> SandboxAuthenticationError | None:
        """jupyter_server's bare 403 for a request with no valid token, or its _xsrf refusal, as a typed
        error saying the token is missing or wrong and how to pass it; None for an authorizer's refusal."""
        message = str(getattr(error, "log_message", None) or "")
        try:
            user = self.current_user  # type: ignore[attr-defined]
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

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if (isinstance(value, SandboxError) and error_status(value) < 500) or error_status(value) == 504:
            # an expected outcome (a bad field, a deadline): one line, no traceback
            request = self.request  # type: ignore[attr-defined]
            self.log.info("%s %s: %s: %s", request.method, request.path, typ.__name__, value)  # type: ignore[attr-defined]
        else:
            super().log_exception(typ, value, tb)  # type: ignore[misc]


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
