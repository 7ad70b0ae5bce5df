"""Finding this package's server extension, and its session registry, from a Jupyter ``ServerApp``.

Code that runs inside a Jupyter server but is not one of the extension's handlers (the kernel
provisioner, the JupyterHub service's start, the coding agents' personas of jupyter-ai) reaches the
server's own sandbox through here, so each uses the same gate, policy and registry as the REST doors,
and none reaches into ``extension_manager`` by itself.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sessions import SessionRegistry

#: the extension's name in jupyter_server's extension manager (and its only extension point)
EXTENSION_NAME = "jupyter_tai_sandbox"


def sandbox_app(serverapp: Any) -> Any:
    """The ``SandboxApp`` running in ``serverapp`` (None: not a server, or the extension is not loaded).
    Typed loosely on purpose: app.py imports the modules that call this, and naming its class here would tie
    this lookup back to it."""
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        extension = serverapp.extension_manager.extensions[EXTENSION_NAME]
        return extension.extension_points[EXTENSION_NAME].app
    return None


def server_registry(serverapp: Any) -> SessionRegistry | None:
    """The ``SessionRegistry`` of the sandbox extension in ``serverapp``, once its settings are loaded (its
    policy made); None otherwise."""
    app = sandbox_app(serverapp)
    registry = getattr(app, "registry", None) if app is not None else None
    if registry is not None and getattr(registry, "policy", None) is not None:
        return registry
    return None


__all__ = ["EXTENSION_NAME", "sandbox_app", "server_registry"]
