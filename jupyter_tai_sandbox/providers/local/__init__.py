"""The local provider (``local``): each session's commands run as plain host subprocesses, no isolation."""

from .sandbox import (
    LocalCommand,
    LocalPtyCommand,
    LocalSandbox,
    LocalSession,
)

__all__ = [
    "LocalCommand",
    "LocalPtyCommand",
    "LocalSandbox",
    "LocalSession",
]
