"""LocalCommand: one host command of sandbox-local, its process group, output, stdin and deadline.

The command runs as a direct child of the server in a fresh process group kept by
a holder (:func:`.posix.spawn_group_holder`). Its pipes are read continuously into
an :class:`OutputSpool` whether or not anyone reads; its exit is watched by a
:class:`.posix.ChildWatch`. The pty variant lives in :mod:`.pty`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import select
import subprocess
from collections.abc import AsyncIterator
from typing import Any

from ...contract import (
    DEFAULT_WINDOW,
    ExecHandle,
    ExitItem,
    OutputChunk,
    OutputItem,
    OutputStream,
    SandboxError,
    SandboxExecTimeoutError,
)
from ...spool import OutputSpool
from .._common import OUTPUT_GRACE_SECONDS, deadline_error, spill_overflow_error
from .posix import (
    ChildWatch,
    exit_status,
    group_alive,
    holder_unreaped,
    killpg,
    reap_holder,
    spawn_group_holder,
    spawn_kwargs,
)

_WRITE_CHUNK = 1 << 16


class LocalCommand(ExecHandle):
    """One command: its group's holder, its process, its output and its deadline.

    The command's pipes are read continuously into an :class:`OutputSpool`
    (through :class:`_PipeRelay`), whether or not anyone reads.
    """

    def __init__(
        self, *, timeout_seconds: float, one_shot: bool, memory_limit: int, stdout_pipe_bytes: int = 0
    ) -> None:
        loop = asyncio.get_running_loop()
        self._timeout_seconds = timeout_seconds
        self._stdout_pipe_bytes = stdout_pipe_bytes
        self._stdout_pipe: _GrowingPipe | None = None
        self._one_shot = one_shot
        self._spool = OutputSpool(memory_limit)
        self._counts = {"stdout": 0, "stderr": 0}
        self._open_outputs = {1, 2}
        self._exited: asyncio.Future[None] = loop.create_future()
        self._output_ended: asyncio.Future[None] = loop.create_future()
        self._status: int | None = None
        self._returncode: int | None = None
        self._watch: ChildWatch | None = None
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
        self._spool.on_overflow = self._on_overflow

    def _on_overflow(self) -> None:
        """Unread output passed the disk cap: stop the command; its output ends with the reason."""
        self._failure = spill_overflow_error(self._counts)
        self._stop_requested.set()

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
            # a program that cannot start (absent, not executable) raises here: the session makes it the typed
            # SandboxRequestError naming argv (never an invented exit status such as a shell's 127)
            process = self._spawn(argv, env=env, cwd=cwd, stdin=stdin)
            self._process = process
            self._watch = ChildWatch(process.pid, self._process_reaped)
            for fd, pipe in ((1, process.stdout), (2, process.stderr)):
                transport, _ = await loop.connect_read_pipe(functools.partial(_PipeRelay, self, fd), pipe)
                self._pipes.append(transport)
                if fd == 1:
                    self._stdout_pipe = _GrowingPipe(transport, pipe.fileno(), self._stdout_pipe_bytes)
            if process.stdin is not None:
                self._stdin, _ = await loop.connect_write_pipe(lambda: _PipeRelay(self, 0), process.stdin)
                self._pipes.append(self._stdin)
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
            **spawn_kwargs(self._pgid),
        )

    def _process_reaped(self, returncode: int | None) -> None:
        """``returncode`` None: the status was lost (reaped elsewhere); it is never made up."""
        self._returncode = returncode
        # reaped here: Popen must never wait for (or warn about) the pid again
        self._process.returncode = returncode if returncode is not None else -1
        self.process_exited()

    # -------------------------------------------------- subprocess protocol

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1 and self._stdout_pipe is not None:
            self._stdout_pipe.read(len(data))
        stream: OutputStream = "stdout" if fd == 1 else "stderr"
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
        # a pipe transport already closing (its reader went away) must not be closed twice: asyncio's
        # would run its connection_lost twice, or fail outright once it has run
        if self._stdin is not None and not self._stdin.is_closing():
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
                held = await self._stop_group()
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

    async def _stop_group(self) -> bool:
        """Kill the command and its group, and let the group go once the command's exit is known; whether a
        process that left the group still holds the output then.

        The group's processes close their ends of the pipes as they die, moments after the SIGKILL. Once none
        is left alive, a pipe that still has a writer is held by a process outside the group, and waiting
        longer would show nothing more: the answer comes then, not after a fixed wait. At most
        OUTPUT_GRACE_SECONDS (a process in an uninterruptible sleep dies only when it wakes).
        """
        loop = asyncio.get_running_loop()
        self._kill_group()
        try:
            await self._exited
            give_up = loop.time() + OUTPUT_GRACE_SECONDS
            while not self._output_ended.done() and (left := give_up - loop.time()) > 0:
                # the group first: a member dying between the two looks would otherwise count as a holder
                group_dead = not await asyncio.to_thread(group_alive, self._pgid)
                if not self._output_has_writers():
                    await asyncio.wait({self._output_ended}, timeout=left)  # its rest and end are on the way
                elif not group_dead:
                    await asyncio.sleep(min(left, 0.005))
                    continue
                break
            return not self._output_ended.done()
        finally:
            self._release_group(stop_group=True)

    def _output_has_writers(self) -> bool:
        """Whether an output pipe not yet at its end still has a writer: no hang-up on its read end (a pipe
        whose end was read is closed already)."""
        fds = []
        for transport in self._pipes:
            pipe = transport.get_extra_info("pipe") if isinstance(transport, asyncio.ReadTransport) else None
            if pipe is not None and not pipe.closed:
                fds.append(pipe.fileno())
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        hung_up = {fd for fd, events in poller.poll(0) if events & (select.POLLHUP | select.POLLERR)}
        return any(fd not in hung_up for fd in fds)

    def _close_transport(self) -> None:
        # closes every pipe, including output a process that left the group still holds
        for pipe in self._pipes:
            pipe.close()

    def _read_status(self) -> int | None:
        returncode = self._returncode
        return None if returncode is None else exit_status(returncode)

    def _release_group(self, *, stop_group: bool) -> None:
        """Let the group go, stopping it first if asked; the group id is never signalled again.

        A stop also kills the command's own process, which may have left the group
        (setsid): it is our unreaped child, so the signal cannot reach another process.
        """
        if not self._group_held:
            return
        if stop_group:
            self._kill_group()
        self._group_held = False
        reap_holder(self._pgid)

    def _kill_group(self) -> None:
        """SIGKILL the command's own process and every process of its group; the group's holder stays
        unreaped, so the group keeps its id (see _release_group)."""
        if not self._group_held:
            return
        if self._watch is not None:
            self._watch.kill()
        if holder_unreaped(self._pgid):
            # the holder is not reaped, so the group id is still this command's
            killpg(self._pgid)

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


class _GrowingPipe:
    """A command's stdout pipe, grown to ``grows_to`` bytes (and read in pieces that large) once the command
    fills it.

    A command that writes a lot then moves its output in a quarter of the reads at 1 MiB against 256 KiB,
    and everything after the read (the server's websocket, a gate, a transcript) handles a quarter of the
    chunks: benchmarks/run.py's websocket row went from 0.72x to 0.96x a raw TCP relay. A command that
    writes little keeps the system's pipe (64 KiB), so a user's many commands do not use up their pipe
    allowance (/proc/sys/fs/pipe-user-pages-soft, past which the kernel gives their new pipes 8 KiB).
    """

    def __init__(self, transport: asyncio.BaseTransport, fd: int, grows_to: int) -> None:
        self._transport, self._fd = transport, fd
        self._size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) if grows_to else 0  # no syscall when it never grows
        self._grows_to = grows_to if grows_to > self._size else 0

    def read(self, size: int) -> None:
        """A read of ``size`` bytes came from the pipe: a read of all it holds means the command filled it."""
        if self._grows_to and size >= self._size:
            grows_to, self._grows_to = self._grows_to, 0
            with contextlib.suppress(OSError):  # over the user's pipe allowance: it stays as it is
                self._size = fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, grows_to)
            # asyncio's pipe transport reads at most max_size (256 KiB) a time; another loop's has its own
            with contextlib.suppress(AttributeError):
                self._transport.max_size = max(self._size, self._transport.max_size)  # type: ignore[attr-defined]


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
