"""The remote provider (``remote``): a session of another Jupyter server running this extension."""

from .sandbox import (
    RemoteCommand,
    RemoteSandbox,
    RemoteSession,
)

__all__ = [
    "RemoteCommand",
    "RemoteSandbox",
    "RemoteSession",
]
