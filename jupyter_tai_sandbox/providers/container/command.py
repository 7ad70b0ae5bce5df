"""One command of a container session, run by the session agent, as the contract's :class:`ExecHandle`.

The agent starts the command in its own process group and holds that group while the command
runs or a process it started holds its output (its zombie keeps the group id, so a stop never
signals a group since given to others). Here the command's output is taken in as it comes,
whether or not anyone reads, into an :class:`OutputSpool` (memory bounded, spilling to disk),
so a finished command's output is all there however late it is read. Every stop (kill, deadline,
a failed or cancelled one-shot, a cancelled start, an output overflow) is the agent's KILL: the
command's own process and its group, within one fixed limit of :data:`KILL_LIMIT_SECONDS`. The
exit status is the kernel's, as the agent read it; one that cannot be read is a SandboxError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ...agent import AgentCommand, AgentError
from ...contract import (
    MAX_WINDOW_SIDE,
    ExecHandle,
    ExitItem,
    OutputChunk,
    OutputItem,
    OutputTooLargeError,
    SandboxConflictError,
    SandboxError,
    SandboxSpecRejectedError,
    out_of_memory,
)
from ...spool import OutputSpool
from .._common import deadline_error

#: A kill's fixed limit: a stop that has not finished by then raises SandboxError.
KILL_LIMIT_SECONDS = 5.0
#: what a stop keeps of its limit to finish after the output's ends were waited for
_STOP_MARGIN_SECONDS = 0.2
#: stdin is handed to the agent in pieces this large (its credit bounds what it queues)
_WRITE_CHUNK = 1 << 18
#: background work of commands whose handle nobody holds any more (kept referenced until it ends)
_BACKGROUND: set[asyncio.Future[Any]] = set()


def check_window(rows: int, cols: int) -> None:
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_WINDOW_SIDE for n in (rows, cols)
    ):
        raise SandboxSpecRejectedError(f"invalid terminal size {rows}x{cols}")


def in_background(coro: Awaitable[Any]) -> None:
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


class ContainerCommand(ExecHandle):
    """An agent command as the contract's handle: its output spool, deadline, stdin and stop."""

    def __init__(
        self,
        command: AgentCommand,
        *,
        timeout_seconds: float,
        deadline_in: float | None = None,
        pty: bool,
        memory_limit: int,
        session_memory_mb: int | float | None = None,
        log: logging.Logger | logging.LoggerAdapter,
        on_done: Callable[[ContainerCommand], None] = lambda _: None,
    ) -> None:
        self._cmd = command
        self._pty = pty
        self._log = log
        self._on_done = on_done
        self._timeout_seconds = timeout_seconds
        self._spool = OutputSpool(memory_limit)
        self._spill_limit = self._spool.disk_limit
        self._spool.on_overflow = self._on_overflow
        self._overflow_task: asyncio.Task[None] | None = None
        self._overflow_note = ""
        self._counts = {"stdout": 0, "stderr": 0}
        self._stdin_closed = False
        self._status: int | None = None
        #: why it ended, when the status alone does not say (the OOM killer: the session's limit named)
        self._reason: str | None = None
        self._session_memory_mb = session_memory_mb
        self._failure: SandboxError | None = None
        self._timed_out = False
        self._timeout_error: SandboxError | None = None
        self._killed = False
        self._stopping = False
        #: when a stop's fixed limit runs out (loop time)
        self._stop_end: float | None = None
        self._held = False
        self._done = asyncio.Event()
        self._stop_lock = asyncio.Lock()
        self._feeder: asyncio.Task[None] | None = None
        self._intake = asyncio.create_task(self._take_in())
        self._deadline_task: asyncio.Task[None] | None = None
        #: another connection (a second server) attached the command: it runs on there, never stopped from here
        self._taken_over = False
        #: this handle let the command go (detach): it runs on in its session
        self._detached = False
        self._deadline = asyncio.get_running_loop().call_later(
            timeout_seconds if deadline_in is None else deadline_in, self._on_deadline
        )
        self._output = self._iterate()

    @property
    def pid(self) -> int | None:
        return self._cmd.pid

    # --------------------------------------------------------------- intake

    async def _take_in(self) -> None:
        try:
            while (item := await self._cmd.read()) is not None:
                stream, data = item
                self._counts[stream] += len(data)
                self._spool.put(stream, data)
            if self._stopping:
                await self._cut_output()
            status = await self._cmd.wait()
            self._status = status.returncode
            if status.oom_killed:
                self._reason = out_of_memory(self._session_memory_mb)
        except AgentError as e:
            if e.code == "EBUSY":  # DETACHED: another connection took the command
                self._taken_over = True
                self._failure = SandboxConflictError(
                    "another server attached to this command: it runs on there (attach to it there)"
                )
            else:
                self._failure = SandboxError(f"the command's exit status could not be read: {e}")
        except asyncio.CancelledError:
            self._failure = SandboxError(
                "this handle let the command go: it runs on in its session (attach to it again)"
                if self._detached
                else "the command's exit status could not be read: its session was destroyed"
            )
        finally:
            self._deadline.cancel()
            if self._feeder is not None:
                self._feeder.cancel()
            self._spool.close()
            self._done.set()
            if self._status is not None and not self._stopping:
                in_background(self._release())  # a stop releases it once its kill is answered
            self._on_done(self)

    async def _cut_output(self) -> None:
        """After a kill the agent ends each stream, ``cut`` when a process that left the group still held it,
        at once or a moment (cutAfterKill) after its answer. Its word decides the note: take the output in
        until every stream's end came, within the stop's limit (a guest whose vCPU was paused sends it late;
        a stream whose end never came counts as held)."""
        loop = asyncio.get_running_loop()
        assert self._stop_end is not None
        limit = self._stop_end - _STOP_MARGIN_SECONDS
        while True:
            while (item := await self._cmd.read()) is not None:  # never waits: the output has ended
                stream, data = item
                self._counts[stream] += len(data)
                self._spool.put(stream, data)
            if all(self._cmd.eof.values()) or (left := limit - loop.time()) <= 0:
                break
            await self._cmd.next_frame(left)  # no frame can have come since the last read: it never waited
        self._held = self._cmd.cut or not all(self._cmd.eof.values())

    async def _release(self) -> None:
        """Let the agent forget the finished command (it holds at most 64). Never while a kill of it is
        unanswered: the agent's KILLED may follow the EXIT, and a released command's frames are dropped."""
        with contextlib.suppress(AgentError):
            await self._cmd.release()

    # ---------------------------------------------------------------- stops

    async def _stop(self) -> None:
        """Kill the command and its group (fixed limit), then end the output; SandboxError when it fails."""
        async with self._stop_lock:
            if self._done.is_set():
                return
            loop = asyncio.get_running_loop()
            end = loop.time() + KILL_LIMIT_SECONDS
            self._stopping, self._stop_end = True, end
            try:
                await asyncio.wait_for(asyncio.shield(self._cmd.kill()), KILL_LIMIT_SECONDS)
            except TimeoutError:
                raise SandboxError(
                    f"the stop did not finish within {KILL_LIMIT_SECONDS:g} s; it had reported nothing "
                    "(the session agent did not answer the kill)"
                ) from None
            except AgentError as e:
                if not self._done.is_set() and e.code not in ("ESRCH",):
                    raise SandboxError(f"the stop failed: {e}") from None
            await asyncio.wait({self._intake}, timeout=max(0.0, end - loop.time()))
            if self._status is not None:
                # only now: the agent answers a kill after the exit, and forgets a released command
                in_background(self._release())
            if not self._intake.done():
                raise SandboxError(
                    f"the stop did not finish within {KILL_LIMIT_SECONDS:g} s; the agent had reported the kill, "
                    "not the command's exit"
                )

    def _on_overflow(self) -> None:
        if self._overflow_task is None:
            self._overflow_task = asyncio.create_task(self._overflow_stop())

    async def _overflow_stop(self) -> None:
        try:
            await self._stop()
        except SandboxError as e:
            self._overflow_note = f"; the stop failed: {e}"
            self._intake.cancel()

    def _overflow_error(self) -> SandboxError:
        return OutputTooLargeError(
            f"the command's unread output passed {self._spill_limit} bytes kept on the server's disk "
            f"(SandboxApp.max_spill_bytes), so it was stopped{self._overflow_note}; the output up to "
            "there was given. Read a command's output as it comes, or write large output to a workspace "
            "file and download it",
            stdout_bytes=self._counts["stdout"],
            stderr_bytes=self._counts["stderr"],
            exit_code=self._status,
        )

    def _on_deadline(self) -> None:
        if not self._done.is_set():
            self._timed_out = True
            self._deadline_task = asyncio.create_task(self._deadline_stop())

    async def _deadline_stop(self) -> None:
        try:
            await self._stop()
        except SandboxError as e:
            self._timeout_error = SandboxError(
                f"the command reached its {self._timeout_seconds:g} s deadline and could not be stopped: {e}"
            )
            self._intake.cancel()
        else:
            self._timeout_error = deadline_error(self._timeout_seconds, self._counts, self._held)
        await self._done.wait()

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
            if self._spool.overflowed:
                raise self._overflow_error()
            if self._failure is not None:
                raise self._failure
            if self._status is None:  # pragma: no cover - _take_in sets one of the two
                raise SandboxError("the command's exit status could not be read")
            yield ExitItem(self._status, self._reason)
        finally:
            self._spool.discard()

    def feed(self, data: bytes) -> None:
        """Stream a one-shot's stdin in the background while its output is read, then close it."""
        self._feeder = asyncio.create_task(self._feed(data))

    async def _feed(self, data: bytes) -> None:
        """A command that exits, or closes its stdin, before reading it all drops the rest."""
        view = memoryview(data)
        with contextlib.suppress(AgentError):
            for i in range(0, len(view), _WRITE_CHUNK):
                await self._cmd.write(bytes(view[i : i + _WRITE_CHUNK]))
            await self.close_stdin()

    async def write(self, data: bytes) -> None:
        if self._stdin_closed:
            raise SandboxError("the command's stdin is closed")
        if self._done.is_set():
            raise SandboxError("the command has exited; its stdin takes no more input")
        try:
            await self._cmd.write(bytes(data))
        except AgentError as e:
            raise SandboxError(f"writing to the command's stdin failed: {e}") from None

    async def close_stdin(self) -> None:
        if self._stdin_closed:
            return
        self._stdin_closed = True
        with contextlib.suppress(AgentError):
            await self._cmd.close_stdin()

    async def kill(self) -> None:
        if not self._done.is_set():
            await self._stop()
        self._killed = True

    async def resize(self, rows: int, cols: int) -> None:
        if not self._pty:
            await super().resize(rows, cols)
        check_window(rows, cols)
        if self._done.is_set():
            return
        try:
            await self._cmd.resize(rows, cols)
        except AgentError as e:
            if not self._done.is_set() and e.code != "ESRCH":
                raise SandboxError(f"resizing the command's terminal failed: {e}") from None

    def abandon(self) -> None:
        """The session is gone: stop taking output in (the output then ends with a SandboxError)."""
        self._intake.cancel()

    async def detach(self) -> None:
        """Stop taking output in and leave the command to the session's agent, which holds it (and its
        output) for a later attach; a stop of this server then finds the handle done and kills nothing."""
        if not self._done.is_set():
            self._detached = True
            self._intake.cancel()
            await self._done.wait()
