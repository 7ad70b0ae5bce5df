"""How a sandboxed kernel's failed start reads: the policy's message and status, in lines a dialog shows whole.

:class:`SandboxKernelError` is both a :class:`~jupyter_tai_sandbox.contract.SandboxError` and a
tornado ``HTTPError``, so jupyter_server answers the kernel start (``POST /api/kernels``) with its
message and status, and JupyterLab's "Error Starting Kernel" dialog shows it instead of
"Unhandled error".
"""

from __future__ import annotations

import textwrap

from tornado.web import HTTPError

from ..contract import SandboxError
from ..errors import error_status


class SandboxKernelError(SandboxError, HTTPError):
    """A sandboxed kernel could not start.

    Also a tornado HTTPError, so jupyter_server answers the kernel start (POST /api/kernels)
    with this message and status, and JupyterLab shows it, instead of "Unhandled error".
    """

    def __init__(self, message: str, status_code: int = 500) -> None:
        message = _readable(message)
        HTTPError.__init__(self, status_code, message)
        self.args = (message,)
        self.message = message

    def __str__(self) -> str:
        return self.message


#: the widest line of a kernel-start error: JupyterLab shows it in a <pre> that does not wrap
ERROR_LINE_WIDTH = 72


def _readable(message: str) -> str:
    """A kernel-start error in lines of at most ERROR_LINE_WIDTH characters (words and options kept
    whole), its first clause on a line of its own: JupyterLab's "Error Starting Kernel" dialog and
    ``jupyter console`` show it as it is, so one long line would hide its end, where the fix is."""
    head, sep, rest = message.partition(": ")
    if sep and len(head) <= ERROR_LINE_WIDTH and "\n" not in head:
        first, message = head + ":", rest
    else:
        first = ""
    lines = [first] if first else []
    for paragraph in message.splitlines() or [""]:
        lines += textwrap.wrap(
            paragraph, ERROR_LINE_WIDTH, break_long_words=False, break_on_hyphens=False
        ) or [""]
    return "\n".join(lines)


def start_error(e: SandboxError) -> SandboxKernelError:
    if isinstance(e, SandboxKernelError):
        return e

    return SandboxKernelError(f"the sandboxed kernel could not start: {e}", error_status(e))
