"""``POST /api/sandbox/sessions/{id}/handoff``: the workspace handoff between Jupyter's contents and a session.

Thin: it parses the body, finds the caller's session (another user's answers 404 like an unknown one) and
calls :class:`~jupyter_tai_sandbox.agents.handoff.WorkspaceHandoff`, which holds the rule.
"""

from __future__ import annotations

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from tornado import web

from ..agents.handoff import HandoffResult, WorkspaceHandoff, handoff_path
from ..contract import SandboxForbiddenError, SandboxRequestError
from .handlers import SESSION_ID, SandboxAPIHandler

_DIRECTIONS = ("in", "out")


class HandoffHandler(SandboxAPIHandler):
    """``{"direction": "in", "path": P}`` copies the contents folder (or file) P into the session's workspace
    at the same relative path; ``{"direction": "out", "path": P}`` brings the session's changes under P (or,
    without ``path``, under everything handed in) back by the conflict rule. Answers the result."""

    @web.authenticated
    @authorized
    async def post(self, session_id: str) -> None:
        data = self.read_json()
        unknown = sorted(set(data) - {"direction", "path"})
        if unknown:
            raise SandboxRequestError(
                f"unknown field(s): {', '.join(unknown)}; known: direction, path", field=unknown[0]
            )
        direction = data.get("direction")
        if direction not in _DIRECTIONS:
            raise SandboxRequestError(
                'direction: "in" (Jupyter\'s contents into the session) or "out" (the session\'s changes back)',
                field="direction",
            )
        path = data.get("path")
        if direction == "in" and path is None:
            raise SandboxRequestError(
                'path: the contents folder or file to copy in ("" for the whole contents root)', field="path"
            )
        if path is not None:
            handoff_path(path)  # a bad path is refused before the session is looked up
        session = await self.get_session(session_id, manage=True)
        await self._check_contents_access("read" if direction == "in" else "write")
        handoff = WorkspaceHandoff.for_server(self.sandbox_app, session)
        self.touch()
        result: HandoffResult
        if direction == "in":
            result = await handoff.copy_in(path or "")
        else:
            result = await handoff.copy_back(path)
        self.touch()
        self.write_json(result.to_json())

    async def _check_contents_access(self, action: str) -> None:
        """The handoff reads (in) or writes (out) Jupyter's contents: the Authorizer must allow that on
        jupyter_server's own ``contents`` resource too, as its contents API would."""
        allowed = await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, action, "contents")
        )
        if not allowed:
            raise SandboxForbiddenError(
                f"a handoff {'in' if action == 'read' else 'out'} needs {action} on Jupyter's contents, which "
                "the server's Authorizer does not grant you"
            )


handoff_handlers = [
    (rf"/api/sandbox/sessions/{SESSION_ID}/handoff", HandoffHandler),
]
