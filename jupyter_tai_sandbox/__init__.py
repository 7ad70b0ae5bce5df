"""Sandbox sessions for Jupyter.

What a user or plugin author imports is here, loaded on first use (``import jupyter_tai_sandbox`` stays cheap:
Jupyter imports it to find the server extension, IPython to load the magics)::

    from jupyter_tai_sandbox import SessionSpec, require_sandbox

    sandbox = require_sandbox()  # the installed provider, behind the policy
    session = await sandbox.create(SessionSpec(consumer="me", ttl_seconds=600))
    result = await session.exec(["python3", "-c", "print(6 * 7)"], timeout_seconds=30)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

#: a public name -> the module that defines it (imported when the name is first read)
_LAZY = {
    # the chokepoint and the process slot
    "require_sandbox": "sandboxes",
    "register_sandbox": "sandboxes",
    "unregister_sandbox": "sandboxes",
    "SandboxPolicy": "policy",
    # the contract: what providers take and give
    "Sandbox": "contract",
    "SandboxSession": "contract",
    "ExecHandle": "contract",
    "SessionSpec": "contract",
    "SessionInfo": "contract",
    "ExecRequest": "contract",
    "ExecResult": "contract",
    "SandboxError": "contract",
    "SandboxUnavailableError": "contract",
    "SandboxSpecRejectedError": "contract",
    "SandboxRequestError": "contract",
    "SandboxForbiddenError": "contract",
    "SandboxQuotaError": "contract",
    "SandboxNotFoundError": "contract",
    "SandboxExecTimeoutError": "contract",
    "OutputTooLargeError": "contract",
    # the providers (their engines' client libraries load with them)
    "LocalSandbox": "providers.local",
    "DockerSandbox": "providers.docker",
    "SwarmSandbox": "providers.swarm",
    "VmSandbox": "providers.vm",
    "RemoteSandbox": "providers.remote",
    # a client of a server's sandbox API (what kernels and the remote provider use)
    "SandboxClient": "client",
}

if TYPE_CHECKING:
    from .client import SandboxClient
    from .contract import (
        ExecHandle,
        ExecRequest,
        ExecResult,
        OutputTooLargeError,
        Sandbox,
        SandboxError,
        SandboxExecTimeoutError,
        SandboxForbiddenError,
        SandboxNotFoundError,
        SandboxQuotaError,
        SandboxRequestError,
        SandboxSession,
        SandboxSpecRejectedError,
        SandboxUnavailableError,
        SessionInfo,
        SessionSpec,
    )
    from .policy import SandboxPolicy
    from .providers.docker import DockerSandbox
    from .providers.local import LocalSandbox
    from .providers.remote import RemoteSandbox
    from .providers.swarm import SwarmSandbox
    from .providers.vm import VmSandbox
    from .sandboxes import register_sandbox, require_sandbox, unregister_sandbox


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import SandboxApp

    return [{"module": "jupyter_tai_sandbox", "app": SandboxApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt panel (for ``jupyter labextension develop --overwrite .``)."""
    return [{"src": "labextension", "dest": "jupyter-tai-sandbox"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_tai_sandbox``: the ``%%sandbox`` / ``%sandbox`` magics."""
    from .magics import load_ipython_extension as load

    load(ipython)


__all__ = [
    "DockerSandbox",
    "ExecHandle",
    "ExecRequest",
    "ExecResult",
    "LocalSandbox",
    "OutputTooLargeError",
    "RemoteSandbox",
    "Sandbox",
    "SandboxClient",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxForbiddenError",
    "SandboxNotFoundError",
    "SandboxPolicy",
    "SandboxQuotaError",
    "SandboxRequestError",
    "SandboxSession",
    "SandboxSpecRejectedError",
    "SandboxUnavailableError",
    "SessionInfo",
    "SessionSpec",
    "SwarmSandbox",
    "VmSandbox",
    "__version__",
    "load_ipython_extension",
    "register_sandbox",
    "require_sandbox",
    "unregister_sandbox",
]
