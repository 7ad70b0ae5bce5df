"""One command in a session container: its exec, its output, its deadline and its stop.

A command runs under the wrapper of ``_docker_scripts`` (``RUN``/``HOLD``, or
``RUN_PTY`` on a terminal). Its attached stream is read continuously into an
:class:`OutputSpool` whether or not anyone reads; every stop (kill, deadline,
a failed or cancelled one-shot, a cancelled start, the provider's close) goes
through :func:`stop_command`, a separate exec of ``KILL``/``KILL_PTY`` that
stops the command's group (its terminal session) *and* the command's own
process should it have left the group (``setsid``), all within one fixed
limit of :data:`KILL_LIMIT_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from ..contract import (
    MAX_WINDOW_SIDE,
    ExecHandle,
    ExitItem,
    OutputChunk,
    OutputItem,
    OutputTooLargeError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
)
from ..spool import OutputSpool
from . import _docker_scripts as scripts
from ._common import OUTPUT_GRACE_SECONDS, deadline_error
from ._docker_stream import EngineRefusal, read_output
from .docker_engine import DockerEngine, EngineRefusedError

#: A kill's fixed limit: a stop that has not finished by then raises SandboxError.
KILL_LIMIT_SECONDS = 5.0
#: the pause before a refused stop is tried again (within KILL_LIMIT_SECONDS)
STOP_RETRY_SECONDS = 0.1
_WRITE_CHUNK = 1 << 18
#: background stops retried after a failed one (kept referenced until they end)
_RETRIES: set[asyncio.Task[None]] = set()
#: stdin bytes the transport buffers before a write waits (asyncio's default is 64 KiB)
_WRITE_BUFFER = 1 << 20


def check_window(rows: int, cols: int) -> None:
    if not all(
        isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_WINDOW_SIDE for n in (rows, cols)
    ):
        raise SandboxSpecRejectedError(f"invalid terminal size {rows}x{cols}")


async def stop_command(
    engine: DockerEngine, container_id: str, exec_id: str, token: str, *, pty: bool, gone: Callable[[], bool]
) -> None:
    """SIGKILL the command's group (its session, on a terminal) and its own process, through a separate exec.

    One limit of :data:`KILL_LIMIT_SECONDS` covers the whole stop: the look at the
    wrapper, the stop's exec and its script. Past it, SandboxError says what the
    stop had reported by then. A wrapper (or a container) already gone is nothing to stop.
    """
    said: list[bytes] = []
    stage = ["the engine had not answered the look at the command"]

    async def stop_once() -> tuple[int, bytes, bytes] | None:
        info = await engine.exec_inspect(exec_id)
        if not info.get("Running"):
            return None  # the wrapper has ended: there is nothing left to stop
        stage[0] = "the engine had not started the stop"
        return await engine.run(container_id, ["sh", "-c", scripts.KILL_PTY if pty else scripts.KILL, "sh", token], said=said)

    async def stop() -> tuple[int, bytes, bytes] | None:
        # The stop is a process in the container: a session at its pids limit (a fork bomb) refuses it
        # (the engine's 5xx, or the script's fork failing) until one of its processes ends. Kill is
        # idempotent, so it is tried again until it lands or the limit is spent; the last failure stands.
        while True:
            try:
                result = await stop_once()
            except (EngineRefusal, EngineRefusedError) as e:
                if e.status is not None and e.status < 500:
                    raise
                if asyncio.get_running_loop().time() + STOP_RETRY_SECONDS > give_up:
                    raise
            else:
                if result is None or result[0] == 0 or asyncio.get_running_loop().time() + STOP_RETRY_SECONDS > give_up:
                    return result
            await asyncio.sleep(STOP_RETRY_SECONDS)

    give_up = asyncio.get_running_loop().time() + KILL_LIMIT_SECONDS - 0.5
    try:
        result = await asyncio.wait_for(stop(), KILL_LIMIT_SECONDS)
    except asyncio.TimeoutError:
        reported = b"".join(said).decode("utf-8", "replace").strip()
        raise SandboxError(
            f"the stop did not finish within {KILL_LIMIT_SECONDS:g} s; "
            + (f"it had reported: {reported}" if reported else f"it had reported nothing ({stage[0]})")
        ) from None
    except SandboxNotFoundError:
        return  # the container is gone, and the command with it
    except (EngineRefusal, EngineRefusedError) as e:
        if gone() or e.status in (404, 409):
            return  # the container stopped or is gone, and the command with it
        raise SandboxError(f"the engine refused the stop: {e}") from None
    except SandboxError as e:
        raise SandboxError(f"the stop failed: {e}") from None
    if result is None:
        return
    code, out, err = result
    if code != 0:
        reported = (err or out).decode("utf-8", "replace").strip()
        raise SandboxError(f"the stop failed (status {code}): {reported or 'no error line'}")


class DockerCommand(ExecHandle):
    """One command: its exec, its attached stream, its output spool and its deadline.

    ``gone`` tells whether the session was destroyed; ``on_done`` is called once
    the command's output has ended and its status is read.
    """

    def __init__(
        self,
        engine: DockerEngine,
        container_id: str,
        exec_id: str,
        token: str,
        stream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        *,
        timeout_seconds: float,
        tty: bool,
        stdin: bool,
        memory_limit: int,
        log: logging.Logger | logging.LoggerAdapter,
        gone: Callable[[], bool],
        on_done: Callable[[DockerCommand], None],
    ) -> None:
        self._engine = engine
        self._container = container_id
        self._exec_id = exec_id
        self._token = token
        self._gone = gone
        self._on_done = on_done
        self._log = log
        self._reader, self._writer = stream
        self._writer.transport.set_write_buffer_limits(high=_WRITE_BUFFER)
        self._tty = tty
        self._timeout_seconds = timeout_seconds
        self._spool = OutputSpool(memory_limit)
        self._spill_limit = self._spool.disk_limit
        # past the disk cap on unread output the spool stops taking it in: stop the command then
        self._spool.on_overflow = self._on_overflow
        self._overflow_task: asyncio.Task[None] | None = None
        self._overflow_note = ""
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
            self._log.debug("sandbox-docker: exec stream ended: %r", e)

    async def _supervise(self) -> None:
        try:
            await asyncio.wait({self._reading})
            self._deadline.cancel()
            self._status, self._failure = await self._read_status()
        finally:
            if self._feeder is not None:
                self._feeder.cancel()
            # abort, not close: close() waits to flush stdin nobody will read, and so would a pending write
            self._writer.transport.abort()
            self._spool.close()
            self._done.set()
            self._on_done(self)

    async def _read_status(self) -> tuple[int | None, SandboxError | None]:
        """The exec's exit status once the engine has it (the wrapper exits right after the group).

        Never invented: a status the engine cannot give is a SandboxError.
        """
        try:
            code = await self._engine.exec_exit_code(self._exec_id, within=OUTPUT_GRACE_SECONDS + 1.0)
        except SandboxError as e:
            gone = " (the session was destroyed)" if self._gone() else ""
            return None, SandboxError(f"the command's exit status could not be read{gone}: {e}")
        if code is None:
            return None, SandboxError("the command's exit status could not be read: the engine still reports it running")
        return code, None

    # ---------------------------------------------------------------- stops

    def _on_overflow(self) -> None:
        """The unread output passed the spool's disk cap: stop the command (in a task, never blocking)."""
        if self._overflow_task is None:
            self._overflow_task = asyncio.create_task(self._overflow_stop())

    async def _overflow_stop(self) -> None:
        try:
            await self._stop()
        except SandboxError as e:
            self._overflow_note = f"; the stop failed: {e}"
            self._give_up_output()

    def _give_up_output(self) -> None:
        """A stop failed (the engine did not answer in time): end the output anyway, so nothing waits on
        it, and try the stop once more in the background should the engine come back."""
        if self._reading.done():
            return
        self._reading.cancel()
        retry = asyncio.create_task(self._stop_again())
        _RETRIES.add(retry)
        retry.add_done_callback(_RETRIES.discard)

    async def _stop_again(self) -> None:
        try:
            await stop_command(self._engine, self._container, self._exec_id, self._token, pty=self._tty, gone=self._gone)
        except SandboxError as e:
            self._log.warning("sandbox-docker: a command whose stop failed could not be stopped again: %s", e)

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
            self._give_up_output()
        else:
            self._timeout_error = deadline_error(self._timeout_seconds, self._counts, self._held)
        await self._done.wait()

    async def _stop(self) -> None:
        """Kill the command (fixed limit), then end the output; SandboxError when the stop fails."""
        async with self._stop_lock:
            if self._reading.done():
                return
            await stop_command(self._engine, self._container, self._exec_id, self._token, pty=self._tty, gone=self._gone)
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
            if self._spool.overflowed:
                # a failure of the command itself: it ends the output in place of the exit, kill or not
                raise self._overflow_error()
            if self._failure is not None:
                raise self._failure
            if self._status is None:  # pragma: no cover - _read_status sets one of the two
                raise SandboxError("the command's exit status could not be read")
            yield ExitItem(self._status)
        finally:
            self._spool.discard()

    def feed(self, data: bytes) -> None:
        """Stream a one-shot's stdin in the background while its output is read."""
        self._feeder = asyncio.create_task(self._feed(data))

    async def _feed(self, data: bytes) -> None:
        """A command that exits before reading all of its stdin drops the rest."""
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
        check_window(rows, cols)
        if self._done.is_set():
            return
        try:
            await self._engine.exec_resize(self._exec_id, rows, cols)
        except SandboxError:
            if await self._running():
                raise
            # the command ended meanwhile: there is no terminal left to resize

    async def _running(self) -> bool:
        with contextlib.suppress(SandboxError):
            return bool((await self._engine.exec_inspect(self._exec_id)).get("Running"))
        return False

    def abandon(self) -> None:
        """The session is gone: stop taking output in (its status read then reports why)."""
        self._reading.cancel()
