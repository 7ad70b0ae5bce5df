"""The fenced admin tier: who acts at a chokepoint (:class:`Principal`) and the one check (:func:`fence`).

The CLI and the config door act as the operator (:data:`OPERATOR_CLI`,
:data:`OPERATOR_CONFIG`), who is admin; a REST caller is a :class:`Decided`
principal whose admin actions jupyter_server's ``Authorizer`` decided up front.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ToolAccessDeniedError
from ..sessions import ADMIN_RESOURCE


class Principal:
    """Who acts at a chokepoint, and which admin actions it may take.

    ``owner`` is the user a tool's session belongs to (None for the operator's doors).
    """

    name = "anonymous"
    door = "?"
    owner: str | None = None

    def may(self, action: str) -> bool:
        """Whether ``action`` (``read``, ``write``, ``execute``) on ``jupyter_tai_sandbox:admin`` is allowed."""
        return False


@dataclass(frozen=True)
class Operator(Principal):
    """The operator: the CLI and the config door run as whoever owns the server's files and config."""

    door: str = "cli"

    @property
    def name(self) -> str:  # type: ignore[override]  # derived from door where Principal stores a field
        return f"operator ({self.door})"

    def may(self, action: str) -> bool:
        return True


@dataclass(frozen=True)
class Decided(Principal):
    """A principal whose admin actions were decided up front (e.g. by jupyter_server's Authorizer)."""

    name: str = "user"
    door: str = "rest"
    allowed: frozenset[str] = frozenset()
    owner: str | None = None

    def may(self, action: str) -> bool:
        return action in self.allowed


OPERATOR_CLI = Operator("cli")
OPERATOR_CONFIG = Operator("config")


def fence(principal: Principal, action: str, what: str) -> None:
    """The admin tier's one check, used by both chokepoints."""
    if not principal.may(action):
        raise ToolAccessDeniedError(
            f"{principal.name} may not {what}: that is an admin act (action {action!r} on "
            f"{ADMIN_RESOURCE}), which this server's authorizer does not grant"
        )
