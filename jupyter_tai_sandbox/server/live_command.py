"""One live command: its pump, its output and the two faces it serves (the registry is execs.py).

One task (the pump) reads the command's output as it comes (already scrubbed, capped and under its
deadline: the gated session applied the exec-time policy at ``start``), keeps the last
``buffer_bytes`` of it in an :class:`~.output_ring.OutputRing` with absolute byte offsets
(stdout and stderr counted together), and serves two faces of the same entry:

* **push** (:meth:`LiveCommand.attach`): a listener (a websocket) gets what the ring
  holds from an offset, then each chunk live, one frame in flight, nothing skipped or
  repeated; the exit (or error) is delivered to it once, and the command is forgotten;
* **pull** (:meth:`LiveCommand.poll`): a reader asks for what is new since an offset,
  waiting a little for news; the exit stays for later polls.

One policy (:class:`LiveCommandPolicy`, the ``SandboxApp.live_command_*`` settings) for both:
a running command nobody watches (no listener attached, no poll in progress, no poll
for ``grace_seconds``) is killed; an ended one nobody read to its end is kept for a
reattach for ``grace_seconds``, or, once it was polled, ``retention_seconds`` for its
last polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from ..contract import (
    ExecHandle,
    ExitItem,
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
)
from ..errors import error_body, error_status
from ..gate import ScrubbedHandle
from .output_ring import STREAMS, OutputRing
from .ticket import Ticket

#: the websocket's binary frame prefix per stream
STREAM_IDS = {"stdout": 1, "stderr": 2}
#: kill reasons a reader is told instead of the kill's status: the session went, the server is stopping
_SAID_OVER_THE_STATUS = frozenset({"SandboxSessionGoneError", "SandboxUnavailableError"})
#: longest a command's end waits to learn whether its session went
GONE_WAIT_SECONDS = 8.0
#: the ends this server gives a command itself (a kill's reason): never a session's going
_OWN_ENDS = frozenset(
    {
        "HandleExpired",
        "CommandKilled",
        "CommandTakenOver",
        "SandboxUnavailableError",
        "SandboxSessionGoneError",
        "SandboxExecTimeoutError",
    }
)


@dataclass
class LiveCommandPolicy:
    """The one grace/idle policy, buffer size and caps of every live command (SandboxApp.live_command_*)."""

    grace_seconds: float = 300.0
    retention_seconds: float = 600.0
    buffer_bytes: int = 1 << 20
    max_per_user: int = 32
    max_per_session: int = 16


class Listener(Protocol):
    """The attached end (a websocket): it sends output frames and the final message."""

    def send_output(self, stream_id: int, data: bytes) -> Awaitable[None]:
        """Start sending one frame; the awaitable is its flush. Raises when the listener is gone."""

    async def send_final(self, message: dict[str, Any]) -> None:
        """Send the exit (or error) message and close."""


class LiveRegistry(Protocol):
    """What a command uses of its registry (LiveCommands), named without importing it."""

    policy: LiveCommandPolicy
    log: logging.Logger

    def spawn(self, coroutine: Any) -> None: ...

    def drop(self, command: LiveCommand) -> None: ...

    async def why_gone(self, command: LiveCommand) -> SandboxError | None: ...


class LiveCommand:
    """One command of the registry: its ring, its end, whoever is attached or polling."""

    def __init__(
        self,
        handle: ExecHandle,
        ticket: Ticket,
        *,
        registry: LiveRegistry,
        stream_starts: dict[str, int] | None = None,
        adopted: bool = False,
        listener: Listener | None = None,
        session: SandboxSession | None = None,
    ) -> None:
        self.id = ticket.id
        #: the session it runs in, when known (asked whether it is gone when the command ends that way)
        self.session = session
        #: the session's end as last seen
        self.session_end: float | None = None
        self.handle = handle
        self.session_id = ticket.session_id
        self.owner = ticket.owner
        self.argv = ticket.argv
        self.pty = ticket.pty
        self.door = door = ticket.door
        self.started_at = ticket.started_at
        self.deadline = ticket.deadline
        starts = stream_starts or {}
        self.ring = OutputRing(registry.policy.buffer_bytes, sum(starts.values()), starts)
        self.exit_code: int | None = None
        #: why it exited, where the status alone does not say (an OOM kill)
        self.exit_reason: str | None = None
        #: why the command ended without an exit, or the reason a kill gave (what a poll reports)
        self.error: dict[str, Any] | None = None
        #: the websocket's last message (exit or error), once the output ended
        self.final: dict[str, Any] | None = None
        self.ended_at: float | None = None
        #: a pull reader (MCP) started or polled it: its end is kept retention_seconds for later polls
        self.pulled = door == "mcp"
        self.pollers = 0
        self.forgotten = False
        #: another server attached to it (the session holds its commands): it is no longer this server's
        self.taken_over = False
        self._registry = registry
        self._counted = dict.fromkeys(STREAMS, 0)
        #: attached from the start (before the pump's first turn), it is sent every byte from offset 0
        self._listener: Listener | None = listener
        self._in_flight: Awaitable[None] | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._unwatched: asyncio.TimerHandle | None = None
        self._pump = asyncio.create_task(self._run(), name=f"live-command-{self.id}")
        if door == "mcp" or adopted:
            self._arm_unwatched()  # nobody attaches to a polled (or adopted) command: unwatched until read

    # ------------------------------------------------------------ view

    @property
    def running(self) -> bool:
        return self.ended_at is None

    @property
    def attached(self) -> bool:
        return self._listener is not None

    @property
    def start_offset(self) -> int:
        """The oldest offset the ring can still replay."""
        return self.ring.start

    @property
    def end_offset(self) -> int:
        return self.ring.end

    @property
    def byte_counts(self) -> dict[str, int]:
        """Bytes per stream as the command wrote them: a scrubbed handle counts them before its scrub."""
        return self.handle.byte_counts if isinstance(self.handle, ScrubbedHandle) else self._counted

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "argv": list(self.argv),
            "pty": self.pty,
            "started": self.started_at,
            "owner": self.owner,
            "door": self.door,
            "attached": self.attached,
            "running": self.running,
            "offset": self.end_offset,
        }

    # ------------------------------------------------------------ pump

    async def _run(self) -> None:
        try:
            async for item in self.handle.output:
                if isinstance(item, ExitItem):
                    self.exit_code, self.exit_reason = item.exit_code, item.reason
                    break
                if item.data:
                    self._counted[item.stream] = self._counted.get(item.stream, 0) + len(item.data)
                    await self._emit(item.stream, item.data)
            else:  # pragma: no cover - the contract ends every output with an exit item or an error
                self.error = {"error": "SandboxError", "message": "the output ended without an exit"}
        except SandboxConflictError as e:  # a second server attached to the command: it runs on there
            self.taken_over = True
            self.error = {"error": "CommandTakenOver", "message": str(e)}
        except SandboxError as e:
            if self.error is None:  # a kill's own reason comes first
                self.error = error_body(e, error_status(e))
        except asyncio.CancelledError:
            self.error = self.error or {"error": "CommandKilled", "message": "the command was stopped"}
        except Exception:  # a provider fault: logged here, a plain error for the readers
            self._registry.log.exception("jupyter_tai_sandbox: live command %s failed", self.id)
            self.error = {"error": "InternalError", "message": "the command's output could not be read"}
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.handle.kill())
        if self.error is not None and self.error.get("error") in _SAID_OVER_THE_STATUS:
            self.exit_code = None  # stopped because its session or the server went: that, not the kill's 137
        elif self._may_be_gone():
            # the transport's error (a reset connection) or a kill's status would read like a crash
            with contextlib.suppress(Exception):
                gone = await asyncio.wait_for(self._registry.why_gone(self), GONE_WAIT_SECONDS)
                if gone is not None:
                    self.exit_code, self.error = None, gone.to_json()
        if self.exit_code is not None:
            self.final = {"type": "exit", "exit_code": self.exit_code}
            if self.exit_reason is not None:
                self.final["reason"] = self.exit_reason
        elif self.taken_over:
            self.final = {"type": "detached", "message": (self.error or {}).get("message", "")}
        else:
            self.final = {"type": "error", **(self.error or {})}
        self.ended_at = time.monotonic()
        self._pulse()
        await self._deliver_final()

    def _may_be_gone(self) -> bool:
        """Whether this end may be the session's: an error not of our own making, or a signal's status."""
        if self.taken_over:
            return False
        if self.exit_code is not None:
            return self.exit_code >= 128 and self.error is None
        return self.error is None or self.error.get("error") not in _OWN_ENDS

    def _pulse(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def _emit(self, stream: str, data: bytes) -> None:
        async with self._lock:
            self.ring.append(stream, data)
            frame = self._send(STREAM_IDS[stream], data)
        self._pulse()
        if frame is not None:
            await self._settle(frame)

    def _send(self, stream_id: int, data: bytes) -> Awaitable[None] | None:
        """Start a frame to the listener (ordered under the lock); None when nobody is attached."""
        listener = self._listener
        if listener is None:
            return None
        try:
            return listener.send_output(stream_id, data)
        except Exception:  # the socket went away: detach, the command runs on
            self._lost(listener)
            return None

    async def _settle(self, frame: Awaitable[None]) -> None:
        """One frame in flight: wait for the previous flush before the next is started."""
        previous, self._in_flight = self._in_flight, frame
        if previous is not None:
            try:
                await previous
            except Exception:
                if self._listener is not None:
                    self._lost(self._listener)

    async def _deliver_final(self) -> None:
        listener = self._listener
        if listener is None:
            self._arm_unwatched()  # kept for a reattach or a poll, then forgotten
            return
        if self._in_flight is not None:
            with contextlib.suppress(Exception):
                await self._in_flight
        await self._push_final(listener)

    async def _push_final(self, listener: Listener) -> None:
        """The end, to the attached listener once; an entry nobody polls is then forgotten."""
        with contextlib.suppress(Exception):
            await listener.send_final(self.final or {})
        if self._listener is listener:
            self._listener = None
            self._in_flight = None
        if self.pulled:
            self._arm_unwatched()
        else:
            await self.forget()

    # ---------------------------------------------------------- push face

    async def attach(self, listener: Listener, offset: int = 0, streams: dict[str, int] | None = None) -> int:
        """Replay from ``offset`` (what the ring still holds) then go live; returns the first offset sent.

        ``streams``: the next offset of each stream the client had (it counts them from the frames' stream
        ids); then each stream resumes exactly there, whatever order the two came in (after a server
        restart the order is the session's replay). A listener attached already is replaced (its socket is
        told and closed by its handler).
        """
        if self.forgotten:
            raise SandboxNotFoundError(f"command {self.id} has ended and was forgotten")
        self._cancel_unwatched()
        async with self._lock:
            previous, self._listener = self._listener, listener
            if previous is not None and previous is not listener:
                with contextlib.suppress(Exception):
                    await previous.send_final(
                        {"type": "detached", "message": "another client attached to this command"}
                    )
            first = max(offset, self.start_offset)
            frames = [
                listener.send_output(STREAM_IDS[stream], piece)
                for _, stream, piece in self.ring.since(first, streams)
            ]
        for frame in frames:
            await frame
        if self.final is not None and self._listener is listener:
            await self._push_final(listener)
        return first

    def resume_points(self, streams: dict[str, int]) -> dict[str, int]:
        """Where each stream's replay starts for a client that had ``streams``."""
        return {name: max(streams.get(name, 0), self.ring.stream_start(name)) for name in STREAMS}

    def detach(self, listener: Listener) -> None:
        """The listener's socket closed: the command runs on, unwatched, for the grace time."""
        if self._listener is listener:
            self._lost(listener)
        elif self._listener is None:  # its socket closed before it attached
            self._arm_unwatched()

    def _lost(self, listener: Listener) -> None:
        if self._listener is listener:
            self._listener = None
            self._in_flight = None
            self._arm_unwatched()

    async def write(self, data: bytes) -> None:
        await self.handle.write(data)

    # ---------------------------------------------------------- pull face

    async def poll(self, offset: int, wait_seconds: float, max_bytes: int) -> dict[str, Any]:
        """Output from ``offset`` (at most ``max_bytes``), after waiting up to ``wait_seconds`` for news."""
        self.pulled = True
        self.pollers += 1  # a command being polled is watched
        self._cancel_unwatched()
        try:
            if offset >= self.end_offset and self.running and wait_seconds > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_seconds)
        finally:
            self.pollers -= 1
            self._arm_unwatched()
        start = min(max(offset, self.start_offset), self.end_offset)
        output: list[dict[str, Any]] = []
        position, budget = start, max_bytes
        for _, stream, data in self.ring.since(start):
            if budget <= 0:
                break
            piece = data[:budget]
            text = piece.decode(errors="replace")
            if output and output[-1]["stream"] == stream:
                output[-1]["text"] += text
            else:
                output.append({"stream": stream, "text": text})
            position += len(piece)
            budget -= len(piece)
        answer: dict[str, Any] = {
            "handle": self.id,
            "session_id": self.session_id,
            "offset": offset,
            "next_offset": position,
            "output": output,
            "more": position < self.end_offset,
            "running": self.running,
            "exit_code": self.exit_code,
            **({"reason": self.exit_reason} if self.exit_reason is not None else {}),
            "stdout_bytes": self.byte_counts.get("stdout", 0),
            "stderr_bytes": self.byte_counts.get("stderr", 0),
        }
        if offset < start:
            answer["skipped_bytes"] = start - offset
            answer["note"] = (
                f"{start - offset} bytes of output before offset {start} were dropped from the command's "
                "buffer (SandboxApp.live_command_buffer_bytes); redirect large output to a workspace file"
            )
        if self.error is not None and not answer["more"]:
            answer["error"] = self.error
        return answer

    # ---------------------------------------------------------- the policy

    def _arm_unwatched(self) -> None:
        """Nobody watches now: arm the one timer (grace while it runs, then grace or retention)."""
        if self.forgotten or self._listener is not None or self.pollers:
            return
        self._cancel_unwatched()
        policy = self._registry.policy
        seconds = policy.retention_seconds if (self.pulled and not self.running) else policy.grace_seconds
        if seconds <= 0:
            self._registry.spawn(self._unwatched_too_long())
        else:
            self._unwatched = asyncio.get_running_loop().call_later(
                seconds, lambda: self._registry.spawn(self._unwatched_too_long())
            )

    def evict(self) -> None:
        """Forget an ended command at once (its place is needed for a new one)."""
        self.forgotten = True
        self._cancel_unwatched()
        self._registry.drop(self)

    def _cancel_unwatched(self) -> None:
        if self._unwatched is not None:
            self._unwatched.cancel()
            self._unwatched = None

    async def _unwatched_too_long(self) -> None:
        self._unwatched = None
        if self.forgotten or self._listener is not None or self.pollers:
            return
        if not self.running:
            await self.forget()
            return
        grace = self._registry.policy.grace_seconds
        self._registry.log.info(
            "jupyter_tai_sandbox: live command %s of %s not watched for %g s: killed",
            self.id,
            self.owner,
            grace,
        )
        await self.kill(
            {
                "error": "HandleExpired",
                "message": f"the command was killed: nobody attached or polled it for {grace:g} s "
                "(SandboxApp.live_command_grace_seconds)",
            }
        )
        if not self.pulled:
            await self.forget()  # a websocket's command: nobody is left to tell

    async def kill(self, reason: dict[str, Any] | None = None) -> None:
        """Stop the command and wait for its end (idempotent); ``reason`` is what the next poll reports."""
        if not self.running:
            return
        if reason is not None and self.error is None:
            self.error = reason
        with contextlib.suppress(SandboxError):
            await self.handle.kill()
        # the pump ends when the output does; a provider that never ends it is cancelled
        if asyncio.current_task() is not self._pump:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._pump), 10)
            if not self._pump.done():
                self._pump.cancel()

    async def forget(self) -> None:
        """Kill the command (if it still runs) and drop it from the registry. Idempotent.

        An attached client still gets the final message (the pump delivers it).
        """
        if self.forgotten:
            return
        self.forgotten = True
        self._cancel_unwatched()
        await self.kill()
        self._listener = None
        self._registry.drop(self)
