"""Workspace files of a container session through its agent.

Every path is sent to the agent relative to the workspace root; the agent resolves it with
``openat2(RESOLVE_BENEATH)``, so ``..``, absolute paths and symlinks that lead out fail in the
kernel (``EXDEV``), whatever the tree does meanwhile. Here only the contract's lexical checks
and size caps are applied, and the agent's errno names become the contract's errors. Uploads
are atomic (a temporary file renamed over the target) and streamed; downloads are read in
chunks as the consumer asks. A transfer that moves no data for the provider's
``transfer_idle_seconds`` is aborted: an upload whose source sends nothing for that long (its
temporary file is removed), a download whose consumer asks for nothing for that long (the next
ask raises). A download holds nothing in the session meanwhile; an upload holds its open
temporary file.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from ...agent import AgentClient, AgentConnectionLost, AgentError
from ...contract import (
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxPathError,
)
from .._common import workspace_relative

#: the longest file name the engine's file systems take (bytes)
NAME_MAX = 255
#: the contract's folder kinds, from the agent's
_KINDS = {"dir": "directory", "file": "file", "symlink": "symlink"}


def file_error(error: AgentError, path: str, what: str) -> SandboxError:
    """An agent's refusal of a file operation as the contract's error."""
    code = error.code
    if isinstance(error, AgentConnectionLost):
        return SandboxError(f"{what} {path!r}: the connection to the session agent ended: {error.message}")
    if code in ("EXDEV", "ELOOP"):
        return SandboxPathError(f"path {path!r} leads outside the session workspace; it is not followed")
    if code == "ENOENT":
        return SandboxNotFoundError(f"no file or folder {path!r} in the session workspace")
    if code == "ENOTDIR":
        return SandboxPathError(f"cannot use {path!r}: a part of it is not a folder")
    if code == "EISDIR":
        return SandboxPathError(f"cannot {what} {path!r}: it is a folder")
    if code in ("ENODEV", "ENXIO"):  # the agent opens no FIFO, socket or device for a read
        return SandboxPathError(
            f"cannot {what} {path!r}: it is not a regular file (a FIFO, socket or device)"
        )
    if code in ("EEXIST", "ENOTEMPTY"):
        return SandboxConflictError(f"{path!r}: the target exists already in the session workspace")
    return SandboxError(f"cannot {what} {path!r}: {error.message or code} [{code}]")


def relative(path: str, workspace: str) -> str:
    """``path`` relative to the workspace ('' for the workspace itself), with the contract's caps."""
    rel = workspace_relative(path, workspace)
    for name in rel.split("/") if rel else ():
        if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise SandboxPathError(
                f"cannot use {path!r}: a file name is at most {NAME_MAX} bytes, and {name[:20]!r}... is longer"
            )
    return rel


class TransferIdleError(SandboxError):
    """A file transfer moved no data for the provider's idle limit and was aborted."""


async def _chunks(data: bytes | AsyncIterable[bytes], path: str, idle_seconds: float) -> AsyncIterator[bytes]:
    """The upload's chunks; a source that sends nothing for ``idle_seconds`` ends it with TransferIdleError."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
        return
    source = aiter(data)
    while True:
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that comes as the next chunk
            # does, and a cancelled upload (its client gone) would wait out the idle limit
            async with asyncio.timeout(idle_seconds):
                chunk = await anext(source)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise TransferIdleError(
                f"the upload of {path!r} stopped: its source sent no data for {idle_seconds:g} s "
                "(transfer_idle_seconds); nothing was written"
            ) from None
        yield bytes(chunk)


class WorkspaceFiles:
    """The file operations of one session's workspace (``root``), over its agent connection."""

    def __init__(
        self,
        client: Callable[[], Awaitable[AgentClient]],
        root: str,
        *,
        idle_seconds: float = 60.0,
        user: Callable[[], Awaitable[tuple[int, int] | None]] | None = None,
    ) -> None:
        self._client = client
        #: the session user (uid, gid) every operation runs as, with that user's rights (None: the agent's root)
        self._user = user
        self.root = root
        #: the provider's transfer_idle_seconds
        self.idle_seconds = idle_seconds

    def relative(self, path: str) -> str:
        return relative(path, self.root)

    async def _as(self) -> tuple[int, int] | None:
        return None if self._user is None else await self._user()

    def _file_path(self, path: str, what: str) -> str:
        rel = self.relative(path)
        if not rel:
            raise SandboxPathError(f"{what} needs a file path inside the workspace, not the workspace itself")
        return rel

    async def stat(self, path: str, what: str = "use") -> dict[str, Any] | None:
        """The agent's stat of ``path`` (symlinks inside followed), or None when nothing is there."""
        rel = self.relative(path) or "."
        try:
            return await (await self._client()).stat(self.root, rel, user=await self._as())
        except AgentError as e:
            if e.code == "ENOENT":
                return None
            raise file_error(e, path, what) from None

    async def resolve(self, path: str) -> str:
        """The absolute path of ``path`` in the session, checked by the kernel to stay inside."""
        rel = self.relative(path)
        await self.stat(path)
        return posixpath.join(self.root, rel) if rel else self.root

    async def folder(self, path: str, what: str) -> str:
        found = await self.stat(path, what)
        if found is None or found["type"] != "dir":
            raise SandboxPathError(f"{what} {path!r} is not a folder in the session workspace")
        rel = self.relative(path)
        return posixpath.join(self.root, rel) if rel else self.root

    async def put(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        rel = self._file_path(path, "put_file")
        try:
            await (await self._client()).write_stream(
                self.root, rel, _chunks(data, path, self.idle_seconds), user=await self._as()
            )
        except AgentError as e:
            raise file_error(e, path, "write") from None

    async def iter(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        rel = self._file_path(path, "get_file")
        client, user = await self._client(), await self._as()
        offset, size = 0, None
        step = max(1, min(chunk_size, 1 << 20))
        loop = asyncio.get_running_loop()
        while size is None or offset < size:
            try:
                size, data = await client.read_chunk(self.root, rel, offset, step, user=user)
            except AgentError as e:
                raise file_error(e, path, "read") from None
            if not data:
                break
            offset += len(data)
            handed = loop.time()
            yield data
            if offset < size and loop.time() - handed > self.idle_seconds:  # the whole file handed: not idle
                raise TransferIdleError(
                    f"the download of {path!r} stopped: its reader asked for nothing for {self.idle_seconds:g} s "
                    "(transfer_idle_seconds)"
                )

    async def listdir(self, path: str) -> list[dict[str, Any]]:
        rel = self.relative(path) or "."
        try:
            entries = await (await self._client()).listdir(self.root, rel, user=await self._as())
        except AgentError as e:
            if e.code == "ENOENT":
                raise SandboxNotFoundError(f"no folder {path!r} in the session workspace") from None
            if e.code == "ENOTDIR":
                raise SandboxPathError(f"{path!r} is not a folder") from None
            raise file_error(e, path, "list") from None
        return sorted(
            (
                {
                    "name": e["name"],
                    "type": _KINDS.get(e.get("type", ""), "other"),
                    "size": e.get("size", 0),
                    "mtime": e.get("mtime"),
                }
                for e in entries
            ),
            key=lambda e: e["name"],
        )

    async def remove(self, path: str) -> None:
        rel = self._file_path(path, "delete")
        try:
            await (await self._client()).delete(self.root, rel, recursive=True, user=await self._as())
        except AgentError as e:
            raise file_error(e, path, "delete") from None

    async def move(self, path: str, new_path: str) -> None:
        rel, to = self._file_path(path, "move"), self._file_path(new_path, "move to")
        if await self.stat(path, "move") is None:
            raise SandboxNotFoundError(f"no file or folder {path!r} in the session workspace")
        if await self.stat(new_path, "move to") is not None:
            raise SandboxConflictError(f"{new_path!r}: the target exists already in the session workspace")
        try:
            await (await self._client()).rename(self.root, rel, to, parents=True, user=await self._as())
        except AgentError as e:
            raise file_error(e, path, "move") from None

    async def mkdir(self, path: str) -> None:
        rel = self._file_path(path, "make")
        found = await self.stat(path, "make")
        if found is not None:
            if found["type"] != "dir":
                raise SandboxConflictError(f"{path!r}: a file exists there already in the session workspace")
            return
        try:
            await (await self._client()).mkdir(self.root, rel, parents=True, user=await self._as())
        except AgentError as e:
            if e.code != "EEXIST":
                raise file_error(e, path, "make") from None
