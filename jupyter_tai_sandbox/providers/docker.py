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

from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ..contract import (
    ExecHandle,
    ExecRequest,
    ExecResult,
    ExitItem,
    OutputChunk,
    OutputItem,
    Sandbox,
    SandboxError,
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
from ._common import (
    OUTPUT_GRACE_SECONDS,
    ProviderMeta,
    deadline_error,
    new_session_id,
    run_to_end,
    workspace_relative,
)
from ._docker_pool import WarmPool, owner_gone
from ._docker_stream import EngineAddress, EngineRefusal, read_output, start_exec

WORKSPACE = "/workspace"
#: A kill's fixed limit: a stop that has not finished by then raises SandboxError.
KILL_LIMIT_SECONDS = 5.0
#: A pty command's terminal: its window (rows, cols) at the start, and its TERM.
PTY_TERM = "xterm-256color"
LABEL = "jupyter-tai-sandbox"
LABEL_SESSION = f"{LABEL}.session"
LABEL_CONSUMER = f"{LABEL}.consumer"
LABEL_CREATED = f"{LABEL}.created"
LABEL_EXPIRES = f"{LABEL}.expires"
LABEL_SPEC = f"{LABEL}.spec"
LABEL_WORKSPACE = f"{LABEL}.workspace"
LABEL_NETWORK = f"{LABEL}.network"
#: on a warm-pool container: its owner (see _docker_pool)
LABEL_POOL = f"{LABEL}.pool"
#: on a session record volume: the id of the pooled container the session runs in
LABEL_RECORD = f"{LABEL}.record"
RECORD_PREFIX = "tai-rec-"
#: where a pooled session's spec env is kept inside its container, for a restarted server
POOLED_ENV_FILE = "/tmp/.tai-sbx-env.json"
VOLUME_PREFIX = "tai-sbx-"
_SESSION_ID = re.compile(r"^sbx-[0-9a-f]{16}$")
_WRITE_CHUNK = 1 << 18
#: stdin bytes the transport buffers before a write waits (asyncio's default is 64 KiB)
_WRITE_BUFFER = 1 << 20
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


def _check_window(rows: int, cols: int) -> None:
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n < 10000 for n in (rows, cols)):
        raise SandboxSpecRejectedError(f"invalid terminal size {rows}x{cols}")


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
        self._writer.transport.set_write_buffer_limits(high=_WRITE_BUFFER)
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
            self._timeout_error = deadline_error(self._timeout_seconds, self._counts, self._held)
        await self._done.wait()

    async def _stop(self) -> None:
        """Kill the command's group (fixed limit), then end the output; SandboxError when the stop fails."""
        async with self._stop_lock:
            if self._reading.done():
                return
            await self._session._kill_group(self._exec_id, self._token, pty=self._tty)
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
        if self._tty:
            await self._send_end_of_file()
            return
        self._stdin_closed = True
        if not self._writer.is_closing() and self._writer.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write_eof()

    async def _send_end_of_file(self) -> None:
        """A terminal has no half-close: send its end-of-file character (^D), as a user would."""
        if not self._done.is_set() and not self._reading.done():
            with contextlib.suppress(SandboxError):
                await self.write(b"\x04")
        self._stdin_closed = True

    async def kill(self) -> None:
        async with self._kill_lock:
            if not self._done.is_set():
                await self._stop()
            self._killed = True

    async def resize(self, rows: int, cols: int) -> None:
        if not self._tty:
            await super().resize(rows, cols)
        _check_window(rows, cols)
        if self._done.is_set():
            return
        try:
            await self._session._resize(self._exec_id, rows, cols)
        except SandboxError:
            if await self._session._exec_running(self._exec_id):
                raise
            # the command ended meanwhile: there is no terminal left to resize

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
        record: str | None = None,
    ) -> None:
        self._sandbox = sandbox
        self._container = container_id
        #: the record volume of a session started in a pooled container (None otherwise)
        self._record = record
        self._id = session_id
        self.spec = spec
        self.created_at = created_at
        self.expires_at = expires_at
        self._destroyed = False
        self._owner: tuple[int, int] | None = None
        #: environment given to every exec (a pooled container was started without the spec's env)
        self._exec_env: dict[str, str] = {}

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
        if self._record is None:
            await self._sandbox._inspect_session(self._id)
        else:
            await self._sandbox._inspect_pooled(self._id, self._container)
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
        exec_id = await self._exec_raw(cmd, env=command_env, stdin=stdin, tty=tty)
        sandbox = self._sandbox
        stream = None
        try:
            stream = await start_exec(sandbox._address, sandbox._api_version, exec_id, tty)
            command = DockerCommand(
                self, exec_id, token, stream, timeout_seconds=request.timeout_seconds, tty=tty, stdin=stdin
            )
            if tty:
                # an image without stty still gets its window size from the engine (unless it ended already)
                with contextlib.suppress(SandboxError):
                    await self._resize(exec_id, *window)
        except BaseException:
            # a start that failed or was cancelled stops whatever it may have started
            if stream is not None:
                stream[1].close()
            with contextlib.suppress(SandboxError):
                await asyncio.shield(self._kill_group(exec_id, token, pty=tty))
            raise
        sandbox._commands.setdefault(self._id, set()).add(command)
        return command

    async def run(self, request: ExecRequest) -> ExecResult:
        command = await self._start(request, stdin=request.stdin is not None, tty=False)
        if request.stdin is not None:
            command._feeder = asyncio.create_task(command._feed(request.stdin))
        return await run_to_end(command)

    async def start(self, request: ExecRequest) -> ExecHandle:
        return await self._start(request, stdin=True, tty=request.pty)

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

    async def _exec_running(self, exec_id: str) -> bool:
        with contextlib.suppress(SandboxError):
            info = await self._sandbox._call(self._sandbox._api.exec_inspect, exec_id)
            return bool(info.get("Running"))
        return False

    async def _resize(self, exec_id: str, rows: int, cols: int) -> None:
        api = self._sandbox._api
        await self._sandbox._call(api.exec_resize, exec_id, height=rows, width=cols, what="resize a terminal")

    async def _kill_group(self, exec_id: str, token: str, *, pty: bool = False) -> None:
        """SIGKILL the command's process group (its session, on a terminal) through a separate exec.

        The stop has a fixed limit of 5 s.
        """
        partial: list[bytes] = []
        try:
            info = await asyncio.wait_for(
                self._sandbox._call(self._sandbox._api.exec_inspect, exec_id), KILL_LIMIT_SECONDS
            )
            if not info.get("Running"):
                return  # the wrapper has ended: there is nothing left to stop
            code, out, err = await self._run_script(
                scripts.KILL_PTY if pty else scripts.KILL, token, limit=KILL_LIMIT_SECONDS, partial=partial
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
        await self._sandbox._destroy(self._id, self._container, self.spec, remove_workspace, self._record)


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

    **Terminals.** ``exec_start(pty=True)`` runs a tty exec under
    ``RUN_PTY`` instead: the engine makes the exec's process the leader of a
    new session whose controlling terminal is the tty, and the command runs in
    the foreground group there, so ^C (0x03 written to stdin) interrupts it,
    ``stty size`` works (24x80 at the start, then each resize()) and an
    interactive shell's job control works. A stop kills every process of that
    session (an interactive shell moves jobs to groups of their own), found by
    session id in ``/proc/*/stat``; the holder reports the command's own status
    (137 when it was killed). ``close_stdin`` sends the terminal's end-of-file
    character (^D).

    **Warm pool.** With ``pool_size`` > 0, containers for the default spec are
    started ahead and handed out at create (see ``_docker_pool``): a session
    in one is found through its record volume ``tai-rec-<session id>`` (the
    same labels a session container carries; the container is renamed
    ``tai-<session id>``), its spec env is passed to each exec and kept in the
    container (``/tmp/.tai-sbx-env.json``) for a restarted server. Pooled
    containers are never listed as sessions and never serve a second session.

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

    pool_size = Integer(
        0,
        help="""Warm pool: how many pre-started containers wait for sessions of the default spec (the
        default image, ephemeral, egress network, no cpu/memory caps; any env, which is then given to
        each command). A create takes one instead of starting a container, and the pool refills in the
        background. A pooled container serves one session only. 0 turns the pool off.""",
    ).tag(config=True)

    pool_idle_seconds = Float(
        3600.0,
        help="""Longest a pooled container waits unclaimed: older ones are replaced, and any provider's
        reap removes an unclaimed pooled container past this age (at once when its owning process on this
        host is gone). close() removes the pool's containers.""",
    ).tag(config=True)

    @default("base_url")
    def _base_url_default(self) -> str:
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._client: Any = None
        self._network_lock: asyncio.Lock | None = None
        self._commands: dict[str, set[DockerCommand]] = {}
        self._pool = WarmPool(self)
        #: spec env of the pooled sessions this provider handed out (others read it from the container)
        self._pooled_env: dict[str, dict[str, str]] = {}
        self._background: set[asyncio.Task[Any]] = set()

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
            self._pool.fill_soon()
        return self._client

    def _spawn(self, coro: Any) -> None:
        """Run a housekeeping coroutine in the background; close() waits for it."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        if self._poolable(spec):
            container_id = self._pool.take()
            if container_id is not None:
                session = await self._claim(container_id, spec, session_id, now, expires)
                if session is not None:
                    return session
        labels = {
            **self.extra_labels,
            LABEL_SESSION: session_id,
            LABEL_CONSUMER: spec.consumer,
            LABEL_CREATED: repr(now),
            LABEL_EXPIRES: repr(expires),
            LABEL_SPEC: json.dumps(spec.to_public_json()),
        }
        names = (f"tai-{session_id}", labels, {**self.extra_labels, LABEL_SESSION: session_id})
        if spec.network == "internal":
            async with self._lock_network():
                await self._ensure_network()
                container_id = await self._call(self._create_container, spec, *names, what="create")
        else:
            container_id = await self._call(self._create_container, spec, *names, what="create")
        self.log.debug("sandbox-docker: created %s (%s)", session_id, container_id[:12])
        return DockerSession(self, container_id, session_id, spec, now, expires)

    # ------------------------------------------------------------ warm pool

    def _poolable(self, spec: SessionSpec) -> bool:
        """A spec a pooled container can serve: the default one, env aside."""
        return (
            self.pool_size > 0
            and spec.image in (None, self.image)
            and spec.durability == "ephemeral"
            and spec.network == "egress"
            and spec.cpu is None
            and spec.memory_mb is None
            and not (spec.env and self.read_only_rootfs)  # the env is kept in the container's /tmp
        )

    async def _create_pooled(self, owner: str) -> str:
        now = time.time()
        labels = {
            **self.extra_labels,
            LABEL_POOL: owner,
            LABEL_CREATED: repr(now),
            LABEL_EXPIRES: repr(now + self.pool_idle_seconds),
        }
        name = f"tai-pool-{secrets.token_hex(8)}"
        volume_labels = {**self.extra_labels, LABEL_POOL: owner}
        return await self._call(
            self._create_container, SessionSpec(), name, labels, volume_labels, what="start a pooled container"
        )

    async def _claim(
        self, container_id: str, spec: SessionSpec, session_id: str, now: float, expires: float
    ) -> DockerSession | None:
        """Make a pooled container the session's: its record volume, and its name. None if that failed."""
        api = self._api
        record = RECORD_PREFIX + session_id
        labels = {
            **self.extra_labels,
            LABEL_RECORD: container_id,
            LABEL_SESSION: session_id,
            LABEL_CONSUMER: spec.consumer,
            LABEL_CREATED: repr(now),
            LABEL_EXPIRES: repr(expires),
            LABEL_SPEC: json.dumps(spec.to_public_json()),
        }
        made = await asyncio.gather(
            self._call(api.create_volume, record, labels=labels, what="record a session"),
            self._call(api.rename, container_id, f"tai-{session_id}", what="name a session container"),
            return_exceptions=True,
        )
        failed = [r for r in made if isinstance(r, BaseException)]
        if failed:
            self.log.warning("sandbox-docker: a pooled container could not be claimed: %s", failed[0])
            self._spawn(self._remove_container(container_id, record))
            return None
        session = DockerSession(self, container_id, session_id, spec, now, expires, record=record)
        session._exec_env = dict(spec.env)
        self._pooled_env[session_id] = dict(spec.env)
        if spec.env:
            self._spawn(self._save_env(container_id, spec.env))
        self.log.debug("sandbox-docker: created %s in pooled container %s", session_id, container_id[:12])
        return session

    async def _save_env(self, container_id: str, env: Mapping[str, str]) -> None:
        """Keep a pooled session's spec env in its container (root-only file), for a restarted server."""
        body = json.dumps(dict(env)).encode()
        info = tarfile.TarInfo(posixpath.basename(POOLED_ENV_FILE))
        info.size, info.mode, info.mtime = len(body), 0o600, int(time.time())
        archive = info.tobuf(format=tarfile.PAX_FORMAT) + body + b"\0" * (-len(body) % tarfile.BLOCKSIZE)
        archive += b"\0" * (2 * tarfile.BLOCKSIZE)
        try:
            await self._call(self._api.put_archive, container_id, posixpath.dirname(POOLED_ENV_FILE), archive)
        except SandboxError as e:
            self.log.warning("sandbox-docker: could not keep a pooled session's env in %s: %s", container_id[:12], e)

    async def _load_env(self, container_id: str) -> dict[str, str]:
        def load() -> dict[str, str]:
            stream, _ = self._api.get_archive(container_id, POOLED_ENV_FILE)
            with tarfile.open(fileobj=_ChunkReader(stream), mode="r|") as tar:
                member = tar.next()
                handle = tar.extractfile(member) if member is not None else None
                return json.loads(handle.read()) if handle is not None else {}

        try:
            env = await self._call(load, what="read a pooled session's env")
        except SandboxNotFoundError:
            return {}
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    async def _remove_container(self, container_id: str, record: str | None = None) -> None:
        """Remove a container (and its anonymous volume) and a record volume; missing ones are fine."""
        docker = _docker()

        def remove() -> None:
            try:
                self._client.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise
            if record is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    self._client.api.remove_volume(record)

        await self._call(remove, what="remove a session container")

    async def _records(self) -> list[dict[str, Any]]:
        """The record volumes of sessions in pooled containers."""
        found = await self._call(self._api.volumes, filters={"label": LABEL_RECORD}, what="list session records")
        return list((found or {}).get("Volumes") or [])

    async def _pooled_containers(self) -> list[dict[str, Any]]:
        return await self._call(
            self._api.containers, all=True, filters={"label": LABEL_POOL}, what="list pooled containers"
        )

    def _session_from_record(self, volume: Mapping[str, Any], env: Mapping[str, str]) -> DockerSession:
        labels = volume.get("Labels") or {}
        summary = {"Id": labels[LABEL_RECORD], "Labels": labels}
        session = self._session_from(summary, [f"{k}={v}" for k, v in env.items()])
        session._record = volume["Name"]
        session._exec_env = dict(session.spec.env)
        return session

    async def _inspect_pooled(self, session_id: str, container_id: str) -> dict[str, Any]:
        try:
            return await self._call(self._api.inspect_container, container_id, what="inspect a session")
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"no docker sandbox session {session_id!r}") from None

    async def _get_pooled(self, session_id: str) -> DockerSession:
        """A session in a pooled container, from its record volume."""
        try:
            volume = await self._call(self._api.inspect_volume, RECORD_PREFIX + session_id, what="find a session")
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"no docker sandbox session {session_id!r}") from None
        labels = volume.get("Labels") or {}
        if labels.get(LABEL_SESSION) != session_id or LABEL_RECORD not in labels:
            raise SandboxNotFoundError(f"no docker sandbox session {session_id!r}")
        await self._inspect_pooled(session_id, labels[LABEL_RECORD])
        env = self._pooled_env.get(session_id)
        if env is None:
            env = await self._load_env(labels[LABEL_RECORD])
        try:
            return self._session_from_record(volume, env)
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(f"session record {volume.get('Name')} is unreadable: {e}") from None

    async def _reap_pool(self, now: float) -> list[str]:
        """Expired pooled sessions, records left without a container, and stale unclaimed containers."""
        records, pooled = await asyncio.gather(self._records(), self._pooled_containers())
        alive = {c["Id"] for c in pooled}
        claimed = set()
        reaped = []
        for volume in records:
            labels = volume.get("Labels") or {}
            container_id = labels.get(LABEL_RECORD, "")
            claimed.add(container_id)
            try:
                expired = float(labels[LABEL_EXPIRES]) <= now
            except (KeyError, ValueError):
                expired = True
            if expired or container_id not in alive:
                await self._forget_pooled(labels.get(LABEL_SESSION, ""))
                await self._remove_container(container_id, volume["Name"])
                if expired and labels.get(LABEL_SESSION):
                    reaped.append(labels[LABEL_SESSION])
        for container in pooled:
            labels = container.get("Labels") or {}
            if container["Id"] in claimed or self._pool.is_ours(labels, LABEL_POOL):
                continue
            try:
                stale = float(labels[LABEL_EXPIRES]) <= now
            except (KeyError, ValueError):
                stale = True
            if stale or owner_gone(labels.get(LABEL_POOL, "")):
                await self._remove_container(container["Id"])
        return reaped

    async def _forget_pooled(self, session_id: str) -> None:
        self._pooled_env.pop(session_id, None)
        for command in self._commands.pop(session_id, set()):
            command._abandon()

    def _create_container(
        self, spec: SessionSpec, name: str, labels: dict[str, str], volume_labels: dict[str, str]
    ) -> str:
        """Create and start a container (blocking); remove it again if the start fails."""
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
            mount = docker.types.Mount(WORKSPACE, None, type="volume", labels=volume_labels)
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
                name=name,
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
        if session_id in self._pooled_env:
            return await self._get_pooled(session_id)
        try:
            attrs = await self._inspect_session(session_id)
        except SandboxNotFoundError:
            if not (isinstance(session_id, str) and _SESSION_ID.match(session_id)):
                raise
            return await self._get_pooled(session_id)
        summary = {"Id": attrs["Id"], "Labels": attrs["Config"].get("Labels") or {}}
        try:
            return self._session_from(summary, attrs["Config"].get("Env"))
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(f"container {attrs['Id'][:12]} has unreadable session labels: {e}") from None

    async def list(self) -> list[SessionInfo]:
        await self._connect()
        summaries, records, pooled = await asyncio.gather(
            self._containers(), self._records(), self._pooled_containers()
        )
        alive = {c["Id"] for c in pooled}
        infos = []
        for summary in summaries:
            try:
                infos.append(self._session_from(summary, None)._info())
            except (KeyError, ValueError, SandboxError):
                continue
        for volume in records:
            if (volume.get("Labels") or {}).get(LABEL_RECORD) not in alive:
                continue  # its container is gone: the reap removes the record
            try:
                infos.append(self._session_from_record(volume, {})._info())
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
        reaped += await self._reap_pool(now)
        if reaped:
            self.log.info("sandbox-docker: reaped %s", ", ".join(reaped))
        return reaped

    async def _destroy(
        self, session_id: str, container_id: str, spec: SessionSpec, remove_workspace: bool, record: str | None
    ) -> None:
        await self._forget_pooled(session_id)
        docker = _docker()
        await self._remove_container(container_id, record)
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
        await self._pool.close()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.close)


def _explain(error: Any) -> str:
    return str(getattr(error, "explanation", None) or error)
