"""``%%sandbox`` and ``%sandbox``: notebook cells that run inside a sandbox session.

Load with ``%load_ext jupyter_tai_sandbox`` (or ``%load_ext jupyter_tai_sandbox.magics``).
The magic lives in ``magic``; this face hands its names on.
"""

from .magic import (
    SandboxCommandError,
    SandboxInterrupted,
    SandboxMagicError,
    SandboxMagics,
    inert_display,
    load_ipython_extension,
)

__all__ = [
    "SandboxCommandError",
    "SandboxInterrupted",
    "SandboxMagicError",
    "SandboxMagics",
    "inert_display",
    "load_ipython_extension",
]
