"""Sandbox sessions for Jupyter."""

from typing import Any

from ._version import __version__


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import SandboxApp

    return [{"module": "jupyter_tai_sandbox", "app": SandboxApp}]


__all__ = ["__version__"]
