"""A docker session: one container, its commands and its workspace files.

Commands start under the wrapper scripts (``_docker_scripts``) and become
:class:`DockerCommand` handles. File downloads and uploads are commands too
(``_docker_transfer``): confined to ``/workspace`` inside the container in the
same step as the read or write, holding no engine lock or worker thread, with
bounded memory and an idle limit. Other paths (``resolve``, a command's cwd, a
listing's folder) are walked by one command in the session (``RESOLVE``, or
``LIST`` for a listing), so a request costs the same few engine calls at any
depth; a symlink leading outside the workspace is refused.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import posixpath
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..contract import (
    ExecHandle,
    ExecRequest,
    ExecResult,
    SandboxError,
    SandboxIsolation,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxSession,
    SessionInfo,
    SessionSpec,
    session_gone,
    usage_record,
)
from . import _docker_scripts as scripts
from ._common import run_to_end, workspace_relative
from ._docker_command import DockerCommand, stop_command
from ._docker_names import WORKSPACE
from ._docker_transfer import download, upload
from ._shell_files import ShellFileOps
from .container.session import CommandRegistry
from .docker_engine import DockerEngine

#: A pty command's TERM.
PTY_TERM = "xterm-256color"
#: the longest file name the engine's file systems take (bytes)
NAME_MAX = 255
#: how long a folder listing may take
LIST_LIMIT_SECONDS = 60.0


@dataclass(frozen=True)
class SessionSite:
    """What every session of one provider shares."""

    engine: DockerEngine
    kind: str
    isolation: SandboxIsolation
    memory_limit: int
    log: Any
    commands: CommandRegistry
    #: tears a session down: (session, remove_workspace)
    teardown: Callable[[DockerSession, bool], Awaitable[None]]
    #: a file transfer that moves no data this long is aborted
    transfer_idle_seconds: float = 60.0
    #: moves a session's end durably: (session, expires_at); None: the provider cannot
    retime: Callable[[DockerSession, float], Awaitable[None]] | None = None


class _Located:
    """A workspace path as the session's walk found it: the real path of what exists, and its kind."""

    def __init__(self, real: str, kind: str) -> None:
        self.real = real
        self.kind = kind

    @property
    def exists(self) -> bool:
        return self.kind != "missing"

    @property
    def is_dir(self) -> bool:
        return self.kind == "directory"


def _inside(path: str) -> bool:
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


def _walk_answer(fields: list[bytes], path: str) -> _Located:
    """The first fields of a ``_WALK`` script's output as a :class:`_Located`, or its refusal.

    The script runs in the session's container, whose programs the session may have replaced:
    an answer that is malformed or names a path outside the workspace is refused, never used.
    """
    head = fields[0].decode("utf-8", "surrogateescape") if fields else ""
    if head.startswith("error "):
        _, kind, detail = [*head.split(" ", 2), "", ""][:3]
        if kind == "outside":
            raise SandboxPathError(
                f"path {path!r} leads outside the session workspace through a symlink; it is not followed"
            )
        if kind == "notfolder":
            raise SandboxPathError(f"cannot use {path!r}: {detail} is not a folder")
        if kind == "missing":
            raise SandboxNotFoundError(f"cannot use {path!r}: the session has no workspace folder")
        raise SandboxPathError(f"cannot use {path!r}: {detail}")
    words = head.split(" ")
    if len(fields) < 3 or len(words) != 3 or words[0] != "ok" or words[1] not in ("directory", "file", "missing"):
        raise SandboxError(f"cannot use {path!r}: the session's path walk answered {head[:80]!r}")
    folder = posixpath.normpath(fields[1].decode("utf-8", "surrogateescape"))
    name = fields[2].decode("utf-8", "surrogateescape")
    real = posixpath.join(folder, name) if name and words[1] == "file" else folder
    if not _inside(folder) or "/" in name or name in ("..", "."):
        raise SandboxPathError(f"path {path!r} leads outside the session workspace; it is not followed")
    return _Located(real, words[1])


async def container_usage(engine: DockerEngine, container: str, session_id: str,
                          disk: Awaitable[int | str]) -> dict[str, Any]:
    """A session's usage record: CPU and memory from one engine stats sample, the disk from ``disk`` (a bounded
    ``du``: bytes, or why there are none); what could not be measured is said in the note."""
    stats, disk_bytes = await asyncio.gather(engine.stats(container), disk, return_exceptions=True)
    if isinstance(stats, SandboxNotFoundError):
        raise session_gone(session_id) from None
    notes = []
    measured: dict[str, Any] = {}
    if isinstance(stats, BaseException):
        if not isinstance(stats, SandboxError):
            raise stats
        notes.append(f"no CPU or memory figures: {stats}")
    else:
        measured.update(_from_stats(stats))
    if isinstance(disk_bytes, BaseException):
        if not isinstance(disk_bytes, (SandboxError, asyncio.TimeoutError)):
            raise disk_bytes
        notes.append(f"no disk figure: du did not answer within {USAGE_DU_SECONDS:g} s")
    elif isinstance(disk_bytes, str):
        notes.append(disk_bytes)
    else:
        measured["disk_bytes"] = disk_bytes
    return usage_record(**measured, note="; ".join(notes) or None)


class DockerSession(ShellFileOps, SandboxSession):
    """One session container."""

    def __init__(
        self,
        site: SessionSite,
        container_id: str,
        session_id: str,
        spec: SessionSpec,
        created_at: float,
        expires_at: float,
        *,
        record: str | None = None,
        exec_env: Mapping[str, str] | None = None,
    ) -> None:
        self._site = site
        self._engine = site.engine
        self._container = container_id
        #: the record volume of a session started in a pooled container (None otherwise)
        self._record = record
        self._id = session_id
        self.spec = spec
        self.created_at = created_at
        self.expires_at = expires_at
        self._destroyed = False
        self._file_user: tuple[int, int] | None = None
        #: environment given to every exec (a pooled container was started without the spec's env)
        self._exec_env: dict[str, str] = dict(exec_env or {})

    @property
    def id(self) -> str:
        return self._id

    @property
    def container_id(self) -> str:
        return self._container

    @property
    def record(self) -> str | None:
        """The record volume of a session in a pooled container, else None."""
        return self._record

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    def _info(self) -> SessionInfo:
        return SessionInfo(
            id=self._id,
            kind=self._site.kind,
            spec=self.spec,
            isolation=self._site.isolation,
            workspace=WORKSPACE,
            created_at=self.created_at,
            expires_at=self.expires_at,
        )

    async def info(self) -> SessionInfo:
        self._check_live()
        try:
            await self._engine.inspect_container(self._container, what="inspect a session")
        except SandboxNotFoundError:
            raise session_gone(self._id) from None
        return self._info()

    def _check_live(self) -> None:
        if self._destroyed:
            raise SandboxNotFoundError(f"session {self._id} was destroyed")

    # ----------------------------------------------------------------- exec

    async def _start(self, request: ExecRequest, *, stdin: bool, tty: bool) -> DockerCommand:
        self._check_live()
        args = list(request.argv)
        workdir = WORKSPACE if request.cwd is None else await self._folder(request.cwd, what="cwd")
        token = secrets.token_hex(8)
        command_env = {"SANDBOX_WORKSPACE": WORKSPACE, **self._exec_env, **request.env}
        window = request.window
        if tty:
            rows, cols = window
            cmd = ["sh", "-c", scripts.RUN_PTY, "sh", token, workdir, str(rows), str(cols), *args]
            command_env = {"TERM": PTY_TERM, **command_env}
        else:
            cmd = ["sh", "-c", scripts.RUN, "sh", scripts.HOLD, token, workdir, *args]
        engine = self._engine
        try:
            exec_id = await engine.exec_create(self._container, cmd, env=command_env, stdin=stdin, tty=tty)
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"session {self._id} is gone (its container no longer exists)") from None
        stream = None
        try:
            stream = await engine.exec_start(exec_id, tty)
            command = DockerCommand(
                engine,
                self._container,
                exec_id,
                token,
                stream,
                timeout_seconds=request.timeout_seconds,
                tty=tty,
                stdin=stdin,
                memory_limit=self._site.memory_limit,
                log=self._site.log,
                gone=lambda: self._destroyed,
                on_done=lambda c: self._site.commands.discard(self._id, c),
            )
            if tty:
                # an image without stty still gets its window size from the engine (unless it ended already)
                with contextlib.suppress(SandboxError):
                    await engine.exec_resize(exec_id, *window)
        except BaseException:
            # a start that failed or was cancelled stops whatever it may have started
            if stream is not None:
                stream[1].close()
            with contextlib.suppress(SandboxError):
                await asyncio.shield(
                    stop_command(engine, self._container, exec_id, token, pty=tty, gone=lambda: self._destroyed)
                )
            raise
        self._site.commands.add(self._id, command)
        return command

    async def run(self, request: ExecRequest) -> ExecResult:
        command = await self._start(request, stdin=request.stdin is not None, tty=False)
        if request.stdin is not None:
            command.feed(request.stdin)
        return await run_to_end(command, request.output_limit)

    async def start(self, request: ExecRequest) -> ExecHandle:
        return await self._start(request, stdin=True, tty=request.pty)

    # ---------------------------------------------------------------- paths

    def resolve(self, path: str) -> str:
        """The container path of ``path``, its symlinks checked by one command in the session (three
        blocking engine calls whatever the depth); :meth:`resolve_path` is its coroutine."""
        self._check_live()
        rel, parts = self._components(path)
        code, out = self._engine.run_blocking(self._container, ["sh", "-c", scripts.RESOLVE, "sh", *parts])
        self._walked(code, out, path)
        return posixpath.join(WORKSPACE, rel) if rel else WORKSPACE

    async def resolve_path(self, path: str) -> str:
        rel, _ = self._components(path)
        await self._where(path)
        return posixpath.join(WORKSPACE, rel) if rel else WORKSPACE

    @staticmethod
    def _components(path: str) -> tuple[str, list[str]]:
        """``path`` relative to the workspace and its components (lexical checks, the contract's caps)."""
        rel = workspace_relative(path, WORKSPACE)
        parts = rel.split("/") if rel else []
        for name in parts:
            if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
                raise SandboxPathError(
                    f"cannot use {path!r}: a file name is at most {NAME_MAX} bytes, and {name[:20]!r}... is longer"
                )
        return rel, parts

    def _walked(self, code: int, out: bytes, path: str) -> _Located:
        if code != 0:
            if self._destroyed:
                raise SandboxNotFoundError(f"session {self._id} is gone")
            raise SandboxError(f"cannot use {path!r}: the session's path walk exited with status {code}")
        return _walk_answer(out.split(b"\0", 3)[:3], path)

    async def _where(self, path: str) -> _Located:
        """Where ``path`` leads in the container: one command (``RESOLVE``), whatever its depth."""
        self._check_live()
        _, parts = self._components(path)
        try:
            code, out, _ = await asyncio.wait_for(
                self._engine.run(self._container, ["sh", "-c", scripts.RESOLVE, "sh", *parts], limit=64 << 10),
                LIST_LIMIT_SECONDS,
            )
        except asyncio.TimeoutError:
            raise SandboxError(f"looking up {path!r} took longer than {LIST_LIMIT_SECONDS:g} s") from None
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"session {self._id} is gone (its container no longer exists)") from None
        return self._walked(code, out, path)

    async def _folder(self, path: str, what: str) -> str:
        located = await self._where(path)
        if not located.exists or not located.is_dir:
            raise SandboxPathError(f"{what} {path!r} is not a folder in the session workspace")
        return located.real

    # ---------------------------------------------------------------- files

    def _parts(self, path: str, what: str) -> tuple[str, list[str]]:
        """``path`` relative to the workspace, and its components (lexical checks only)."""
        self._check_live()
        rel = workspace_relative(path, WORKSPACE)
        if not rel:
            raise SandboxPathError(f"{what} needs a file path inside the workspace, not the workspace itself")
        parts = rel.split("/")
        for name in parts:
            if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
                raise SandboxPathError(
                    f"cannot use {path!r}: a file name is at most {NAME_MAX} bytes, and {name[:20]!r}... is longer"
                )
        return rel, parts

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        """Write a workspace file atomically (a temporary file renamed over it), through a command that
        confines the path inside the container as it writes (see ``_docker_transfer``)."""
        _, parts = self._parts(path, "put_file")
        try:
            await upload(
                self._engine, self._container, parts, path, data,
                idle_seconds=self._site.transfer_idle_seconds, log=self._site.log, gone=lambda: self._destroyed,
            )
        except SandboxNotFoundError:
            if self._destroyed:
                raise SandboxNotFoundError(f"session {self._id} is gone") from None
            raise

    async def get_file(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.iter_file(path)])

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        """Stream a workspace file through a command (no engine lock held; the stream is read as
        the consumer asks, and one that asks for nothing for ``transfer_idle_seconds`` is aborted)."""
        rel, _ = self._parts(path, "get_file")
        async for chunk in download(
            self._engine, self._container, rel, path, chunk_size=max(1, chunk_size),
            idle_seconds=self._site.transfer_idle_seconds, log=self._site.log, gone=lambda: self._destroyed,
        ):
            yield chunk

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        """One command in the session walks the path (confined, as ``RESOLVE``) and lists the folder."""
        self._check_live()
        _, parts = self._components(path)
        cmd = ["sh", "-c", scripts.LIST, "sh", *parts]
        try:
            code, out, err = await asyncio.wait_for(self._engine.run(self._container, cmd), LIST_LIMIT_SECONDS)
        except asyncio.TimeoutError:
            raise SandboxError(f"listing {path!r} took longer than {LIST_LIMIT_SECONDS:g} s") from None
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"session {self._id} is gone (its container no longer exists)") from None
        if code != 0:
            if self._destroyed:
                raise SandboxNotFoundError(f"session {self._id} is gone")
            raise SandboxError(f"listing {path!r} failed: {err.decode('utf-8', 'replace').strip()}")
        records = out.split(b"\0")
        located = _walk_answer(records[:3], path)
        if not located.exists:
            raise SandboxNotFoundError(f"no folder {path!r} in the session workspace")
        if not located.is_dir:
            raise SandboxPathError(f"{path!r} is not a folder")
        entries = []
        for record in records[3:]:
            if not record:
                continue
            try:
                kind, size, stamp, name = record.decode("utf-8", "surrogateescape").split("/", 3)
            except ValueError:
                raise SandboxError(f"listing {path!r}: the session answered a malformed entry") from None
            entries.append({"name": name, "type": kind, "size": _int(size), "mtime": _mtime(stamp)})
        return sorted(entries, key=lambda e: e["name"])

    # ------------------------------------------------------------ TTL, usage

    async def set_expiry(self, expires_at: float) -> SessionInfo:
        self._check_live()
        if self._site.retime is None:
            return await super().set_expiry(expires_at)
        await self._site.retime(self, expires_at)
        self.expires_at = expires_at
        return self._info()

    async def usage(self) -> dict[str, Any]:
        """CPU and memory from one engine stats sample, the workspace's disk from ``du`` (both bounded)."""
        self._check_live()
        return await container_usage(self._engine, self._container, self._id, self._disk())

    async def _disk(self) -> int | str:
        """Bytes under /workspace from ``du -sk`` in the container, under ``timeout`` (or why there are none)."""
        code, out, _ = await asyncio.wait_for(
            self._engine.run(self._container, ["timeout", f"{USAGE_DU_SECONDS:g}", "du", "-sk", WORKSPACE]),
            USAGE_DU_SECONDS + 2,
        )
        try:
            return int(out.split()[0]) * 1024 if code == 0 else f"no disk figure: du exited with status {code}"
        except (IndexError, ValueError):
            return "no disk figure: du gave no size"

    # ------------------------------------------------------------- teardown

    async def destroy(self, remove_workspace: bool = False) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        await self._site.teardown(self, remove_workspace)


#: how long the workspace's ``du`` may run for a usage answer
USAGE_DU_SECONDS = 3.0


def _from_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """cpu_seconds, memory_bytes (page cache excluded, as ``docker stats`` shows) and memory_limit_bytes."""
    found: dict[str, Any] = {}
    cpu = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    if isinstance(cpu, (int, float)):
        found["cpu_seconds"] = cpu / 1e9
    memory = stats.get("memory_stats") or {}
    used = memory.get("usage")
    if isinstance(used, int):
        detail = memory.get("stats") or {}
        cache = detail.get("total_inactive_file", detail.get("inactive_file", 0))  # cgroup v1, v2
        found["memory_bytes"] = max(0, used - cache) if isinstance(cache, int) else used
    if isinstance(memory.get("limit"), int):
        found["memory_limit_bytes"] = memory["limit"]
    return found


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _mtime(stamp: str) -> float | None:
    """``2026-11-30 02:30:55 +0000`` (``ls --full-time``, maybe with fractions) as epoch seconds."""
    try:
        day, clock, zone = stamp.split(" ")
        whole, _, frac = clock.partition(".")
        base = calendar.timegm(time.strptime(f"{day} {whole}", "%Y-%m-%d %H:%M:%S"))
        sign = -1 if zone.startswith("-") else 1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[3:5]) * 60)
        return base - offset + (float(f"0.{frac}") if frac else 0.0)
    except (ValueError, IndexError):
        return None
