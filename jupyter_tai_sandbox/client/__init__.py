"""An async Python client of the /api/sandbox REST and websocket API.

``sandbox_client`` is the client (:class:`SandboxClient`); ``remote_exec`` a
remote interactive command (:class:`RemoteExec`); ``discovery`` finding the
server; ``http_connections`` the kept-alive HTTP/1.1 connections it sends its
REST calls over. This face hands their names on:
``from jupyter_tai_sandbox.client import SandboxClient``.
"""

from .discovery import SeveralServersWarning, discover_server, running_servers
from .http_connections import BodyProducer, HTTPConnections, StreamingCallback
from .remote_exec import STDIN_FRAME_BYTES, RemoteExec
from .sandbox_client import SandboxClient, error_from_body

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
