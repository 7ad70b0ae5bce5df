"""The agent's command in its sandbox session, shaped like :class:`asyncio.subprocess.Process`.

An ACP agent talks JSON-RPC over its stdin and stdout. jupyter-ai's ACP client connects to a local
subprocess with ``acp.connect_to_agent(client, proc.stdin, proc.stdout)``, which wants an
:class:`asyncio.StreamWriter` and an :class:`asyncio.StreamReader`. :class:`AgentProcess` gives both over
an :class:`~jupyter_tai_sandbox.contract.ExecHandle` (the session's interactive command), so the agent
runs in the session and nothing of it runs on the server:

- ``stdout``: a StreamReader fed from the handle's stdout chunks, with the reader's own flow control:
  above twice its limit the feeding pauses (the handle is not read; the provider holds the rest, bounded
  by its own spool), and it resumes when the consumer has read the buffer down to the limit. Memory here
  stays at most ``2 * stdout_limit`` plus one piece (64 KiB at most) however much the agent writes;
  after a kill, what nobody read past that is dropped (counted in ``dropped_stdout``).
- ``stdin``: a StreamWriter whose ``write`` queues the bytes and whose ``drain()`` waits until one pump
  task has handed every queued byte, in order, to ``handle.write``. A write to a command that has exited
  raises :class:`BrokenPipeError` (a failed write: :class:`ConnectionResetError`), as a pipe would.
- stderr: never in the ACP stream; its lines go to the logger (bounded: long lines cut, and past a total
  the rest is only counted) and the last few KiB are kept for error messages (:meth:`stderr_tail`).
- :meth:`detach` stops reading and writing without ending the command: a session that holds its commands
  (a session agent) keeps it running, and a later server attaches to it again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any

from ..contract import ExecHandle, ExitItem, OutputChunk, SandboxError

_LOG = logging.getLogger(__name__)

#: the most stdin bytes handed to ``handle.write`` at once (queued writes are joined up to this)
_WRITE_CHUNK = 1 << 18
#: stdout is fed to the reader in pieces at most this large (and at most its limit)
_FEED_PIECE = 1 << 16
#: the most bytes of one stderr line logged (the rest of the line is cut)
STDERR_LINE_BYTES = 2000
#: the most stderr bytes logged over the command's life; past it lines are only counted
STDERR_LOG_BYTES = 1 << 20
#: how much of the end of stderr :meth:`AgentProcess.stderr_tail` keeps
STDERR_TAIL_BYTES = 8 << 10


class _StdoutFlow(asyncio.ReadTransport):
    """What the StreamReader calls for flow control (its ``transport``): pause and resume the feeding."""

    def __init__(self) -> None:
        super().__init__()
        self.running = asyncio.Event()
        self.running.set()

    def is_reading(self) -> bool:
        return self.running.is_set()

    def pause_reading(self) -> None:
        self.running.clear()

    def resume_reading(self) -> None:
        self.running.set()


class _StdinTransport(asyncio.WriteTransport):
    """The writer's transport: bytes go to the process's queue, the pump writes them."""

    def __init__(self, proc: AgentProcess) -> None:
        super().__init__()
        self._proc = proc

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._proc._queue_stdin(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._proc._request_eof()

    def is_closing(self) -> bool:
        return self._proc._stdin_closing or self._proc._stdin_error is not None

    def close(self) -> None:
        self._proc._request_eof()

    def abort(self) -> None:
        self._proc._abort_stdin()

    def get_write_buffer_size(self) -> int:
        return self._proc._pending_bytes

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _StdinProtocol(asyncio.BaseProtocol):
    """What StreamWriter.drain and wait_closed call."""

    def __init__(self, proc: AgentProcess) -> None:
        self._proc = proc

    async def _drain_helper(self) -> None:
        await self._proc._drained()

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._proc._stdin_closed


class AgentProcess:
    """The agent's command in its sandbox session, shaped like asyncio.subprocess.Process for the ACP
    connection: ``stdin`` (a StreamWriter), ``stdout`` (a StreamReader), ``returncode``, ``wait()``,
    ``kill()`` (async: it ends the command in the session), and :meth:`detach` (stop reading; the
    command keeps running in its session). ``pid`` is None: there is no process of the server's.

    ``returncode`` is set when the command's exit arrives (its status as the provider reports it: 128+N
    for a signal), or -1 when its output ended with an error (``exit_reason`` says which). Must be made
    inside a running event loop.
    """

    pid: int | None = None
    stderr: None = None

    def __init__(
        self, handle: ExecHandle, *, log: logging.Logger | None = None, stdout_limit: int = 50 << 20
    ) -> None:
        if stdout_limit < 1:
            raise ValueError("stdout_limit must be at least 1 byte")
        loop = asyncio.get_running_loop()
        self._handle = handle
        self._log = log or _LOG
        self.returncode: int | None = None
        self.exit_reason: str | None = None
        self._exited = asyncio.Event()
        self._detached = False
        self._killed = False
        #: stdout bytes dropped after a kill because nobody read them (never before a kill)
        self.dropped_stdout = 0

        # stdout, with the StreamReader's own pause/resume as the back-pressure
        self._flow = _StdoutFlow()
        self.stdout = asyncio.StreamReader(limit=stdout_limit, loop=loop)
        self.stdout.set_transport(self._flow)
        self._stdout_limit = stdout_limit

        # stderr: logged (bounded), its tail kept
        self._stderr_line = bytearray()
        self._stderr_tail = bytearray()
        self._stderr_logged = 0
        self._stderr_unlogged = 0

        # stdin: a queue, one pump
        self._pending: collections.deque[bytes] = collections.deque()
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._stdin_error: OSError | None = None
        self._stdin_closing = False
        self._stdin_closed: asyncio.Future[None] = loop.create_future()
        self.stdin = asyncio.StreamWriter(_StdinTransport(self), _StdinProtocol(self), None, loop)
        self._pump = loop.create_task(self._pump_stdin(), name="AgentProcess.stdin")
        self._reader = loop.create_task(self._read_output(), name="AgentProcess.output")

    # --------------------------------------------------------------- output

    async def _read_output(self) -> None:
        code: int | None = None
        reason: str | None = None
        try:
            async for item in self._handle.output:
                if isinstance(item, ExitItem):
                    code, reason = item.exit_code, item.reason
                elif isinstance(item, OutputChunk):
                    if item.stream == "stdout":
                        await self._feed_stdout(item.data)
                    else:
                        self._take_stderr(item.data)
        except asyncio.CancelledError:
            if self._detached:
                return
            raise
        except SandboxError as e:
            code, reason = -1, f"the agent's output ended with an error: {e}"
        except Exception as e:  # a provider's bug must not leave the ACP connection waiting forever
            self._log.exception("reading the agent's output failed")
            code, reason = -1, f"reading the agent's output failed: {e!r}"
        finally:
            if not self._detached:
                self._finish(-1 if code is None else code, reason)

    def _finish(self, code: int, reason: str | None) -> None:
        self._flush_stderr_line()
        self.returncode = code
        self.exit_reason = reason
        self.stdout.feed_eof()
        self._exited.set()
        self._fail_stdin(BrokenPipeError("the agent's command has exited; its stdin takes no more input"))

    async def _feed_stdout(self, data: bytes) -> None:
        # in pieces: the reader pauses above twice its limit, and the feeding waits until it is read down
        # (a kill resumes it), so the buffer never holds more than 2 * limit + one piece
        piece = min(self._stdout_limit, _FEED_PIECE)
        view = memoryview(data)
        for start in range(0, len(view), piece):
            while not self._flow.running.is_set() and not self._killed:
                await self._flow.running.wait()
            if self._killed and len(self.stdout._buffer) > 2 * self._stdout_limit:  # type: ignore[attr-defined]
                self.dropped_stdout += len(view) - start
                return
            self.stdout.feed_data(bytes(view[start : start + piece]))

    def _take_stderr(self, data: bytes) -> None:
        self._stderr_tail += data
        if len(self._stderr_tail) > STDERR_TAIL_BYTES:
            del self._stderr_tail[: len(self._stderr_tail) - STDERR_TAIL_BYTES]
        *lines, rest = data.split(b"\n")
        for line in lines:
            self._stderr_line += line[: max(0, STDERR_LINE_BYTES + 1 - len(self._stderr_line))]
            self._flush_stderr_line()
        self._stderr_line += rest[: max(0, STDERR_LINE_BYTES + 1 - len(self._stderr_line))]

    def _flush_stderr_line(self) -> None:
        line = bytes(self._stderr_line)
        self._stderr_line.clear()
        if not line:
            return
        if self._stderr_logged >= STDERR_LOG_BYTES:
            self._stderr_unlogged += len(line)
            return
        self._stderr_logged += len(line)
        text = line[:STDERR_LINE_BYTES].decode("utf-8", "replace")
        cut = " [line cut]" if len(line) > STDERR_LINE_BYTES else ""
        self._log.info("agent stderr: %s%s", text, cut)
        if self._stderr_logged >= STDERR_LOG_BYTES:
            self._log.info(
                "agent stderr: %d bytes logged; further stderr is only kept as a tail", self._stderr_logged
            )

    def stderr_tail(self) -> str:
        """The last few KiB of the agent's stderr, for error messages."""
        return bytes(self._stderr_tail).decode("utf-8", "replace")

    # ---------------------------------------------------------------- stdin

    def _queue_stdin(self, data: bytes) -> None:
        if self._stdin_error is not None:
            raise self._stdin_error
        if self._stdin_closing:
            raise BrokenPipeError("the agent's stdin is closed")
        if not data:
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._flushed.clear()
        self._wake.set()

    def _request_eof(self) -> None:
        if not self._stdin_closing:
            self._stdin_closing = True
            self._wake.set()

    def _abort_stdin(self) -> None:
        self._stdin_closing = True
        self._fail_stdin(BrokenPipeError("the agent's stdin was aborted"))
        self._pump.cancel()

    def _fail_stdin(self, error: OSError) -> None:
        if self._stdin_error is None:
            self._stdin_error = error
        self._pending.clear()
        self._pending_bytes = 0
        self._flushed.set()
        self._wake.set()
        if not self._stdin_closed.done():
            self._stdin_closed.set_result(None)

    async def _drained(self) -> None:
        """What ``stdin.drain()`` awaits: every queued byte written (or the error that stopped it)."""
        await self._flushed.wait()
        if self._stdin_error is not None:
            raise self._stdin_error

    async def _pump_stdin(self) -> None:
        try:
            while True:
                while not self._pending:
                    if self._stdin_error is not None:
                        return
                    if self._stdin_closing:
                        await self._handle.close_stdin()
                        if not self._stdin_closed.done():
                            self._stdin_closed.set_result(None)
                        return
                    self._flushed.set()
                    self._wake.clear()
                    await self._wake.wait()
                chunk = self._pending.popleft()
                while self._pending and len(chunk) + len(self._pending[0]) <= _WRITE_CHUNK:
                    chunk += self._pending.popleft()
                try:
                    await self._handle.write(chunk)
                except SandboxError as e:  # exited, or its stdin closed: a broken pipe
                    raise BrokenPipeError(f"writing to the agent's stdin failed: {e}") from None
                self._pending_bytes -= len(chunk)
                if not self._pending:
                    self._flushed.set()
        except asyncio.CancelledError:
            self._fail_stdin(BrokenPipeError("the agent's stdin is no longer written (detached or killed)"))
            raise
        except OSError as e:
            self._fail_stdin(e)
        except Exception as e:
            self._fail_stdin(ConnectionResetError(f"writing to the agent's stdin failed: {e!r}"))

    # ------------------------------------------------------------ lifecycle

    async def wait(self) -> int:
        """The command's status once it has ended (see ``returncode``)."""
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    async def kill(self) -> None:
        """End the command in the session (its process group); output not read by then is dropped."""
        self._killed = True
        self._flow.resume_reading()
        try:
            await self._handle.kill()
        except SandboxError as e:
            self._log.warning("stopping the agent's command failed: %s", e)
            raise

    async def detach(self) -> None:
        """Stop reading and writing without ending the command: in a session that holds its commands it
        runs on, and a later server attaches to it (``held_commands``). ``stdout`` ends, ``returncode``
        stays None, stdin raises BrokenPipeError from now on. Idempotent."""
        if self._detached or self._exited.is_set():
            return
        self._detached = True
        self._pump.cancel()
        self._reader.cancel()
        for task in (self._pump, self._reader):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_stdin(BrokenPipeError("the agent's command was detached: its stdin is no longer written"))
        self.stdout.feed_eof()

    @property
    def detached(self) -> bool:
        return self._detached
