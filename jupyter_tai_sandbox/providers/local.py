"""sandbox-local: each session's commands run as plain host subprocesses. No isolation.

The workspace is a host directory: ``<root>/<workspace_key>`` for a persistent
session (created or adopted, never removed by a reap), a fresh directory under
``<root>/.ephemeral/`` otherwise (removed on destroy and reap). Only
``isolation="none"`` and ``network="egress"`` are honoured; cpu/memory caps are
rejected. ``image`` is inert: recorded in info() and the session's sidecar file.

Process groups: every command joins a fresh process group led by a small holder
process (``true``, left unreaped: a zombie keeps its pid, and so the group id,
out of reuse). The group keeps its id after the command exits, so a stop never
signals a group id since given to other processes, and the command itself is not
a group leader (it may call setsid). A completed one-shot lets its group go (what
it left running keeps running); an interactive command's group is kept until
kill() or the session's teardown. A process that leaves the group (setsid) is
never stopped. Exits are watched with pidfds on the event loop, not a thread per
child.

Commands see a small environment, not the server's: PATH, LANG, LC_ALL and TZ
from the server (``inherit_env``), HOME set to the workspace, then the spec's
env (credentials), then the exec's env.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ..contract import (
    DEFAULT_WINDOW,
    ExecHandle,
    ExecRequest,
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
    SessionInfo,
    SessionSpec,
)
from ..spool import DEFAULT_MEMORY_LIMIT, OutputSpool
from ._common import (
    KILLED_EXIT_CODE,
    OUTPUT_GRACE_SECONDS,
    ProviderMeta,
    deadline_error,
    new_session_id,
    run_to_end,
    workspace_relative,
)

_WRITE_CHUNK = 1 << 16


def _exit_status(returncode: int) -> int:
    """Python's -N for a signal becomes 128+N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def _group_kwargs(pgid: int) -> dict[str, Any]:
    """Start a child in process group ``pgid`` (0: a new group led by the child)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}  # pragma: no cover - 3.10


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


_TRUE = shutil.which("true") or "/bin/true"


def spawn_group_holder() -> int:
    """A holder for a new process group: ``true`` spawned as the group's leader and left unreaped.

    Its zombie keeps the group id reserved (a pid is not given out again before it is
    reaped), so the group keeps its id after the command has exited, at the cost of no
    running process and no pipe. Reaped by :func:`reap_holder`.
    """
    return os.posix_spawn(_TRUE, [_TRUE], {}, setpgroup=0)


def holder_unreaped(pid: int) -> bool:
    """Whether the holder is still ours (running or a zombie): only then is its group id still ours."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def reap_holder(pid: int) -> None:
    """Reap a holder now if it has exited (``true`` exits at once), else once it does."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            on_child_exit(pid, lambda _returncode: None)


def on_child_exit(pid: int, callback: Callable[[int], None]) -> None:
    """Reap child ``pid`` once it exits, then call ``callback(returncode)`` on the running loop.

    A pidfd watched by the loop where the kernel has them (no thread per child, unlike
    asyncio's default child watcher); a thread blocked in waitpid otherwise.
    """
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        threading.Thread(
            target=lambda: loop.call_soon_threadsafe(callback, _wait(pid, 0)),
            name=f"tai-sandbox-wait-{pid}",
            daemon=True,
        ).start()
        return

    def readable() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        callback(_wait(pid, os.WNOHANG))

    loop.add_reader(pidfd, readable)


def _wait(pid: int, options: int) -> int:
    try:
        _, status = os.waitpid(pid, options)
    except ChildProcessError:  # reaped by someone else: its status is lost
        return 255
    return os.waitstatus_to_exitcode(status)


class LocalCommand(ExecHandle):
    """One command: its group's holder, its process, its output and its deadline.

    The command's pipes are read continuously into an :class:`OutputSpool`
    (through :class:`_PipeRelay`), whether or not anyone reads.
    """

    def __init__(
        self, *, timeout_seconds: float, one_shot: bool, memory_limit: int, stdout_pipe_size: int = 0
    ) -> None:
        loop = asyncio.get_running_loop()
        self._timeout_seconds = timeout_seconds
        self._stdout_pipe_size = stdout_pipe_size
        self._one_shot = one_shot
        self._spool = OutputSpool(memory_limit)
        self._counts = {"stdout": 0, "stderr": 0}
        self._open_outputs = {1, 2}
        self._exited: asyncio.Future[None] = loop.create_future()
        self._output_ended: asyncio.Future[None] = loop.create_future()
        self._status: int | None = None
        self._failure: SandboxError | None = None
        self._timeout_error: SandboxExecTimeoutError | None = None
        self._killed = False
        self._stdin: asyncio.WriteTransport | None = None
        self._stdin_closed = False
        self._stdin_lost = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._writers = 0
        self._feeder: asyncio.Task[None] | None = None
        self._group_held = False
        self._stop_requested = asyncio.Event()
        self._done = asyncio.Event()
        self._output = self._iterate()
        self._kill_lock = asyncio.Lock()

    # ---------------------------------------------------------------- start

    async def start(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bytes | bool | None,
        holder: int | None = None,
        window: tuple[int, int] = DEFAULT_WINDOW,
    ) -> None:
        """Spawn the command in the group of ``holder`` (a fresh one from :func:`spawn_group_holder`).

        ``stdin``: bytes to feed, None for /dev/null, True for a pipe. ``window`` is for terminals.
        """
        loop = asyncio.get_running_loop()
        self._pgid = holder if holder is not None else spawn_group_holder()
        self._group_held = True
        self._pipes: list[asyncio.BaseTransport] = []
        self._deadline = loop.time() + self._timeout_seconds
        try:
            try:
                process = self._spawn(argv, env=env, cwd=cwd, stdin=stdin)
            except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
                # as a shell would: 127 not found, 126 not executable
                status = "127" if isinstance(e, FileNotFoundError) else "126"
                script = ["sh", "-c", 'printf "%s\\n" "$1" >&2; exit "$2"', "sh", f"{argv[0]}: {e.strerror}", status]
                process = self._spawn(script, env=env, cwd=cwd, stdin=stdin)
            self._process = process
            on_child_exit(process.pid, self._process_reaped)
            if self._stdout_pipe_size:
                with contextlib.suppress(OSError):  # over the user's pipe allowance: keep the default
                    fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, self._stdout_pipe_size)
            for fd, pipe in ((1, process.stdout), (2, process.stderr)):
                transport, _ = await loop.connect_read_pipe(lambda fd=fd: _PipeRelay(self, fd), pipe)
                self._pipes.append(transport)
            if process.stdin is not None:
                self._stdin, _ = await loop.connect_write_pipe(  # type: ignore[assignment]
                    lambda: _PipeRelay(self, 0), process.stdin
                )
                self._pipes.append(self._stdin)  # type: ignore[arg-type]
            if isinstance(stdin, bytes):
                self._feeder = asyncio.create_task(self._feed(stdin))
            self._supervisor = asyncio.create_task(self._supervise())
        except BaseException:
            self._release_group(stop_group=True)
            self._close_transport()
            raise

    def _spawn(self, argv: list[str], *, env: dict[str, str], cwd: str, stdin: bytes | bool | None) -> Any:
        # Popen directly, not loop.subprocess_exec: the exit comes from a pidfd, with no
        # watcher thread per child (half the cost of a short command).
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            bufsize=0,
            **_group_kwargs(self._pgid),
        )

    def _process_reaped(self, returncode: int) -> None:
        self._process.returncode = returncode  # reaped here: Popen must not wait for it again
        self.process_exited()

    # -------------------------------------------------- subprocess protocol

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        stream = "stdout" if fd == 1 else "stderr"
        self._counts[stream] += len(data)
        self._spool.put(stream, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 0:
            self._stdin_lost = True
            self._can_write.set()
            return
        self._open_outputs.discard(fd)
        if not self._open_outputs and not self._output_ended.done():
            self._output_ended.set_result(None)

    def process_exited(self) -> None:
        if not self._exited.done():
            self._exited.set_result(None)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # ----------------------------------------------------------------- stdin

    async def _write(self, data: bytes | memoryview) -> None:
        if self._stdin_lost or self._stdin is None or self._stdin.is_closing():
            raise BrokenPipeError("the command's stdin is closed")
        self._stdin.write(data)
        if not self._can_write.is_set():
            await self._can_write.wait()
            if self._stdin_lost:  # lost while this write was still buffered
                raise BrokenPipeError("the command's stdin closed before the input was written")

    async def _feed(self, data: bytes) -> None:
        try:
            view = memoryview(data)
            for i in range(0, len(view), _WRITE_CHUNK):
                await self._write(view[i : i + _WRITE_CHUNK])
        except BrokenPipeError:
            pass  # the command closed its stdin: the input it did not read is dropped
        await self.close_stdin()

    def _stdin_pending(self) -> bool:
        if self._feeder is not None and not self._feeder.done():
            return True
        if self._stdin is None or self._stdin_lost:
            return False
        return self._writers > 0 or self._stdin.get_write_buffer_size() > 0

    def _stdin_has_reader(self) -> bool:
        pipe = self._stdin.get_extra_info("pipe") if self._stdin is not None else None
        if pipe is None or pipe.closed:
            return False
        poller = select.poll()
        poller.register(pipe.fileno(), select.POLLOUT)
        return not any(events & select.POLLERR for _, events in poller.poll(0))

    def _on_command_exit(self) -> None:
        """A command that exits while a process it started holds its stdin, with input unwritten, failed."""
        if not self._stdin_pending():
            return
        if self._stdin_has_reader():
            self._failure = SandboxError(
                "the command exited while a process it started still held its stdin, "
                "with input not yet written"
            )
        # the input nobody will read is dropped
        if self._feeder is not None:
            self._feeder.cancel()
        self._stdin_closed = True
        if self._stdin is not None:
            self._stdin.abort()

    # -------------------------------------------------------------- lifetime

    async def _race(self, awaited: asyncio.Future[Any], stop: asyncio.Task[Any]) -> str:
        timeout = max(0.0, self._deadline - asyncio.get_running_loop().time())
        done, _ = await asyncio.wait({awaited, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if awaited in done:
            return "done"
        return "stop" if stop in done else "deadline"

    async def _supervise(self) -> None:
        stop = asyncio.create_task(self._stop_requested.wait())
        try:
            outcome = await self._race(self._exited, stop)
            if outcome == "done":
                self._on_command_exit()
                if self._failure is not None and self._one_shot:
                    outcome = "stop"
                else:
                    outcome = await self._race(self._output_ended, stop)
            if outcome != "done":
                self._release_group(stop_group=True)
                await self._exited
                await asyncio.wait({self._output_ended}, timeout=OUTPUT_GRACE_SECONDS)
                held = not self._output_ended.done()
                if outcome == "deadline":
                    self._timeout_error = deadline_error(self._timeout_seconds, self._counts, held)
            self._status = self._read_status()
        finally:
            stop.cancel()
            self._close_transport()
            self._spool.close()
            self._done.set()
            if self._one_shot:
                self._release_group(stop_group=False)

    def _close_transport(self) -> None:
        # closes every pipe, including output a process that left the group still holds
        for pipe in self._pipes:
            pipe.close()

    def _read_status(self) -> int | None:
        returncode = self._process.returncode
        return None if returncode is None else _exit_status(returncode)

    def _release_group(self, *, stop_group: bool) -> None:
        """Let the group go, stopping it first if asked; the group id is never signalled again."""
        if not self._group_held:
            return
        self._group_held = False
        if stop_group and holder_unreaped(self._pgid):
            # the holder is not reaped, so the group id is still this command's
            _killpg(self._pgid)
        reap_holder(self._pgid)

    # ------------------------------------------------------------ the handle

    @property
    def output(self) -> AsyncIterator[OutputItem]:
        return self._output

    async def _iterate(self) -> AsyncIterator[OutputItem]:
        try:
            while True:
                item = await self._spool.get()
                if self._timeout_error is not None and not self._killed:
                    raise self._timeout_error
                if item is None:
                    break
                yield OutputChunk(*item)
            await self._done.wait()
            if self._failure is not None:
                raise self._failure
            if self._status is None:
                raise SandboxError("the command's exit status could not be read")
            yield ExitItem(self._status)
        finally:
            self._spool.discard()

    async def write(self, data: bytes) -> None:
        if self._stdin_closed:
            raise SandboxError("the command's stdin is closed")
        if self._done.is_set() or self._exited.done():
            raise SandboxError("the command has exited; its stdin takes no more input")
        self._writers += 1
        try:
            await self._write(bytes(data))
        except BrokenPipeError as e:
            raise SandboxError(f"writing to the command's stdin failed: {e}") from None
        finally:
            self._writers -= 1

    async def close_stdin(self) -> None:
        if self._stdin_closed:
            return
        self._stdin_closed = True
        if self._stdin is not None:
            self._stdin.close()

    async def kill(self) -> None:
        async with self._kill_lock:
            self._killed = True
            if not self._done.is_set():
                self._stop_requested.set()
                await asyncio.shield(self._done.wait())
            self._release_group(stop_group=True)
            await self._holder_gone()

    async def _holder_gone(self) -> None:
        pass  # the group's holder is reaped by _release_group


# The pty holder leads a new session and takes the terminal as its controlling tty (its stdin
# and stdout arrive as the control and status pipes, moved to fds 3 and 4: dash takes only
# one-digit fds). It runs the command in its own group, so ^C reaches it, reports the
# command's status on fd 4, lets go of the terminal and waits until fd 3 is closed.
_PTY_HOLDER = """exec 3<&0 4>&1 0<>"$1" 1>&0 2>&0
shift
trap : INT QUIT TSTP HUP
"$@" 3<&- 4>&-
status=$?
exec 0<&- 1>&- 2>&-
echo "$status" >&4
exec 4>&-
read _ <&3
"""


class _PipeRelay(asyncio.Protocol):
    """Forwards one pipe (0 stdin, 1 stdout, 2 stderr) to its command, as a subprocess transport would."""

    def __init__(self, command: LocalCommand, fd: int) -> None:
        self._command, self._fd = command, fd

    def data_received(self, data: bytes) -> None:
        self._command.pipe_data_received(self._fd, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._command.pipe_connection_lost(self._fd, exc)

    def pause_writing(self) -> None:
        self._command.pause_writing()

    def resume_writing(self) -> None:
        self._command.resume_writing()


class LocalPtyCommand(LocalCommand, asyncio.SubprocessProtocol):
    """An interactive command on a pseudo-terminal: one output stream, resize, ^C as a signal.

    The holder is the command's parent here (a command can only share the terminal's
    session as its descendant), so the status comes from the holder over a pipe. A
    stop kills the whole session, since an interactive shell moves jobs to groups of
    their own. A command stopped while running reports 137: it was killed by SIGKILL.
    ``close_stdin`` sends the terminal's end-of-file character (^D).
    """

    async def start(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bytes | bool | None,
        holder: int | None = None,
        window: tuple[int, int] = DEFAULT_WINDOW,
    ) -> None:
        # no group holder (the session gives none): the pty holder is the command's parent
        loop = asyncio.get_running_loop()
        self._open_outputs = {1}
        self._stopped = False
        self._pty_status = bytearray()
        self._holder_exited = asyncio.Event()
        master, slave = pty.openpty()
        _set_window(master, *window)
        status_r, status_w = os.pipe()
        control_r, self._control = os.pipe()
        try:
            self._transport, _ = await loop.subprocess_exec(
                lambda: self,
                "sh",
                "-c",
                _PTY_HOLDER,
                "sh",
                os.ttyname(slave),
                *argv,
                stdin=control_r,
                stdout=status_w,
                stderr=slave,
                start_new_session=True,
                cwd=cwd,
                env={"TERM": "xterm-256color", **env},
            )
        except BaseException:
            os.close(master)
            os.close(status_r)
            os.close(self._control)
            raise
        finally:
            for fd in (slave, status_w, control_r):
                os.close(fd)
        self._pgid = self._transport.get_pid()
        self._group_held = True
        self._deadline = loop.time() + self._timeout_seconds
        self._master = master
        self._status_pipe, _ = await loop.connect_read_pipe(
            lambda: _PtyStatus(self), os.fdopen(status_r, "rb", buffering=0)
        )
        self._output_pipe, _ = await loop.connect_read_pipe(
            lambda: _PipeRelay(self, 1), os.fdopen(master, "rb", buffering=0)
        )
        self._stdin, _ = await loop.connect_write_pipe(  # type: ignore[assignment]
            lambda: _PipeRelay(self, 0), os.fdopen(os.dup(master), "wb", buffering=0)
        )
        self._supervisor = asyncio.create_task(self._supervise())

    def process_exited(self) -> None:
        self._holder_exited.set()  # the command's own exit comes from the status pipe

    def _status_reported(self) -> None:
        if not self._exited.done():
            self._exited.set_result(None)

    def _on_command_exit(self) -> None:
        pass  # the terminal is shared with whatever the command started: no stdin accounting

    def _close_transport(self) -> None:
        self._output_pipe.close()
        if self._stdin is not None:
            self._stdin.close()

    def _read_status(self) -> int | None:
        reported = self._pty_status.decode(errors="replace").strip()
        if reported.isdigit():
            return int(reported)
        return KILLED_EXIT_CODE if self._stopped else None

    def _release_group(self, *, stop_group: bool) -> None:
        if not self._group_held:
            return
        self._group_held = False
        if stop_group and self._transport.get_returncode() is None:
            # the holder leads the session and is alive: every member is this command's
            self._stopped = True
            for pid in _session_members(self._pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            _killpg(self._pgid)
        os.close(self._control)

    async def _holder_gone(self) -> None:
        await self._holder_exited.wait()

    async def close_stdin(self) -> None:
        if self._stdin_closed or self._exited.done():
            return
        with contextlib.suppress(BrokenPipeError):
            await self._write(b"\x04")
        self._stdin_closed = True

    async def resize(self, rows: int, cols: int) -> None:
        if not (isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 10000 and 0 < cols < 10000):
            raise SandboxSpecRejectedError(f"invalid terminal size {rows}x{cols}")
        if not self._done.is_set():
            _set_window(self._master, rows, cols)


class _PtyStatus(asyncio.Protocol):
    def __init__(self, command: LocalPtyCommand) -> None:
        self._command = command

    def data_received(self, data: bytes) -> None:
        self._command._pty_status.extend(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._command._status_reported()


def _set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            members.append(int(entry))
    return members


class LocalSession(SandboxSession):
    def __init__(
        self, sandbox: LocalSandbox, session_id: str, spec: SessionSpec, workspace: Path, created_at: float
    ) -> None:
        self._sandbox = sandbox
        self._id = session_id
        self.spec = spec
        self.workspace = workspace
        self.created_at = created_at
        self.expires_at = created_at + spec.ttl_seconds
        self._interactive: set[LocalCommand] = set()
        self._destroyed = False
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
        return {**base, **self.spec.env, **(env or {})}

    def _command_cwd(self, cwd: str | None) -> str:
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
            memory_limit=self._sandbox.output_memory_limit,
            stdout_pipe_size=self._sandbox.stdout_pipe_size,
        )
        env_, cwd_ = self._command_env(request.env), self._command_cwd(request.cwd)
        stdin: bytes | bool | None = request.stdin if one_shot else True
        holder = None if pty else self._take_holder()
        args = list(request.argv)
        try:
            await command.start(args, env=env_, cwd=cwd_, stdin=stdin, holder=holder, window=request.window)
        except OSError as e:
            raise SandboxError(f"could not start {args[0]!r}: {e}") from e
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
        return await run_to_end(await self._start(request, one_shot=True))

    async def start(self, request: ExecRequest) -> ExecHandle:
        command = await self._start(request, one_shot=False)
        self._interactive.add(command)
        return command

    # --------------------------------------------------------------- files

    def resolve(self, path: str) -> str:
        return str(self._host_path(path))

    def _host_path(self, path: str) -> Path:
        rel = workspace_relative(path, str(self.workspace))
        full = self.workspace / rel if rel else self.workspace
        real = Path(os.path.realpath(full))
        if real != self.workspace and self.workspace not in real.parents:
            raise SandboxPathError(
                f"path {path!r} leads outside the session workspace through a symlink; it is not followed"
            )
        return full

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        self._check_live()
        target = self._host_path(path)
        if target == self.workspace:
            raise SandboxPathError("put_file needs a file path inside the workspace, not the workspace itself")
        try:
            await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
            self._host_path(path)  # a parent created meanwhile must not be a way out either
            temp = target.with_name(f".{target.name}.tai-upload-{os.getpid()}")
            handle = await asyncio.to_thread(open, temp, "wb")
            try:
                if isinstance(data, (bytes, bytearray, memoryview)):
                    await asyncio.to_thread(handle.write, data)
                else:
                    async for chunk in data:
                        await asyncio.to_thread(handle.write, chunk)
            except BaseException:
                handle.close()
                temp.unlink(missing_ok=True)
                raise
            handle.close()
            await asyncio.to_thread(os.replace, temp, target)
        except (IsADirectoryError, NotADirectoryError, FileExistsError) as e:
            raise SandboxPathError(f"cannot write {path!r}: {e.strerror}") from None

    def _file_to_read(self, path: str) -> Path:
        self._check_live()
        target = self._host_path(path)
        try:
            mode = target.stat().st_mode
        except FileNotFoundError:
            raise SandboxNotFoundError(f"no file {path!r} in the session workspace") from None
        if not stat.S_ISREG(mode):
            raise SandboxPathError(f"{path!r} is not a regular file")
        return target

    async def get_file(self, path: str) -> bytes:
        return await asyncio.to_thread(self._file_to_read(path).read_bytes)

    async def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self._file_to_read(path), "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, chunk_size):
                yield chunk
        finally:
            handle.close()

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        self._check_live()
        folder = self._host_path(path)
        if not folder.is_dir():
            if not folder.exists():
                raise SandboxNotFoundError(f"no folder {path!r} in the session workspace")
            raise SandboxPathError(f"{path!r} is not a folder")
        return await asyncio.to_thread(_scan, folder)

    # ------------------------------------------------------------ teardown

    async def destroy(self, remove_workspace: bool = False) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        await asyncio.gather(*(command.kill() for command in self._interactive), return_exceptions=True)
        self._interactive.clear()
        self._drop_spare_holder()
        await self._sandbox._forget(self, remove_workspace)


def _scan(folder: Path) -> list[dict[str, Any]]:
    entries = []
    with os.scandir(folder) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
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


class LocalSandbox(LoggingConfigurable, Sandbox, metaclass=ProviderMeta):
    """sandbox-local: runs each session's code directly on the host. No isolation."""

    kind = "local"
    max_isolation = "none"
    networks = frozenset({"egress"})
    supports_limits = False
    session_class: type[LocalSession] = LocalSession
    command_class: type[LocalCommand] = LocalCommand
    pty_command_class: type[LocalCommand] = LocalPtyCommand

    root = Unicode(
        help="""Folder holding the workspaces (SANDBOX_LOCAL_ROOT): persistent ones at
        <root>/<workspace_key>, ephemeral ones under <root>/.ephemeral/, session sidecar
        files under <root>/.sessions/. Default: <jupyter data dir>/tai_sandbox/local.""",
    ).tag(config=True)

    inherit_env = List(
        Unicode(),
        default_value=["PATH", "LANG", "LC_ALL", "TZ"],
        help="Server environment variables passed on to commands (the rest of the server's environment is not).",
    ).tag(config=True)

    output_memory_limit = Integer(
        DEFAULT_MEMORY_LIMIT,
        help="Bytes of a command's unread output kept in memory before it spills to a temporary file.",
    ).tag(config=True)

    stdout_pipe_size = Integer(
        256 << 10,
        min=0,
        max=16 << 20,
        help="""Kernel buffer of each command's stdout pipe, in bytes (Linux F_SETPIPE_SZ, rounded
        up to a power of two pages; at most /proc/sys/fs/pipe-max-size for unprivileged users).
        Larger pipes mean fewer wake-ups when a command writes a lot; each running command holds
        this much of its user's pipe allowance. 0 keeps the system default (64 KiB).""",
    ).tag(config=True)

    @default("root")
    def _root_default(self) -> str:
        return os.environ.get("SANDBOX_LOCAL_ROOT") or os.path.join(
            jupyter_data_dir(), "tai_sandbox", "local"
        )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sessions: dict[str, LocalSession] = {}

    @property
    def _root(self) -> Path:
        return Path(os.path.realpath(self.root))

    def _sidecar(self, session_id: str) -> Path:
        return self._root / ".sessions" / f"{session_id}.json"

    async def create(self, spec: SessionSpec) -> SandboxSession:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        self.check_spec(spec)
        session_id = new_session_id()
        if spec.durability == "persistent":
            workspace = self._root / spec.workspace_key  # type: ignore[operator]
        else:
            workspace = self._root / ".ephemeral" / session_id
        now = time.time()
        session = self.session_class(self, session_id, spec, workspace, now)
        record = {
            "id": session_id,
            "kind": self.kind,
            "image": spec.image,
            "consumer": spec.consumer,
            "durability": spec.durability,
            "workspace_key": spec.workspace_key,
            "workspace": str(workspace),
            "created_at": now,
            "expires_at": session.expires_at,
            "pid": os.getpid(),
            "spec": spec.to_public_json(),
        }
        try:
            await asyncio.to_thread(self._provision, workspace, session_id, record)
        except OSError as e:
            raise SandboxError(f"cannot provision the workspace {workspace}: {e}") from e
        self._sessions[session_id] = session
        self.log.debug("sandbox-local: created %s at %s", session_id, workspace)
        return session

    def _provision(self, workspace: Path, session_id: str, record: dict[str, Any]) -> None:
        if workspace.is_symlink() or (workspace.exists() and not workspace.is_dir()):
            raise SandboxSpecRejectedError(
                f"{workspace} exists and is not a folder: it cannot be a workspace"
            )
        workspace.mkdir(parents=True, exist_ok=True)
        sidecar = self._sidecar(session_id)
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        temp = sidecar.with_suffix(".tmp")
        temp.write_text(json.dumps(record, indent=1))
        os.replace(temp, sidecar)

    async def get(self, session_id: str) -> SandboxSession:
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise SandboxNotFoundError(f"no local sandbox session {session_id!r}")
        return session

    async def list(self) -> list[SessionInfo]:
        return [s._info() for s in self._sessions.values()]

    async def _forget(self, session: LocalSession, remove_workspace: bool) -> None:
        self._sessions.pop(session.id, None)
        remove = session.spec.durability == "ephemeral" or remove_workspace
        await asyncio.to_thread(self._remove_files, session.id, session.workspace if remove else None)

    def _remove_files(self, session_id: str, workspace: Path | None) -> None:
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
        self._sidecar(session_id).unlink(missing_ok=True)

    async def reap(self) -> list[str]:
        now = time.time()
        reaped = [s.id for s in list(self._sessions.values()) if s.expires_at <= now]
        for session_id in reaped:
            session = self._sessions.get(session_id)
            if session is not None:
                await session.destroy(remove_workspace=False)
        reaped += await asyncio.to_thread(self._reap_orphans, now)
        if reaped:
            self.log.info("sandbox-local: reaped %s", ", ".join(reaped))
        return reaped

    def _reap_orphans(self, now: float) -> list[str]:
        """Expired sessions an earlier server process left behind (found by their sidecar)."""
        reaped = []
        folder = self._root / ".sessions"
        for sidecar in folder.glob("*.json") if folder.is_dir() else ():
            session_id = sidecar.stem
            if session_id in self._sessions:
                continue
            try:
                record = json.loads(sidecar.read_text())
            except (OSError, ValueError):
                continue
            if record.get("expires_at", now) > now:
                continue
            workspace = self._root / ".ephemeral" / session_id
            self._remove_files(session_id, workspace if record.get("durability") != "persistent" else None)
            reaped.append(session_id)
        return reaped

    async def close(self) -> None:
        for session in list(self._sessions.values()):
            await asyncio.gather(*(c.kill() for c in session._interactive), return_exceptions=True)
            session._drop_spare_holder()
