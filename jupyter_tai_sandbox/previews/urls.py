"""The preview route's paths, built in one place (the REST ports listing, the client, the magics, MCP)."""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["port_path"]


def port_path(session_id: str, port: int, path: str = "", absolute: bool = False) -> str:
    """The server-relative path of ``port`` inside session ``session_id`` (without the server's base_url),
    e.g. ``/api/sandbox/sessions/ID/ports/8000/``; ``path`` is the app's own path after it (a leading
    ``/`` dropped, its query string kept). ``absolute``: the ``absolute-ports`` route, whose app sees the full
    request path. No token is ever part of it."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port: a TCP port number 1-65535, not {port!r}")
    route = "absolute-ports" if absolute else "ports"
    return f"/api/sandbox/sessions/{quote(session_id, safe='')}/{route}/{port}/{path.lstrip('/')}"
