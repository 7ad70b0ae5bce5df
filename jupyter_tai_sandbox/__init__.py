"""Sandbox sessions for Jupyter."""

from typing import Any

from ._version import __version__


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


__all__ = ["__version__", "load_ipython_extension"]
