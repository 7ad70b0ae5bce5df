"""An async Python client of the /api/sandbox REST and websocket API.

``sandbox_client`` is the client (:class:`SandboxClient`, a remote interactive
command :class:`RemoteExec`, finding the server); ``http_connections`` the
kept-alive HTTP/1.1 connections it sends its REST calls over. This face hands
their names on: ``from jupyter_tai_sandbox.client import SandboxClient``.
"""

from .http_connections import BodyProducer, HTTPConnections, StreamingCallback
from .sandbox_client import (
    STDIN_FRAME_BYTES,
    RemoteExec,
    SandboxClient,
    SeveralServersWarning,
    discover_server,
    error_from_body,
    running_servers,
)

__all__ = [
    "STDIN_FRAME_BYTES",
    "BodyProducer",
    "HTTPConnections",
    "RemoteExec",
    "SandboxClient",
    "SeveralServersWarning",
    "StreamingCallback",
    "discover_server",
    "error_from_body",
    "running_servers",
]
