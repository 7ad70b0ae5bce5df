"""sandbox-docker: each session is one container on a Docker engine.

See :class:`DockerSandbox` for how sessions, commands and files map onto the
engine; the shell scripts run inside the container are in ``_docker_scripts``
and the exec stream transport in ``_docker_stream``.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import contextlib
import io
import json
import os
import posixpath
import re
import secrets
import tarfile
import tempfile
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

from traitlets import Bool, Dict, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ..contract import (
    ExecHandle,
    ExecResult,
    ExitItem,
    OutputChunk,
    OutputItem,
    Sandbox,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxSession,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
)
from ..image import DEFAULT_IMAGE
from ..spool import DEFAULT_MEMORY_LIMIT, OutputSpool
from . import _docker_scripts as scripts
from ._common import OUTPUT_GRACE_SECONDS, ProviderMeta, check_exec_args, new_session_id, workspace_relative
from ._docker_stream import EngineAddress, EngineRefusal, read_output, start_exec

WORKSPACE = "/workspace"
#: A kill's fixed limit: a stop that has not finished by then raises SandboxError.
KILL_LIMIT_SECONDS = 5.0
LABEL = "jupyter-tai-sandbox"
LABEL_SESSION = f"{LABEL}.session"
LABEL_CONSUMER = f"{LABEL}.consumer"
LABEL_CREATED = f"{LABEL}.created"
LABEL_EXPIRES = f"{LABEL}.expires"
LABEL_SPEC = f"{LABEL}.spec"
LABEL_WORKSPACE = f"{LABEL}.workspace"
LABEL_NETWORK = f"{LABEL}.network"
VOLUME_PREFIX = "tai-sbx-"
_SESSION_ID = re.compile(r"^sbx-[0-9a-f]{16}$")
_WRITE_CHUNK = 1 << 16
_HELD_OUTPUT_NOTE = (
    "a process the command started still held its output after the kill; "
    "the byte counts cover the output received up to the stop"
)
# Go's os.FileMode type bits, as the engine's path stat reports them
_MODE_DIR, _MODE_SYMLINK, _MODE_TYPE = 1 << 31, 1 << 27, 0x8F280000

T = TypeVar("T")


def _docker() -> Any:
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the docker extra is missing
        raise SandboxUnavailableError(
            "the docker provider needs the docker SDK: pip install 'jupyter-tai-sandbox[docker]'"
        ) from e
    return docker


def _inside(path: str) -> bool:
    return path == WORKSPACE or path.startswith(WORKSPACE + "/")


class DockerCommand(ExecHandle):
    """One command: its exec, its attached stream, its output spool and its deadline.

    The stream is read continuously into an :class:`OutputSpool` whether or not
    anyone reads; stops (kill, deadline) go through one single-flight ``_stop``.
    """

    def __init__(
        self,
        session: DockerSession,
        exec_id: str,
        token: str,
        stream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        *,
        timeout_seconds: float,
        tty: bool,
        stdin: bool,
    ) -> None:
        self._session = session
        self._exec_id = exec_id
        self._token = token
        self._reader, self._writer = stream
        self._tty = tty
        self._timeout_seconds = timeout_seconds
        self._spool = OutputSpool(session._sandbox.output_memory_limit)
        self._counts = {"stdout": 0, "stderr": 0}
        self._stdin_closed = not stdin
        self._status: int | None = None
        self._failure: SandboxError | None = None
        self._timed_out = False
        self._timeout_error: SandboxError | None = None
        self._held = False
        self._killed = False
        self._done = asyncio.Event()
        self._stop_lock = asyncio.Lock()
        self._kill_lock = asyncio.Lock()
        self._feeder: asyncio.Task[None] | None = None
        self._reading = asyncio.create_task(self._read())
        self._supervisor = asyncio.create_task(self._supervise())
        self._deadline_task: asyncio.Task[None] | None = None
        self._deadline = asyncio.get_running_loop().call_later(timeout_seconds, self._on_deadline)
        self._output = self._iterate()

    # --------------------------------------------------------------- intake

    async def _read(self) -> None:
        try:
            async for stream, data in read_output(self._reader, self._tty):
                self._counts[stream] += len(data)
                self._spool.put(stream, data)
        except (OSError, SandboxError) as e:
            self._session._sandbox.log.debug("sandbox-docker: exec stream ended: %r", e)

    async def _supervise(self) -> None:
        try:
            await asyncio.wait({self._reading})
            self._deadline.cancel()
            self._status, self._failure = await self._read_status()
        finally:
            if self._feeder is not None:
                self._feeder.cancel()
            self._writer.close()
            self._spool.close()
            self._done.set()
            self._session._forget(self)

    async def _read_status(self) -> tuple[int | None, SandboxError | None]:
        """The exec's exit status once the engine has it (the wrapper exits right after the group)."""
        api = self._session._sandbox._api
        give_up = time.monotonic() + OUTPUT_GRACE_SECONDS + 1.0
        while True:
            try:
                info = await self._session._sandbox._call(api.exec_inspect, self._exec_id)
            except SandboxError as e:
                gone = " (the session was destroyed)" if self._session._destroyed else ""
                return None, SandboxError(f"the command's exit status could not be read{gone}: {e}")
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"]), None
            if time.monotonic() > give_up:
                return None, SandboxError("the command's exit status could not be read: the engine still reports it running")
            await asyncio.sleep(0.02)

    # ---------------------------------------------------------------- stops

    def _on_deadline(self) -> None:
        if not self._reading.done():
            self._timed_out = True
            self._deadline_task = asyncio.create_task(self._deadline_stop())

    async def _deadline_stop(self) -> None:
        try:
            await self._stop()
        except SandboxError as e:
            self._timeout_error = SandboxError(
                f"the command reached its {self._timeout_seconds:g} s deadline and could not be stopped: {e}"
            )
        else:
            self._timeout_error = SandboxExecTimeoutError(
                f"the command was still running at its {self._timeout_seconds:g} s deadline and was killed",
                stdout_bytes=self._counts["stdout"],
                stderr_bytes=self._counts["stderr"],
                note=_HELD_OUTPUT_NOTE if self._held else None,
            )
        await self._done.wait()

    async def _stop(self) -> None:
        """Kill the command's group (fixed limit), then end the output; SandboxError when the stop fails."""
        async with self._stop_lock:
            if self._reading.done():
                return
            await self._session._kill_group(self._exec_id, self._token)
            await asyncio.wait({self._reading}, timeout=OUTPUT_GRACE_SECONDS)
            if not self._reading.done():
                # a process that left the group still holds the output: stop taking it in
                self._held = True
                self._reading.cancel()
        await asyncio.shield(self._done.wait())

    # ------------------------------------------------------------ the handle

    @property
    def output(self) -> AsyncIterator[OutputItem]:
        return self._output

    async def _iterate(self) -> AsyncIterator[OutputItem]:
        try:
            while True:
                item = await self._spool.get()
                if self._timed_out and not self._killed:
                    assert self._deadline_task is not None
                    await asyncio.shield(self._deadline_task)
                    if not self._killed and self._timeout_error is not None:
                        self._spool.discard()
                        raise self._timeout_error
                if item is None:
                    break
                yield OutputChunk(*item)
            await self._done.wait()
            if self._failure is not None:
                raise self._failure
            if self._status is None:  # pragma: no cover - _read_status sets one of the two
                raise SandboxError("the command's exit status could not be read")
            yield ExitItem(self._status)
        finally:
            self._spool.discard()

    async def _feed(self, data: bytes) -> None:
        """Stream a one-shot's stdin; a command that exits before reading it all drops the rest."""
        view = memoryview(data)
        try:
            for i in range(0, len(view), _WRITE_CHUNK):
                self._writer.write(view[i : i + _WRITE_CHUNK])
                await self._writer.drain()
            await self.close_stdin()
        except (OSError, RuntimeError):
            pass  # the command (and with it the stream) ended: the unread input is dropped

    async def write(self, data: bytes) -> None:
        if self._stdin_closed:
            raise SandboxError("the command's stdin is closed")
        if self._reading.done() or self._done.is_set():
            raise SandboxError("the command has exited; its stdin takes no more input")
        try:
            self._writer.write(bytes(data))
            await self._writer.drain()
        except (OSError, RuntimeError) as e:
            raise SandboxError(f"writing to the command's stdin failed: {e!r}") from None

    async def close_stdin(self) -> None:
        if self._stdin_closed:
            return
        self._stdin_closed = True
        if not self._writer.is_closing() and self._writer.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write_eof()

    async def kill(self) -> None:
        async with self._kill_lock:
            if not self._done.is_set():
                await self._stop()
            self._killed = True

    async def resize(self, rows: int, cols: int) -> None:
        if not self._tty:
            await super().resize(rows, cols)
        if self._done.is_set():
            return
        api = self._session._sandbox._api
        await self._session._sandbox._call(api.exec_resize, self._exec_id, height=int(rows), width=int(cols))

    def _abandon(self) -> None:
        """The session is gone: stop taking output in (its status read then reports why)."""
        self._reading.cancel()


class _Located:
    """A workspace path resolved in the container: its real existing part, and what does not exist yet."""

    def __init__(self, real: str, missing: list[str], stat: dict[str, Any] | None) -> None:
        self.real = real
        self.missing = missing
        self.stat = stat

    @property
    def exists(self) -> bool:
        return not self.missing

    @property
    def is_dir(self) -> bool:
        return self.stat is not None and bool(self.stat["mode"] & _MODE_DIR)

    @property
    def is_file(self) -> bool:
        return self.stat is not None and not self.stat["mode"] & _MODE_TYPE


class DockerSession(SandboxSession):
    """One session container."""

    def __init__(
        self,
        sandbox: DockerSandbox,
        container_id: str,
        session_id: str,
        spec: SessionSpec,
        created_at: float,
        expires_at: float,
    ) -> None:
        self._sandbox = sandbox
        self._container = container_id
        self._id = session_id
        self.spec = spec
        self.created_at = created_at
        self.expires_at = expires_at
        self._destroyed = False
        self._owner: tuple[int, int] | None = None

    @property
    def id(self) -> str:
        return self._id

    async def _file_owner(self) -> tuple[int, int]:
        """Uploaded files belong to the container's user when it is numeric (uid[:gid]), else to root."""
        if self._owner is None:
            attrs = await self._sandbox._call(self._sandbox._api.inspect_container, self._container, what="inspect a session")
            uid, _, gid = (attrs["Config"].get("User") or "").partition(":")
            self._owner = (int(uid), int(gid) if gid.isdigit() else int(uid)) if uid.isdigit() else (0, 0)
        return self._owner

    @property
    def container_id(self) -> str:
        return self._container

    def _info(self) -> SessionInfo:
        return SessionInfo(
            id=self._id,
            kind=self._sandbox.kind,
            spec=self.spec,
            isolation=self._sandbox.max_isolation,
            workspace=WORKSPACE,
            created_at=self.created_at,
            expires_at=self.expires_at,
        )

    async def info(self) -> SessionInfo:
        self._check_live()
        await self._sandbox._inspect_session(self._id)
        return self._info()

    def _check_live(self) -> None:
        if self._destroyed:
            raise SandboxNotFoundError(f"session {self._id} was destroyed")

    def _forget(self, command: DockerCommand) -> None:
        self._sandbox._commands.get(self._id, set()).discard(command)

    # ----------------------------------------------------------------- exec

    async def _exec_raw(self, cmd: list[str], *, env: Mapping[str, str] | None, stdin: bool, tty: bool) -> str:
        api = self._sandbox._api
        try:
            created = await self._sandbox._call(
                api.exec_create,
                self._container,
                cmd,
                stdin=stdin,
                tty=tty,
                environment=dict(env or {}),
            )
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"session {self._id} is gone (its container no longer exists)") from None
        return created["Id"]

    async def _start(
        self,
        argv: Sequence[str],
        timeout_seconds: float,
        env: Mapping[str, str] | None,
        cwd: str | None,
        *,
        stdin: bool,
        tty: bool,
    ) -> DockerCommand:
        self._check_live()
        args = check_exec_args(argv, timeout_seconds, env, cwd)
        workdir = WORKSPACE if cwd is None else await self._folder(cwd, what="cwd")
        token = secrets.token_hex(8)
        cmd = ["sh", "-c", scripts.RUN, "sh", scripts.HOLD, token, workdir, *args]
        exec_id = await self._exec_raw(cmd, env={"SANDBOX_WORKSPACE": WORKSPACE, **(env or {})}, stdin=stdin, tty=tty)
        sandbox = self._sandbox
        stream = None
        try:
            stream = await start_exec(sandbox._address, sandbox._api_version, exec_id, tty)
            command = DockerCommand(
                self, exec_id, token, stream, timeout_seconds=timeout_seconds, tty=tty, stdin=stdin
            )
        except BaseException:
            # a start that failed or was cancelled stops whatever it may have started
            if stream is not None:
                stream[1].close()
            with contextlib.suppress(SandboxError):
                await asyncio.shield(self._kill_group(exec_id, token))
            raise
        sandbox._commands.setdefault(self._id, set()).add(command)
        return command

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        if isinstance(stdin, (bytearray, memoryview)):
            stdin = bytes(stdin)
        if stdin is not None and not isinstance(stdin, bytes):
            raise SandboxSpecRejectedError("stdin must be bytes (or None for no input)")
        command = await self._start(argv, timeout_seconds, env, cwd, stdin=stdin is not None, tty=False)
        if stdin is not None:
            command._feeder = asyncio.create_task(command._feed(stdin))
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            async for item in command.output:
                if isinstance(item, OutputChunk):
                    (out if item.stream == "stdout" else err).append(item.data)
                else:
                    return ExecResult(item.exit_code, b"".join(out), b"".join(err))
        except BaseException:
            with contextlib.suppress(SandboxError):
                await asyncio.shield(command.kill())
            raise
        raise SandboxError("the command's output ended without an exit status")  # pragma: no cover

    async def exec_start(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        pty: bool = False,
    ) -> ExecHandle:
        return await self._start(argv, timeout_seconds, env, cwd, stdin=True, tty=bool(pty))

    async def _run_script(self, script: str, *args: str, limit: float, partial: list[bytes] | None = None) -> tuple[int, bytes, bytes]:
        """Run one of our own scripts (no wrapper) to its end within ``limit`` seconds."""
        exec_id = await self._exec_raw(["sh", "-c", script, "sh", *args], env=None, stdin=False, tty=False)
        out, err = bytearray(), bytearray()
        parts = partial if partial is not None else []

        async def run() -> int:
            reader, writer = await start_exec(self._sandbox._address, self._sandbox._api_version, exec_id, False)
            try:
                async for stream, data in read_output(reader, False):
                    (out if stream == "stdout" else err).extend(data)
                    parts.append(data)
            finally:
                writer.close()
            for _ in range(50):
                info = await self._sandbox._call(self._sandbox._api.exec_inspect, exec_id)
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return int(info["ExitCode"])
                await asyncio.sleep(0.02)
            raise SandboxError("the engine did not report the helper command's exit status")

        code = await asyncio.wait_for(run(), timeout=limit)
        return code, bytes(out), bytes(err)

    async def _kill_group(self, exec_id: str, token: str) -> None:
        """SIGKILL the command's process group through a separate exec, within the fixed 5 s limit."""
        partial: list[bytes] = []
        try:
            info = await asyncio.wait_for(
                self._sandbox._call(self._sandbox._api.exec_inspect, exec_id), KILL_LIMIT_SECONDS
            )
            if not info.get("Running"):
                return  # the wrapper has ended: there is nothing left to stop
            code, out, err = await self._run_script(
                scripts.KILL, token, limit=KILL_LIMIT_SECONDS, partial=partial
            )
        except asyncio.TimeoutError:
            said = b"".join(partial).decode("utf-8", "replace").strip()
            raise SandboxError(
                f"the stop did not finish within {KILL_LIMIT_SECONDS:g} s"
                + (f"; it had reported: {said}" if said else "; it had reported nothing")
            ) from None
        except SandboxNotFoundError:
            return  # the container is gone, and the command with it
        except EngineRefusal as e:
            if self._destroyed or e.status in (404, 409):
                return  # the container stopped or is gone, and the command with it
            raise SandboxError(f"the stop failed: {e}") from None
        except SandboxError as e:
            raise SandboxError(f"the stop failed: {e}") from None
        if code != 0:
            said = (err or out).decode("utf-8", "replace").strip()
            raise SandboxError(f"the stop failed (status {code}): {said or 'no error line'}")

    # ---------------------------------------------------------------- paths

    def resolve(self, path: str) -> str:
        """The container path of ``path``. Symlinks are checked through the engine (a blocking stat per component)."""
        rel = workspace_relative(path, WORKSPACE)
        self._locate(rel, path)
        return posixpath.join(WORKSPACE, rel) if rel else WORKSPACE

    def _stat(self, container_path: str) -> dict[str, Any] | None:
        """The engine's lstat of a container path (None when missing); blocking."""
        api = self._sandbox._api
        try:
            response = api.head(api._url("/containers/{0}/archive", self._container), params={"path": container_path})
        except Exception as e:
            raise SandboxUnavailableError(f"cannot reach the Docker engine at {self._sandbox.base_url}: {e}") from e
        if response.status_code == 404:
            if self._destroyed or "No such container" in response.text:
                raise SandboxNotFoundError(f"session {self._id} is gone")
            return None
        if response.status_code != 200:
            return {"mode": -1}  # e.g. a component that is not a folder
        return json.loads(base64.b64decode(response.headers["X-Docker-Container-Path-Stat"]))

    def _locate(self, rel: str, path: str) -> _Located:
        """Resolve ``rel`` component by component; a symlink leading outside the workspace raises. Blocking."""
        current, stat = WORKSPACE, self._stat(WORKSPACE)
        parts = rel.split("/") if rel else []
        for i, name in enumerate(parts):
            if stat is None or stat["mode"] == -1 or not stat["mode"] & _MODE_DIR:
                raise SandboxPathError(f"cannot use {path!r}: {current} is not a folder")
            candidate = f"{current}/{name}"
            stat = self._stat(candidate)
            if stat is None:
                return _Located(current, parts[i:], None)
            if stat["mode"] != -1 and stat["mode"] & _MODE_SYMLINK:
                target = posixpath.normpath(stat.get("linkTarget") or "/")
                if not _inside(target):
                    raise SandboxPathError(
                        f"path {path!r} leads outside the session workspace through a symlink; it is not followed"
                    )
                candidate, stat = target, self._stat(target)
                if stat is None:
                    return _Located(posixpath.dirname(target), [posixpath.basename(target), *parts[i + 1 :]], None)
            current = candidate
        return _Located(current, [], stat)

    async def _where(self, path: str) -> _Located:
        self._check_live()
        rel = workspace_relative(path, WORKSPACE)
        return await asyncio.to_thread(self._locate, rel, path)

    async def _folder(self, path: str, what: str) -> str:
        located = await self._where(path)
        if not located.exists or not located.is_dir:
            raise SandboxPathError(f"{what} {path!r} is not a folder in the session workspace")
        return located.real

    # ---------------------------------------------------------------- files

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        located = await self._where(path)
        if located.exists and located.real == WORKSPACE:
            raise SandboxPathError("put_file needs a file path inside the workspace, not the workspace itself")
        if located.exists and not located.is_file:
            raise SandboxPathError(f"cannot write {path!r}: it exists and is not a regular file")
        if located.exists:
            folder, parents, name = posixpath.dirname(located.real), [], posixpath.basename(located.real)
        else:
            folder, parents, name = located.real, located.missing[:-1], located.missing[-1]
        with tempfile.SpooledTemporaryFile(max_size=8 << 20, prefix="tai-sandbox-upload-") as body:
            if isinstance(data, (bytes, bytearray, memoryview)):
                await asyncio.to_thread(body.write, data)
            else:
                async for chunk in data:
                    await asyncio.to_thread(body.write, chunk)
            size = body.tell()
            body.seek(0)
            archive = _tar_stream(parents, name, body, size, await self._file_owner())
            api = self._sandbox._api
            try:
                await self._sandbox._call(api.put_archive, self._container, folder, archive)
            except SandboxNotFoundError:
                raise SandboxNotFoundError(f"session {self._id} is gone") from None

    async def _file(self, path: str) -> str:
        located = await self._where(path)
        if not located.exists:
            raise SandboxNotFoundError(f"no file {path!r} in the session workspace")
        if not located.is_file:
            raise SandboxPathError(f"{path!r} is not a regular file")
        return located.real

    async def get_file(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.iter_file(path)])

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        real = await self._file(path)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=4)
        stop = threading.Event()
        api = self._sandbox._api

        def hand(item: bytes | BaseException | None) -> None:
            asyncio.run_coroutine_threadsafe(queue.put(item), loop).result()

        def produce() -> None:
            try:
                stream, _ = api.get_archive(self._container, real, chunk_size=chunk_size)
                try:
                    with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:
                        member = tar.next()
                        handle = tar.extractfile(member) if member is not None else None
                        while handle is not None and not stop.is_set():
                            chunk = handle.read(chunk_size)
                            if not chunk:
                                break
                            hand(chunk)
                finally:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()
                hand(None)
            except BaseException as e:
                if not stop.is_set():
                    hand(e)

        worker = loop.run_in_executor(None, produce)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise self._sandbox._translate(item, "read a file") from None
                yield item
        finally:
            stop.set()
            while not worker.done():
                while not queue.empty():
                    queue.get_nowait()
                await asyncio.wait({worker}, timeout=0.05)

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        located = await self._where(path)
        if not located.exists:
            raise SandboxNotFoundError(f"no folder {path!r} in the session workspace")
        if not located.is_dir:
            raise SandboxPathError(f"{path!r} is not a folder")
        code, out, err = await self._run_script(scripts.LIST, located.real, limit=60)
        if code != 0:
            raise SandboxError(f"listing {path!r} failed: {err.decode('utf-8', 'replace').strip()}")
        entries = []
        for record in out.split(b"\0"):
            if not record:
                continue
            kind, size, stamp, name = record.decode("utf-8", "surrogateescape").split("/", 3)
            entries.append({"name": name, "type": kind, "size": _int(size), "mtime": _mtime(stamp)})
        return sorted(entries, key=lambda e: e["name"])

    # ------------------------------------------------------------- teardown

    async def destroy(self, remove_workspace: bool = False) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        await self._sandbox._destroy(self._id, self._container, self.spec, remove_workspace)


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


class _ChunkReader(io.RawIOBase):
    """A file-like view of the engine's archive chunks, for a streaming tarfile."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def _tar_stream(parents: list[str], name: str, body: Any, size: int, owner: tuple[int, int]) -> Any:
    """A tar archive (as chunks) holding the missing parent folders and the file, streamed from ``body``."""
    now = int(time.time())

    def header(entry: str, kind: bytes, mode: int, length: int = 0) -> bytes:
        info = tarfile.TarInfo(entry)
        info.type, info.mode, info.mtime, info.size = kind, mode, now, length
        info.uid, info.gid = owner
        return info.tobuf(format=tarfile.PAX_FORMAT)

    def chunks() -> Any:
        for i in range(len(parents)):
            yield header("/".join(parents[: i + 1]), tarfile.DIRTYPE, 0o755)
        yield header("/".join([*parents, name]), tarfile.REGTYPE, 0o644, size)
        while chunk := body.read(1 << 20):
            yield chunk
        if size % tarfile.BLOCKSIZE:
            yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    return chunks()


class DockerSandbox(LoggingConfigurable, Sandbox, metaclass=ProviderMeta):
    """sandbox-docker: each session is one container on a Docker engine.

    **Sessions.** A session is a container running the engine's init (``init``)
    as PID 1 -- it reaps what commands leave behind -- over a long ``sleep``.
    Its labels (``jupyter-tai-sandbox.session``, ``.consumer``, ``.created``,
    ``.expires``, ``.spec`` with env *names* only) let any DockerSandbox on the
    engine -- a restarted server included -- find, list and reap it; containers
    without the session label are never touched. The spec's env values live
    only in the container's environment. The workspace is ``/workspace``: an
    anonymous volume removed with the container (ephemeral), or the named
    volume ``tai-sbx-<workspace_key>`` (persistent), which survives destroy
    and reap and goes only with ``destroy(remove_workspace=True)``. Networks:
    ``egress`` is the default bridge, ``none`` has no network, ``internal``
    joins the ``internal_network`` (created on demand with ``internal=True``:
    no route out, reachable only from containers on it; removed when its last
    session is destroyed). cpu and memory_mb become NanoCpus and Memory.

    **Commands.** Each command runs under a small ``sh`` wrapper (see
    ``_docker_scripts``) that leads the command's own process group and holds
    it while the command runs or a process it started still holds its output.
    A kill is a separate exec of ``kill -9 -<group>`` with a fixed 5 s limit;
    once the wrapper has ended a kill finds nothing to stop, and what the
    command left running keeps running. The wrapper records the command's own
    status, so a kill after the exit still reports it. Deadlines are timers
    on the event loop and kill whether or not anyone reads.

    **Transport.** Blocking SDK calls (create, inspect, archive) run in worker
    threads. Exec streams do not: each exec's attached connection is opened with
    asyncio streams (``_docker_stream``) and read by one task per command into
    an :class:`OutputSpool` (bounded memory, spilling to a temporary file), so
    there is no thread per exec, the engine's socket is drained continuously,
    and stdin is written with backpressure (``drain``) and half-closed for EOF.

    **The engine's close of an output stream.** About 2 s after a command's
    exec exits, the engine closes its output stream, whatever is still pending.
    With more than roughly 1 MiB still in the engine's buffers, a reader that
    paused for longer would lose it without any sign. This provider reads every
    stream continuously into its spool, so a consumer may read late or slowly
    and still gets a finished command's whole output; a provider that only
    read when its consumer did would lose it.

    **Files** go through the engine's archive API, confined to ``/workspace``:
    each path component is checked with the engine's stat and a symlink leading
    outside the workspace is refused; uploads are extracted under the resolved
    folder with the missing parent folders in the archive itself.
    """

    kind = "docker"
    max_isolation = "container"
    networks = frozenset({"egress", "internal", "none"})
    supports_limits = True

    image = Unicode(
        DEFAULT_IMAGE,
        help="""Session image when a spec names none. It must provide sh, setsid, mkfifo, mv, rm, cat,
        kill, readlink, ls and a fractional sleep, /proc and a writable /tmp. Build the default with
        `jupyter tai-sandbox build-image`.""",
    ).tag(config=True)

    base_url = Unicode(
        help="Docker engine URL (unix:// or tcp://). Default: $DOCKER_HOST, else unix:///var/run/docker.sock.",
    ).tag(config=True)

    cap_drop = List(
        Unicode(), default_value=["ALL"], help="Linux capabilities dropped from session containers."
    ).tag(config=True)

    cap_add = List(
        Unicode(), default_value=[], help="Linux capabilities added back to session containers (after cap_drop)."
    ).tag(config=True)

    no_new_privileges = Bool(
        True, help="Run session containers with no-new-privileges (setuid binaries gain nothing)."
    ).tag(config=True)

    pids_limit = Integer(
        1024, help="Most processes a session container may hold at once (0: the engine's default, unlimited)."
    ).tag(config=True)

    read_only_rootfs = Bool(
        False,
        help="Mount the container's root filesystem read-only (/tmp becomes a tmpfs; /workspace stays writable).",
    ).tag(config=True)

    user = Unicode(
        "",
        help="""User commands run as, 'uid[:gid]' or a name the image knows ('' = the image's USER).
        Uploaded files belong to that user when it is numeric, else to root.""",
    ).tag(config=True)

    internal_network = Unicode(
        "tai-sbx-internal",
        help="Docker network (internal: no route out) that network='internal' sessions join; made on demand.",
    ).tag(config=True)

    output_memory_limit = Integer(
        DEFAULT_MEMORY_LIMIT,
        help="Bytes of a command's unread output kept in memory before it spills to a temporary file.",
    ).tag(config=True)

    extra_labels = Dict(
        value_trait=Unicode(),
        help="Extra labels put on every session container and workspace volume this provider makes.",
    ).tag(config=True)

    @default("base_url")
    def _base_url_default(self) -> str:
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client: Any = None
        self._network_lock: asyncio.Lock | None = None
        self._commands: dict[str, set[DockerCommand]] = {}

    # --------------------------------------------------------------- engine

    @property
    def _api(self) -> Any:
        assert self._client is not None, "call _connect() first"
        return self._client.api

    @property
    def _api_version(self) -> str:
        return str(self._api._version)

    async def _connect(self) -> Any:
        if self._client is None:
            self._address = EngineAddress(self.base_url)
            docker = _docker()

            def connect() -> Any:
                return docker.DockerClient(base_url=self.base_url, version="auto", timeout=120)

            try:
                self._client = await asyncio.to_thread(connect)
            except Exception as e:
                raise SandboxUnavailableError(
                    f"cannot reach the Docker engine at {self.base_url}: {e}. Start one (dockerd) or set "
                    "DockerSandbox.base_url / DOCKER_HOST"
                ) from None
        return self._client

    def _translate(self, error: BaseException, what: str) -> BaseException:
        """An SDK (or requests) exception as the contract's error."""
        if isinstance(error, SandboxError):
            return error
        docker = _docker()
        errors = docker.errors
        if isinstance(error, errors.NotFound):
            return SandboxNotFoundError(f"the Docker engine found nothing to {what}: {_explain(error)}")
        if isinstance(error, errors.APIError):
            return SandboxError(f"the Docker engine at {self.base_url} refused to {what}: {_explain(error)}")
        if isinstance(error, (errors.DockerException, OSError)) or type(error).__module__.startswith(
            ("requests", "urllib3")
        ):
            return SandboxUnavailableError(f"cannot reach the Docker engine at {self.base_url} to {what}: {error}")
        return error

    async def _call(self, fn: Callable[..., T], *args: Any, what: str | None = None, **kwargs: Any) -> T:
        """Run a blocking SDK call in a worker thread, with its errors typed."""
        await self._connect()
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as e:
            raise self._translate(e, what or getattr(fn, "__name__", "answer").replace("_", " ")) from None

    # ------------------------------------------------------------- sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        self.check_spec(spec)
        await self._connect()
        session_id = new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = {
            **self.extra_labels,
            LABEL_SESSION: session_id,
            LABEL_CONSUMER: spec.consumer,
            LABEL_CREATED: repr(now),
            LABEL_EXPIRES: repr(expires),
            LABEL_SPEC: json.dumps(spec.to_public_json()),
        }
        if spec.network == "internal":
            async with self._lock_network():
                await self._ensure_network()
                container_id = await self._call(self._create_container, spec, session_id, labels, what="create")
        else:
            container_id = await self._call(self._create_container, spec, session_id, labels, what="create")
        self.log.debug("sandbox-docker: created %s (%s)", session_id, container_id[:12])
        return DockerSession(self, container_id, session_id, spec, now, expires)

    def _create_container(self, spec: SessionSpec, session_id: str, labels: dict[str, str]) -> str:
        """Create and start the session container (blocking); remove it again if the start fails."""
        docker = _docker()
        image = spec.image or self.image
        client = self._client
        if spec.durability == "persistent":
            volume = VOLUME_PREFIX + str(spec.workspace_key)
            try:
                client.volumes.get(volume)
            except docker.errors.NotFound:
                client.volumes.create(volume, labels={**self.extra_labels, LABEL_WORKSPACE: str(spec.workspace_key)})
            mount = docker.types.Mount(WORKSPACE, volume, type="volume")
        else:
            mount = docker.types.Mount(
                WORKSPACE, None, type="volume", labels={**self.extra_labels, LABEL_SESSION: session_id}
            )
        network: dict[str, Any] = {
            "egress": {"network_mode": "bridge"},
            "none": {"network_mode": "none"},
            "internal": {"network": self.internal_network},
        }[spec.network]
        limits: dict[str, Any] = {}
        if spec.cpu is not None:
            limits["nano_cpus"] = int(spec.cpu * 1e9)
        if spec.memory_mb is not None:
            limits["mem_limit"] = f"{spec.memory_mb}m"
            limits["memswap_limit"] = f"{spec.memory_mb}m"
        if self.pids_limit > 0:
            limits["pids_limit"] = self.pids_limit
        if self.read_only_rootfs:
            limits["read_only"] = True
            limits["tmpfs"] = {"/tmp": "rw,nosuid,nodev,mode=1777"}
        env = {"HOME": WORKSPACE, "SANDBOX_WORKSPACE": WORKSPACE, **spec.env}
        try:
            container = client.containers.create(
                image,
                entrypoint=["sleep", "2147483647"],
                command=[],
                name=f"tai-{session_id}",
                labels=labels,
                environment=env,
                working_dir=WORKSPACE,
                user=self.user or None,
                init=True,
                mounts=[mount],
                cap_drop=list(self.cap_drop) or None,
                cap_add=list(self.cap_add) or None,
                security_opt=["no-new-privileges"] if self.no_new_privileges else None,
                privileged=False,
                detach=True,
                **network,
                **limits,
            )
        except docker.errors.ImageNotFound:
            raise SandboxSpecRejectedError(
                f"image {image!r} is not on the Docker engine at {self.base_url}: build it "
                f"(`jupyter tai-sandbox build-image --name {image}` for the minimal image) or load it"
            ) from None
        try:
            container.start()
        except BaseException:
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
            raise
        return container.id

    @contextlib.asynccontextmanager
    async def _lock_network(self) -> AsyncIterator[None]:
        if self._network_lock is None:
            self._network_lock = asyncio.Lock()
        async with self._network_lock:
            yield

    async def _ensure_network(self) -> None:
        def ensure() -> None:
            client = self._client
            if not [n for n in client.networks.list(names=[self.internal_network]) if n.name == self.internal_network]:
                client.networks.create(
                    self.internal_network,
                    driver="bridge",
                    internal=True,
                    check_duplicate=True,
                    # no address of this machine on the bridge: sessions reach each other, not the host
                    options={"com.docker.network.bridge.inhibit_ipv4": "true"},
                    labels={LABEL_NETWORK: "internal"},
                )

        await self._call(ensure, what="create the internal network")

    async def _drop_network(self) -> None:
        """Remove the internal network once no container is on it (the engine refuses otherwise)."""

        def drop() -> None:
            docker = _docker()
            for network in self._client.networks.list(names=[self.internal_network]):
                if network.name != self.internal_network:
                    continue
                network.reload()
                if not network.attrs.get("Containers"):
                    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                        network.remove()

        async with self._lock_network():
            await self._call(drop, what="remove the internal network")

    async def _containers(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """Our session containers' summaries (all states), optionally one session's."""
        label = LABEL_SESSION if session_id is None else f"{LABEL_SESSION}={session_id}"
        await self._connect()
        return await self._call(self._api.containers, all=True, filters={"label": label}, what="list containers")

    def _session_from(self, summary: Mapping[str, Any], env: Sequence[str] | None) -> DockerSession:
        labels = summary.get("Labels") or {}
        public = json.loads(labels[LABEL_SPEC])
        values = dict(item.split("=", 1) for item in env or () if "=" in item)
        public["env"] = {name: values.get(name, "") for name in public.get("env", [])}
        spec = SessionSpec.from_json(public)
        return DockerSession(
            self,
            summary["Id"],
            labels[LABEL_SESSION],
            spec,
            float(labels[LABEL_CREATED]),
            float(labels[LABEL_EXPIRES]),
        )

    async def _inspect_session(self, session_id: str) -> dict[str, Any]:
        await self._connect()
        if not isinstance(session_id, str) or not _SESSION_ID.match(session_id):
            raise SandboxNotFoundError(f"no docker sandbox session {session_id!r}")
        found = await self._containers(session_id)
        if not found:
            raise SandboxNotFoundError(f"no docker sandbox session {session_id!r}")
        try:
            return await self._call(self._api.inspect_container, found[0]["Id"], what="inspect a session")
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"no docker sandbox session {session_id!r}") from None

    async def get(self, session_id: str) -> SandboxSession:
        attrs = await self._inspect_session(session_id)
        summary = {"Id": attrs["Id"], "Labels": attrs["Config"].get("Labels") or {}}
        try:
            return self._session_from(summary, attrs["Config"].get("Env"))
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(f"container {attrs['Id'][:12]} has unreadable session labels: {e}") from None

    async def list(self) -> list[SessionInfo]:
        infos = []
        for summary in await self._containers():
            try:
                infos.append(self._session_from(summary, None)._info())
            except (KeyError, ValueError, SandboxError):
                continue
        return sorted(infos, key=lambda i: i.created_at)

    async def reap(self) -> list[str]:
        now = time.time()
        reaped = []
        for summary in await self._containers():
            labels = summary.get("Labels") or {}
            try:
                expired = float(labels[LABEL_EXPIRES]) <= now
                session = self._session_from(summary, None)
            except (KeyError, ValueError, SandboxError):
                continue
            if expired:
                try:
                    await session.destroy(remove_workspace=False)
                except SandboxNotFoundError:
                    continue  # reaped meanwhile by someone else
                reaped.append(session.id)
        if reaped:
            self.log.info("sandbox-docker: reaped %s", ", ".join(reaped))
        return reaped

    async def _destroy(self, session_id: str, container_id: str, spec: SessionSpec, remove_workspace: bool) -> None:
        for command in self._commands.pop(session_id, set()):
            command._abandon()
        docker = _docker()

        def remove() -> None:
            try:
                self._client.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise

        await self._call(remove, what="remove a session container")
        if spec.network == "internal":
            await self._drop_network()
        if remove_workspace and spec.durability == "persistent":
            volume = VOLUME_PREFIX + str(spec.workspace_key)

            def drop_volume() -> None:
                with contextlib.suppress(docker.errors.NotFound):
                    self._client.api.remove_volume(volume)

            await self._call(drop_volume, what=f"remove the workspace volume {volume} (is another session using it?)")
        self.log.debug("sandbox-docker: destroyed %s", session_id)

    async def close(self) -> None:
        commands = [c for group in self._commands.values() for c in group]
        await asyncio.gather(*(c.kill() for c in commands), return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.close)


def _explain(error: Any) -> str:
    return str(getattr(error, "explanation", None) or error)
