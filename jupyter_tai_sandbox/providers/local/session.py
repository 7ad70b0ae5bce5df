"""LocalSession: one sandbox-local session: its workspace, exec and file transfer.

Commands see a small environment, not the server's: PATH, LANG, LC_ALL and TZ
from the server (``LocalSandbox.inherit_env``), HOME set to the workspace, then
the spec's env (credentials), then the exec's env.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from ...contract import (
    ExecHandle,
    ExecRequest,
    ExecResult,
    SandboxError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxRequestError,
    SandboxSession,
    SessionInfo,
    SessionSpec,
    usage_record,
)
from .._common import run_to_end, workspace_relative
from .._shell_files import ShellFileOps
from .command import LocalCommand
from .paths import NEW_FILE_MODE, check_name_lengths, path_errors
from .posix import SESSION_MARKER, reap_holder, spawn_group_holder

if TYPE_CHECKING:
    from .tenancy import WorkspaceLease


class SessionHost(Protocol):
    """What a session uses of its provider (LocalSandbox), named without importing it."""

    inherit_env: list[str]
    output_memory_bytes: int
    stdout_pipe_bytes: int
    command_class: type[LocalCommand]
    pty_command_class: type[LocalCommand]

    async def _claim_removal(self, session: LocalSession) -> None: ...

    def _retime(self, session_id: str, expires_at: float) -> None: ...

    async def _forget(self, session: LocalSession, remove_workspace: bool) -> None: ...


#: spawn failures that say the argv cannot run (missing, not executable, too long...), not that the host failed
_NOT_RUNNABLE = frozenset(
    {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.E2BIG, errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP}
)


class LocalSession(ShellFileOps, SandboxSession):
    def __init__(
        self, sandbox: SessionHost, session_id: str, spec: SessionSpec, workspace: Path, created_at: float
    ) -> None:
        self._sandbox = sandbox
        self._id = session_id
        self.spec = spec
        self.workspace = workspace
        self.created_at = created_at
        self.expires_at = created_at + spec.ttl_seconds
        self._interactive: set[LocalCommand] = set()
        self._destroyed = False
        #: the persistent workspace key's lease, held for the session's life (None: ephemeral)
        self.lease: WorkspaceLease | None = None
        # A group holder spawned ahead, while the previous command runs, for the next one.
        self._spare_holder: int | None = None

    @property
    def id(self) -> str:
        return self._id

    def _info(self) -> SessionInfo:
        return SessionInfo(
            id=self._id,
            kind="local",
            spec=self.spec,
            isolation="none",
            workspace=str(self.workspace),
            created_at=self.created_at,
            expires_at=self.expires_at,
        )

    async def info(self) -> SessionInfo:
        self._check_live()
        return self._info()

    def _check_live(self) -> None:
        if self._destroyed:
            raise SandboxNotFoundError(f"session {self._id} was destroyed")

    # ---------------------------------------------------------------- exec

    def _command_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        base = {k: os.environ[k] for k in self._sandbox.inherit_env if k in os.environ}
        base.setdefault("PATH", os.defpath)
        base["HOME"] = str(self.workspace)
        base["SANDBOX_WORKSPACE"] = str(self.workspace)
        # last, so no env can change it: finds what a command left running if its server dies
        return {**base, **self.spec.env, **(env or {}), SESSION_MARKER: self._id}

    def _command_cwd(self, cwd: str | None) -> str:
        with path_errors(cwd or ".", "use as cwd"):
            path = self._host_path(cwd or ".")
            if not path.is_dir():
                raise SandboxPathError(f"cwd {cwd!r} is not a folder in the session workspace")
        return str(path)

    async def _start(self, request: ExecRequest, *, one_shot: bool) -> LocalCommand:
        self._check_live()
        pty = request.pty and not one_shot
        command_class = self._sandbox.pty_command_class if pty else self._sandbox.command_class
        command = command_class(
            timeout_seconds=request.timeout_seconds,
            one_shot=one_shot,
            memory_limit=self._sandbox.output_memory_bytes,
            stdout_pipe_bytes=self._sandbox.stdout_pipe_bytes,
        )
        env_, cwd_ = self._command_env(request.env), self._command_cwd(request.cwd)
        stdin: bytes | bool | None = request.stdin if one_shot else True
        holder = None if pty else self._take_holder()
        args = list(request.argv)
        try:
            await command.start(args, env=env_, cwd=cwd_, stdin=stdin, holder=holder, window=request.window)
        except OSError as e:
            if e.errno in _NOT_RUNNABLE:  # the request's fault: a 4xx naming argv
                raise SandboxRequestError(
                    f"argv: could not start {args[0][:200]!r}: {e.strerror}", field="argv"
                ) from None
            raise SandboxError(f"could not start {args[0][:200]!r}: {e.strerror}") from e
        if not (pty or self._destroyed or self._spare_holder):
            self._spare_holder = spawn_group_holder()
        return command

    def _take_holder(self) -> int | None:
        holder, self._spare_holder = self._spare_holder, None
        return holder

    def _drop_spare_holder(self) -> None:
        holder = self._take_holder()
        if holder is not None:
            reap_holder(holder)

    async def run(self, request: ExecRequest) -> ExecResult:
        return await run_to_end(await self._start(request, one_shot=True), request.output_limit)

    async def start(self, request: ExecRequest) -> ExecHandle:
        command = await self._start(request, one_shot=False)
        self._interactive.add(command)
        return command

    # --------------------------------------------------------------- files

    def resolve(self, path: str) -> str:
        with path_errors(path, "resolve"):
            return str(self._host_path(path))

    async def resolve_path(self, path: str) -> str:
        """:meth:`resolve` in place: a realpath of a path within the contract's caps, no thread."""
        return self.resolve(path)

    def _host_path(self, path: str) -> Path:
        rel = workspace_relative(path, str(self.workspace))
        check_name_lengths(path, rel)
        full = self.workspace / rel if rel else self.workspace
        real = Path(os.path.realpath(full))
        if real != self.workspace and self.workspace not in real.parents:
            raise SandboxPathError(
                f"path {path!r} leads outside the session workspace through a symlink; it is not followed"
            )
        return full

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        """Write atomically: a unique temporary file in the target's folder, then a rename.

        Concurrent uploads to one path never mix: the last one renamed wins, whole.
        """
        self._check_live()
        with path_errors(path, "write"):
            target = self._host_path(path)
            if target == self.workspace:
                raise SandboxPathError(
                    "put_file needs a file path inside the workspace, not the workspace itself"
                )
            fd, temp = await asyncio.to_thread(self._open_upload, path, target)
            handle = os.fdopen(fd, "wb")
            try:
                try:
                    if isinstance(data, (bytes, bytearray, memoryview)):
                        await asyncio.to_thread(handle.write, data)
                    else:
                        async for chunk in data:
                            await asyncio.to_thread(handle.write, chunk)
                finally:
                    handle.close()
                await asyncio.to_thread(os.replace, temp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise

    def _open_upload(self, path: str, target: Path) -> tuple[int, str]:
        target.parent.mkdir(parents=True, exist_ok=True)
        self._host_path(path)  # a parent created meanwhile must not be a way out either
        # a short name, so a target of any legal length still has a legal temporary name
        fd, temp = tempfile.mkstemp(prefix=".tai-", dir=target.parent)
        try:
            os.fchmod(fd, NEW_FILE_MODE)  # as open() would have made it, not mkstemp's 0600
        except BaseException:
            os.close(fd)
            os.unlink(temp)
            raise
        return fd, temp

    def _open_to_read(self, path: str) -> BinaryIO:
        """The workspace file ``path`` open for reading; anything but a regular file is refused at once (opened
        non-blocking: a FIFO planted by session code never waits for a writer, a device is never read)."""
        self._check_live()
        with path_errors(path, "read"):
            target = self._host_path(path)
            try:
                fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise SandboxNotFoundError(f"no file {path!r} in the session workspace") from None
            except OSError as e:
                if e.errno in (errno.ENXIO, errno.ENODEV):  # a socket
                    raise SandboxPathError(
                        f"cannot read {path!r}: it is not a regular file (a FIFO, socket or device)"
                    ) from None
                raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, socket or device)"
            raise SandboxPathError(f"cannot read {path!r}: it is {kind}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    async def get_file(self, path: str) -> bytes:
        handle = await asyncio.to_thread(self._open_to_read, path)
        try:
            with path_errors(path, "read"):
                return await asyncio.to_thread(handle.read)
        finally:
            handle.close()

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(self._open_to_read, path)
        try:
            while True:
                with path_errors(path, "read"):
                    chunk = await asyncio.to_thread(handle.read, chunk_size)
                if not chunk:
                    break
                yield chunk
        finally:
            handle.close()

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        self._check_live()
        with path_errors(path, "list"):
            folder = self._host_path(path)
            if not folder.is_dir():
                if not folder.exists():
                    raise SandboxNotFoundError(f"no folder {path!r} in the session workspace")
                raise SandboxPathError(f"{path!r} is not a folder")
            return await asyncio.to_thread(_scan, folder)

    # ------------------------------------------------------------ TTL, usage

    async def set_expiry(self, expires_at: float) -> SessionInfo:
        """The new end, in the session and its sidecar (so a restarted server and any reaper see it)."""
        self._check_live()
        await asyncio.to_thread(self._sandbox._retime, self._id, expires_at)
        self.expires_at = expires_at
        return self._info()

    async def usage(self) -> dict[str, Any]:
        """The workspace's disk use (a bounded walk in a thread); CPU and memory cannot be attributed."""
        self._check_live()
        disk, partial = await asyncio.to_thread(
            disk_usage, self.workspace, USAGE_WALK_ENTRIES, USAGE_WALK_SECONDS
        )
        note = (
            "the local provider cannot attribute CPU or memory to a session: its commands are plain host "
            "processes (use the docker provider for per-session CPU and memory)"
        )
        if partial:
            note += f"; the workspace walk stopped at its bound ({USAGE_WALK_ENTRIES} entries or "
            note += f"{USAGE_WALK_SECONDS:g} s): disk_bytes is a lower bound"
        return usage_record(disk_bytes=disk, disk_partial=partial, note=note)

    # ------------------------------------------------------------ teardown

    async def destroy(self, remove_workspace: bool = False) -> None:
        """Tear down; removing a persistent workspace another live session holds raises SandboxConflictError.

        That refusal changes nothing: the session stays live and the workspace whole.
        """
        if self._destroyed:
            return
        if remove_workspace:
            await self._sandbox._claim_removal(self)
        self._destroyed = True
        await asyncio.gather(*(command.kill() for command in self._interactive), return_exceptions=True)
        self._interactive.clear()
        self._drop_spare_holder()
        await self._sandbox._forget(self, remove_workspace)


#: bounds of the workspace walk that measures a session's disk use
USAGE_WALK_ENTRIES = 200_000
USAGE_WALK_SECONDS = 2.0


def disk_usage(root: Path, max_entries: int, max_seconds: float) -> tuple[int, bool]:
    """Bytes on disk under ``root`` (blocks, as du counts them; symlinks not followed, a hard-linked
    file once) and whether the walk stopped at its bound. Blocking: run it in a thread."""
    import time

    deadline = time.monotonic() + max_seconds
    total, seen, count = 0, set(), 0
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        try:
            it = os.scandir(folder)
        except OSError:
            continue
        with it:
            for entry in it:
                count += 1
                if count > max_entries or (count % 1024 == 0 and time.monotonic() > deadline):
                    return total, True
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return total, False


def _scan(folder: Path) -> list[dict[str, Any]]:
    entries = []
    with os.scandir(folder) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed while listed
                continue
            kind = (
                "symlink"
                if stat.S_ISLNK(st.st_mode)
                else "directory"
                if stat.S_ISDIR(st.st_mode)
                else "file"
                if stat.S_ISREG(st.st_mode)
                else "other"
            )
            entries.append({"name": entry.name, "type": kind, "size": st.st_size, "mtime": st.st_mtime})
    return sorted(entries, key=lambda e: e["name"])
