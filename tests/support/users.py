"""Users of a test server: the token authenticates, the X-Test-User header names the user, and an
authorizer that keeps the admin resource for 'admin' (and lets 'reader' only read)."""

from __future__ import annotations

from jupyter_core.utils import ensure_async
from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.auth.identity import IdentityProvider, User

from jupyter_tai_sandbox.sessions import ADMIN_RESOURCE


class HeaderUsers(IdentityProvider):
    """Token-authenticated requests, named by the X-Test-User header."""

    async def get_user(self, handler):
        user = await ensure_async(super().get_user(handler))
        name = handler.request.headers.get("X-Test-User")
        return User(username=name) if user is not None and name else user


class AdminOnlyAdmin(Authorizer):
    """Everyone may use sessions, kernels and tools; only 'admin' holds the admin resource; 'reader' may only
    read."""

    def is_authorized(self, handler, user, action, resource):
        if user.username == "reader":
            return resource != ADMIN_RESOURCE and action == "read"
        return resource != ADMIN_RESOURCE or user.username == "admin"


def as_user(name: str) -> dict[str, str]:
    return {"X-Test-User": name}
