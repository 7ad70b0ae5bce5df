"""``GET /api/sandbox/sessions/{id}/ports``: the TCP ports something listens on inside a session, each with
its preview URL.

Thin: it finds the caller's session (another user's answers 404 like an unknown one), reads the ports with
:func:`~jupyter_tai_sandbox.previews.listening.listening_ports` (one bounded exec of ``cat /proc/net/tcp
/proc/net/tcp6``) and adds each port's server-relative preview path, with the server's base_url (and, with
PreviewSettings.origin_template set, the origin that path redirects a browser's page to).
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web

from ..previews.listening import listening_ports
from ..previews.urls import port_path
from .handlers import SESSION_ID, SandboxAPIHandler
from .preview_handlers import preview_origin


class PortsHandler(SandboxAPIHandler):
    """``{"ports": [{"port": 8000, "address": "0.0.0.0", "url": "<base_url>api/sandbox/sessions/ID/ports/8000/"}]}``,
    sorted by port; the url carries no token (the browser's Jupyter login opens it)."""

    @web.authenticated
    @authorized
    async def get(self, session_id: str) -> None:
        session = await self.get_session(session_id)
        self.touch()
        ports = await listening_ports(session)
        listed = []
        for port in ports:
            entry = {**port.to_json(), "url": url_path_join(self.base_url, port_path(session.id, port.port))}
            origin = preview_origin(self.sandbox_app.previews, self.request, session.id, port.port)  # type: ignore[attr-defined]
            if origin is not None:
                entry["origin"] = origin  # PreviewSettings.origin_template: the url redirects there
            listed.append(entry)
        self.write_json({"ports": listed})


preview_ports_handlers = [
    (rf"/api/sandbox/sessions/{SESSION_ID}/ports", PortsHandler),
]
