"""LocalPtyCommand: an interactive sandbox-local command on a pseudo-terminal."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import subprocess

from ...contract import DEFAULT_WINDOW, SandboxSpecRejectedError
from .._common import OUTPUT_GRACE_SECONDS
from .command import LocalCommand, _PipeRelay
from .posix import ChildWatch, kill_session_but_leader, set_window, spawn_kwargs

# The pty holder leads a new session and takes the terminal as its controlling tty (its stdin
# and stdout arrive as the control and status pipes, moved to fds 3 and 4: dash takes only
# one-digit fds). It runs the command in its own group, so ^C reaches it, reports the
# command's status on fd 4, lets go of the terminal and waits until fd 3 is closed. Its own
# stderr is /dev/null while it waits, so a stop does not add the shell's "Killed" to the
# terminal's output; the command (a subshell that execs it) gets the terminal as stderr.
_PTY_HOLDER = """exec 3<&0 4>&1 0<>"$1" 1>&0 2>/dev/null
shift
trap : INT QUIT TSTP HUP
(exec "$@" 2>&1 3<&- 4>&-)
status=$?
exec 0<&- 1>&- 2>&-
echo "$status" >&4
exec 4>&-
read _ <&3
"""


class LocalPtyCommand(LocalCommand):
    """An interactive command on a pseudo-terminal: one output stream, resize, ^C as a signal.

    The holder is the command's parent here (a command can only share the terminal's
    session as its descendant), so the status comes from the holder over a pipe: the
    status its shell read from the command's own wait status (137 for one stopped by
    SIGKILL). When none arrives, the output ends with SandboxError. A stop kills every
    process of the terminal's session, since an interactive shell moves jobs to groups
    of their own, and the command itself even if it left that session; never the holder,
    which reports the status. ``close_stdin`` sends the terminal's end-of-file (^D).
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
        self._pty_status = bytearray()
        self._holder_exited = asyncio.Event()
        self._pipes = []
        master, slave = pty.openpty()
        status_r, status_w = os.pipe()
        control_r, self._control = os.pipe()
        try:
            set_window(master, *window)
            process = subprocess.Popen(
                ["sh", "-c", _PTY_HOLDER, "sh", os.ttyname(slave), *argv],
                stdin=control_r,
                stdout=status_w,
                stderr=slave,
                start_new_session=True,
                cwd=cwd,
                env={"TERM": "xterm-256color", **env},
                **spawn_kwargs(),
            )
        except BaseException:
            for fd in (master, status_r, self._control):
                os.close(fd)
            raise
        finally:
            for fd in (slave, status_w, control_r):
                os.close(fd)
        self._holder = process
        self._holder_watch = ChildWatch(process.pid, self._holder_reaped)
        self._pgid = process.pid
        self._group_held = True
        self._deadline = loop.time() + self._timeout_seconds
        self._master = master
        files = [
            os.fdopen(status_r, "rb", buffering=0),
            os.fdopen(master, "rb", buffering=0),
            os.fdopen(os.dup(master), "wb", buffering=0),
        ]
        try:
            self._status_pipe, _ = await loop.connect_read_pipe(lambda: _PtyStatus(self), files[0])
            self._pipes.append(self._status_pipe)
            self._output_pipe, _ = await loop.connect_read_pipe(lambda: _PipeRelay(self, 1), files[1])
            self._pipes.append(self._output_pipe)
            self._stdin, _ = await loop.connect_write_pipe(lambda: _PipeRelay(self, 0), files[2])
            self._pipes.append(self._stdin)
            self._supervisor = asyncio.create_task(self._supervise())
        except BaseException:  # a cancelled start stops what it started
            self._release_group(stop_group=True)
            for pipe in self._pipes:
                pipe.close()
            for file in files:
                file.close()
            raise

    def _holder_reaped(self, returncode: int | None) -> None:
        self._holder.returncode = returncode if returncode is not None else -1  # Popen must not wait again
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
        return int(reported) if reported.isdigit() else None

    def _release_group(self, *, stop_group: bool) -> None:
        if not self._group_held:
            return
        self._group_held = False
        if stop_group and not self._holder_watch.reaped:
            # the holder is an unreaped child: its pid, the session id, is still this command's
            kill_session_but_leader(self._pgid)
        os.close(self._control)  # the holder reports the command's status, then ends

    async def _stop_group(self) -> bool:
        # the holder reports the command's status once the session went and its control pipe closed; it
        # shares the terminal, so its open slave is no sign of a process left behind: a fixed wait
        self._release_group(stop_group=True)
        await self._exited
        await asyncio.wait({self._output_ended}, timeout=OUTPUT_GRACE_SECONDS)
        return not self._output_ended.done()

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
            set_window(self._master, rows, cols)


class _PtyStatus(asyncio.Protocol):
    def __init__(self, command: LocalPtyCommand) -> None:
        self._command = command

    def data_received(self, data: bytes) -> None:
        self._command._pty_status.extend(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._command._status_reported()
