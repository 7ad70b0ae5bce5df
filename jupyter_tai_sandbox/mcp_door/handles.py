"""Long commands over MCP: a started command is a handle the agent polls.

``session_exec_start`` starts a command in a session and answers a handle id;
``session_exec_poll`` answers the output since an offset (waiting a little for
more), then the exit item. A pump task reads the command's output (scrubbed by
the gated session when the policy says so) into a bounded buffer. A command
never outlives:

* its own deadline (the provider kills it and the poll answers the timeout);
* its handle: a running command nobody polled for ``idle_timeout`` seconds is
  killed, so an agent that disconnects leaves nothing running;
* its session: destroying the session through the door kills its commands
  first (a session destroyed another way ends them with it).

A finished handle is kept ``retention`` seconds for its last polls, then dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..contract import ExecHandle, ExitItem, SandboxError, SandboxNotFoundError
from ..errors import SandboxQuotaError, error_body, error_status
from ..gate import ScrubbedHandle

STREAMS = ("stdout", "stderr")


@dataclass
class _Chunk:
    start: int
    stream: str
    data: bytes


class CommandHandle:
    """One started command: its output buffer, its exit, its expiry."""

    def __init__(
        self,
        handle: ExecHandle,
        *,
        owner: str,
        session_id: str,
        timeout_seconds: float,
        buffer_bytes: int,
        log: Any,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self.id = "cmd-" + secrets.token_hex(8)
        self.owner = owner
        self.session_id = session_id
        self.handle = handle
        self.started_at = time.time()
        self.deadline = self.started_at + timeout_seconds
        self.last_poll = time.monotonic()
        self.pollers = 0
        self.ended_at: float | None = None
        self.exit_code: int | None = None
        self.error: dict[str, Any] | None = None
        self.total = 0  # bytes of (scrubbed) output produced so far, both streams
        self._counted = dict.fromkeys(STREAMS, 0)  # bytes per stream, as the handle gave them
        self._chunks: deque[_Chunk] = deque()
        self._kept = 0
        self._buffer_bytes = buffer_bytes
        self._wake = asyncio.Event()
        self._log = log
        self._on_end = on_end
        self.task = asyncio.create_task(self._pump(), name=f"mcp-command-{self.id}")

    @property
    def running(self) -> bool:
        return self.ended_at is None

    @property
    def byte_counts(self) -> dict[str, int]:
        """Bytes per stream as the command wrote them: a scrubbed handle counts them before its scrub."""
        return self.handle.byte_counts if isinstance(self.handle, ScrubbedHandle) else self._counted

    @property
    def kept_from(self) -> int:
        return self._chunks[0].start if self._chunks else self.total

    def _append(self, stream: str, data: bytes) -> None:
        if not data:
            return
        self._chunks.append(_Chunk(self.total, stream, data))
        self.total += len(data)
        self._kept += len(data)
        while self._kept > self._buffer_bytes and len(self._chunks) > 1:
            self._kept -= len(self._chunks.popleft().data)
        self._pulse()

    def _pulse(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def _pump(self) -> None:
        try:
            async for item in self.handle.output:
                if isinstance(item, ExitItem):
                    self.exit_code = item.exit_code
                    continue
                self._counted[item.stream] = self._counted.get(item.stream, 0) + len(item.data)
                self._append(item.stream, item.data)
        except SandboxError as e:
            if self.error is None:  # a kill's own reason comes first
                self.error = error_body(e, error_status(e))
        except asyncio.CancelledError:
            self.error = self.error or {"error": "CommandKilled", "message": "the command was killed"}
            raise
        except Exception:  # a provider fault: logged here, a plain error for the agent
            self._log.exception("jupyter_tai_sandbox: MCP command %s failed", self.id)
            self.error = {"error": "InternalError", "message": "the command's output could not be read"}
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.handle.kill())
            self.ended_at = time.monotonic()
            self._pulse()
            if self._on_end is not None:
                self._on_end()

    async def kill(self, reason: dict[str, Any]) -> None:
        """Stop the command (idempotent); ``reason`` is what the next poll reports."""
        if not self.running:
            return
        self.error = reason
        with contextlib.suppress(Exception):
            await self.handle.kill()
        # the pump ends when the output does; a provider that never ends it is cancelled
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.task), 5.0)
        if not self.task.done():
            self.task.cancel()

    async def poll(self, offset: int, wait_seconds: float, max_bytes: int) -> dict[str, Any]:
        """Output from ``offset`` (at most ``max_bytes``), after waiting up to ``wait_seconds`` for news."""
        self.last_poll = time.monotonic()
        if offset >= self.total and self.running and wait_seconds > 0:
            self.pollers += 1  # a command being waited on is not idle
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_seconds)
            finally:
                self.pollers -= 1
        self.last_poll = time.monotonic()
        start = min(max(offset, self.kept_from), self.total)
        output: list[dict[str, Any]] = []
        position, budget = start, max_bytes
        for chunk in self._chunks:
            end = chunk.start + len(chunk.data)
            if end <= position or budget <= 0:
                continue
            piece = chunk.data[position - chunk.start : position - chunk.start + budget]
            text = piece.decode(errors="replace")
            if output and output[-1]["stream"] == chunk.stream:
                output[-1]["text"] += text
            else:
                output.append({"stream": chunk.stream, "text": text})
            position += len(piece)
            budget -= len(piece)
        answer: dict[str, Any] = {
            "handle": self.id,
            "session_id": self.session_id,
            "offset": offset,
            "next_offset": position,
            "output": output,
            "more": position < self.total,
            "running": self.running,
            "exit_code": self.exit_code,
            "stdout_bytes": self.byte_counts.get("stdout", 0),
            "stderr_bytes": self.byte_counts.get("stderr", 0),
        }
        if offset < start:
            answer["skipped_bytes"] = start - offset
            answer["note"] = (
                f"{start - offset} bytes of output before offset {start} were dropped from the handle's "
                "buffer (SandboxMCP.handle_buffer_bytes); redirect large output to a workspace file"
            )
        if self.error is not None and not answer["more"]:
            answer["error"] = self.error
        return answer


class CommandHandles:
    """The started commands of one door: ownership, per-user limit, expiry."""

    def __init__(
        self,
        *,
        log: Any,
        idle_timeout: float,
        retention: float,
        max_running_per_user: int,
        buffer_bytes: int,
        on_change: Callable[[int], None] | None = None,
    ) -> None:
        self.log = log
        self.idle_timeout = idle_timeout
        self.retention = retention
        self.max_running_per_user = max_running_per_user
        self.buffer_bytes = buffer_bytes
        self._on_change = on_change
        self._handles: dict[str, CommandHandle] = {}
        self._starting: Counter[str] = Counter()  # owner -> starts in flight
        self._janitor: asyncio.Task[None] | None = None

    def running_count(self) -> int:
        return sum(1 for h in self._handles.values() if h.running)

    def check_room(self, owner: str) -> None:
        """Refuse when ``owner`` runs (or is starting) as many commands as allowed."""
        running = sum(1 for h in self._handles.values() if h.owner == owner and h.running)
        running += self._starting[owner]
        if self.max_running_per_user and running >= self.max_running_per_user:
            raise SandboxQuotaError(
                f"{owner!r} already runs {running} started commands, the most one user may run "
                f"(SandboxMCP.max_running_commands_per_user = {self.max_running_per_user}): "
                "poll them to their end or kill one first"
            )

    @contextlib.contextmanager
    def reserve(self, owner: str) -> Iterator[None]:
        """Check the limit and hold a slot while the command starts (no await between the two).

        ``add`` the command inside the block: the slot passes to it; a start that fails gives it back.
        """
        self.check_room(owner)
        self._starting[owner] += 1
        try:
            yield
        finally:
            self._starting[owner] -= 1
            if self._starting[owner] <= 0:
                del self._starting[owner]

    def add(self, handle: ExecHandle, *, owner: str, session_id: str, timeout_seconds: float) -> CommandHandle:
        command = CommandHandle(
            handle,
            owner=owner,
            session_id=session_id,
            timeout_seconds=timeout_seconds,
            buffer_bytes=self.buffer_bytes,
            log=self.log,
            on_end=lambda: self._ended(owner),
        )
        self._handles[command.id] = command
        self._changed()
        self._ensure_janitor()
        return command

    def _ended(self, owner: str) -> None:
        self._drop_finished(owner)
        self._changed()

    def _drop_finished(self, owner: str) -> None:
        """Keep at most max_running_per_user finished handles per user (the oldest is dropped).

        A finished handle holds up to buffer_bytes of output for its retention time: without a
        bound, commands that end at once and are started again would pin memory without limit.
        """
        if not self.max_running_per_user:
            return
        finished = sorted(
            (h for h in self._handles.values() if h.owner == owner and h.ended_at is not None),
            key=lambda h: h.ended_at or 0.0,
        )
        for command in finished[: max(0, len(finished) - self.max_running_per_user)]:
            self._handles.pop(command.id, None)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.running_count())

    def get(self, handle_id: str, owner: str, *, admin: bool = False) -> CommandHandle:
        """The caller's handle; another user's answers exactly like an unknown one."""
        command = self._handles.get(handle_id) if isinstance(handle_id, str) else None
        if command is None or (command.owner != owner and not admin):
            raise SandboxNotFoundError(
                f"no started command {handle_id!r} (finished ones are kept "
                f"{self.retention:g} s, SandboxMCP.handle_retention_seconds)"
            )
        return command

    async def kill_session(self, session_id: str) -> None:
        """Kill every running command of a session (it is being destroyed)."""
        reason = {"error": "SandboxNotFoundError", "message": f"session {session_id!r} was destroyed"}
        await asyncio.gather(
            *(h.kill(reason) for h in list(self._handles.values()) if h.session_id == session_id and h.running)
        )

    def _ensure_janitor(self) -> None:
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.create_task(self._sweep_forever(), name="mcp-command-janitor")

    async def _sweep_forever(self) -> None:
        period = max(0.2, min(5.0, self.idle_timeout / 4))
        while self._handles:
            await asyncio.sleep(period)
            await self.sweep()

    async def sweep(self) -> None:
        """Kill running commands nobody polls; drop finished handles past their retention."""
        now = time.monotonic()
        for command in list(self._handles.values()):
            if command.running and not command.pollers and now - command.last_poll > self.idle_timeout:
                self.log.info(
                    "jupyter_tai_sandbox: MCP command %s of %s not polled for %.0f s: killed",
                    command.id, command.owner, now - command.last_poll,
                )
                await command.kill({
                    "error": "HandleExpired",
                    "message": f"the command was killed: nobody polled it for {self.idle_timeout:g} s "
                    "(SandboxMCP.handle_idle_timeout_seconds)",
                })
            elif command.ended_at is not None and now - command.ended_at > self.retention:
                self._handles.pop(command.id, None)

    async def close(self) -> None:
        """Kill everything (the server stops)."""
        reason = {"error": "SandboxUnavailableError", "message": "the server is stopping"}
        await asyncio.gather(*(h.kill(reason) for h in list(self._handles.values()) if h.running))
        self._handles.clear()
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
            self._janitor = None
