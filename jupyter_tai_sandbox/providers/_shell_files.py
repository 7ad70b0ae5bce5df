"""Workspace file operations as shell commands in the session, for providers without native ones.

:class:`ShellFileOps` gives a :class:`~jupyter_tai_sandbox.contract.SandboxSession` its
``remove_path``, ``move_path`` and ``make_folder`` by running ``sh`` through the session's own
:meth:`~jupyter_tai_sandbox.contract.SandboxSession.exec` on paths the session resolved: so they
work wherever the session's commands run (a host folder, a container), and stay inside the
workspace by the provider's own ``resolve_path``. Each script says what it found by its exit status.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..contract import (
    ExecResult,
    SandboxConflictError,
    SandboxNotFoundError,
    SandboxPathError,
)

if TYPE_CHECKING:
    from ..contract import SandboxSession

    # the mixin is checked as the session class it is mixed into
    _Session = SandboxSession
else:
    _Session = object

#: a script's exit status: the path it was given does not exist
EXIT_MISSING = 18
#: a script's exit status: the path it was to create exists already
EXIT_EXISTS = 17
#: the deadline of one file operation's script
FILE_OP_TIMEOUT = 60


class ShellFileOps(_Session):
    """``remove_path`` / ``move_path`` / ``make_folder`` for a session class (list it before SandboxSession).

    Uses the session's ``exec`` and ``resolve_path``, which every session has.
    """

    async def remove_path(self, path: str) -> None:
        """Delete a workspace file, or a folder with everything in it; never the workspace itself."""
        target = await self._confined(path, "delete")
        await self._file_op(
            f'test -e "$1" || test -L "$1" || exit {EXIT_MISSING}; rm -rf -- "$1"', target, what=path
        )

    async def move_path(self, path: str, new_path: str) -> None:
        """Rename or move a workspace file or folder; the new path must not exist yet (parents are made)."""
        source = await self._confined(path, "move")
        target = await self._confined(new_path, "move to")
        await self._file_op(
            f'test -e "$1" || test -L "$1" || exit {EXIT_MISSING}; test -e "$2" && exit {EXIT_EXISTS}; '
            'mkdir -p -- "$(dirname -- "$2")" && mv -- "$1" "$2"',
            source,
            target,
            what=path,
        )

    async def make_folder(self, path: str) -> None:
        """Make a workspace folder (and its parents); an existing file there is a conflict."""
        target = await self._confined(path, "make")
        await self._file_op(
            f'test -e "$1" && ! test -d "$1" && exit {EXIT_EXISTS}; mkdir -p -- "$1"', target, what=path
        )

    async def _confined(self, path: str, what: str) -> str:
        resolved, workspace = await asyncio.gather(self.resolve_path(path), self.resolve_path("."))
        if resolved.rstrip("/") == workspace.rstrip("/"):
            raise SandboxPathError(f"cannot {what} the workspace itself: name a path inside it")
        return resolved

    async def _file_op(self, script: str, *paths: str, what: str) -> None:
        result: ExecResult = await self.exec(
            ["sh", "-c", script, "sh", *paths], timeout_seconds=FILE_OP_TIMEOUT
        )
        if result.exit_code == EXIT_MISSING:
            raise SandboxNotFoundError(f"no file or folder {what!r} in the session workspace")
        if result.exit_code == EXIT_EXISTS:
            raise SandboxConflictError(f"{what!r}: the target exists already in the session workspace")
        if result.exit_code != 0:
            message = result.stderr.decode(errors="replace").strip() or f"exit status {result.exit_code}"
            raise SandboxPathError(f"{what!r}: {message}")
