"""A command of another server's sandbox, run over its exec websocket, as a contract ExecHandle.

One task (the pump) reads the websocket as it comes, whether or not the consumer
reads, into an :class:`~jupyter_tai_sandbox.spool.OutputSpool` (bounded memory,
then a temporary file), so a finished command's output is all there however late
or slowly it is read, and the remote server never waits for this side's reader.

What the remote reports is kept as it said it: its exit item, its typed error
(a deadline's SandboxExecTimeoutError with the byte counts and the held-output
note), or SandboxError when the connection ended without either. Never an
invented status. kill() goes beside the websocket (``DELETE .../execs/{id}``),
so it never waits behind stdin the remote has not taken in, and returns once
the remote's last message has arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ...client import STDIN_FRAME_BYTES, RemoteExec, SandboxClient
from ...contract import (
    ExecHandle,
    ExitItem,
    OutputChunk,
    OutputItem,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxUnavailableError,
)
from ...spool import OutputSpool
from .._common import KILLED_EXIT_CODE, spill_overflow_error

#: how long kill() waits for the remote's last message once the remote has stopped the command
KILL_WAIT_SECONDS = 15.0


class RemoteCommand(ExecHandle):
    """One command of a remote session: its websocket, its output taken in as it comes, its stdin."""

    def __init__(
        self, client: SandboxClient, session_id: str, remote: RemoteExec, *, pty: bool, memory_limit: int
    ) -> None:
        self._client = client
        self._session_id = session_id
        self._remote = remote
        self._pty = pty
        self._spool = OutputSpool(memory_limit)
        self._spool.on_overflow = self._overflowed
        self._counts = {"stdout": 0, "stderr": 0}
        self._final: ExitItem | SandboxError | None = None
        self._lost = False  # the connection ended without the remote's last message
        self._overflow = False
        self._killed = False  # kill() has returned
        self._stdin_closed = False
        self._ended = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None
        self._pump = asyncio.create_task(self._take_in())
        self._output = self._iterate()

    @property
    def exec_id(self) -> str | None:
        return self._remote.exec_id

    @property
    def output(self) -> AsyncIterator[OutputItem]:
        return self._output

    # ------------------------------------------------------------- intake

    async def _take_in(self) -> None:
        final: ExitItem | SandboxError
        try:
            async for item in self._remote.output:
                if isinstance(item, OutputChunk):
                    self._counts[item.stream] += len(item.data)
                    self._spool.put(item.stream, item.data)
                else:
                    final = item
                    break
            else:  # pragma: no cover - RemoteExec ends with an exit item or raises
                final = SandboxError("the remote command's output ended without an exit status")
        except SandboxUnavailableError as e:  # the websocket closed without the remote's last message
            final = e
            self._lost = True
        except SandboxError as e:
            final = e
        except asyncio.CancelledError:
            final = SandboxError("the remote command's output was stopped before its end")
        except Exception as e:  # the connection broke (tornado's stream errors, OSError)
            final = SandboxError(f"the connection to the remote command broke before its end: {e}")
            self._lost = True
        if self._overflow:
            final = spill_overflow_error(self._counts)
        self._final = final
        self._spool.close()
        self._ended.set()

    def _overflowed(self) -> None:
        """More unread output than the spool keeps: stop the command (its output ends with why)."""
        self._overflow = True
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_remote())

    async def _stop_remote(self) -> None:
        with contextlib.suppress(SandboxError):
            await self._kill_remote()

    # ------------------------------------------------------------- output

    async def _iterate(self) -> AsyncIterator[OutputItem]:
        try:
            while True:
                item = await self._spool.get()
                final = self._final
                if isinstance(final, SandboxExecTimeoutError) and not self._killed:
                    # the deadline killed it: output nobody read is not yielded once the timeout is known
                    self._spool.discard()
                    raise final
                if item is not None:
                    yield OutputChunk(*item)
                    continue
                await self._ended.wait()
                final = self._final
                if isinstance(final, ExitItem):
                    yield final
                    return
                assert final is not None
                raise final
        finally:
            self._spool.discard()

    # ------------------------------------------------------------- stdin

    def _check_writable(self) -> None:
        if self._killed or self._final is not None:
            raise SandboxError("the command has ended: its stdin takes no more input")
        if self._stdin_closed:
            raise SandboxError("the command's stdin is closed: it takes no more input")

    async def write(self, data: bytes) -> None:
        self._check_writable()
        view = memoryview(bytes(data))
        for start in range(0, len(view), STDIN_FRAME_BYTES):
            self._check_writable()
            await self._remote.write(bytes(view[start : start + STDIN_FRAME_BYTES]))

    async def close_stdin(self) -> None:
        if self._stdin_closed or self._final is not None or self._killed:
            return
        self._stdin_closed = True
        await self._remote.close_stdin()

    async def resize(self, rows: int, cols: int) -> None:
        if not self._pty:
            await super().resize(rows, cols)
        await self._remote.resize(rows, cols)

    # ------------------------------------------------------------- stop

    async def _kill_remote(self) -> None:
        if self._remote.exec_id is not None:
            await self._client.kill_exec(self._session_id, self._remote.exec_id)

    async def kill(self) -> None:
        """Stop the remote command and wait for its last message; idempotent, never raises after the exit."""
        if self._final is None or self._lost:
            try:
                await self._kill_remote()
            except SandboxError:
                if self._final is None:
                    raise
            if self._final is None:
                try:
                    await asyncio.wait_for(asyncio.shield(self._ended.wait()), KILL_WAIT_SECONDS)
                except TimeoutError:
                    raise SandboxError(
                        f"the remote server stopped the command but sent no exit within {KILL_WAIT_SECONDS:g} s"
                    ) from None
        self._killed = True
        if isinstance(self._final, SandboxExecTimeoutError):
            # the deadline had stopped it before anyone read the timeout: the kill's status, as a
            # provider reports a kill past the deadline (128 + SIGKILL)
            self._final = ExitItem(KILLED_EXIT_CODE)
        self._remote.disconnect()
