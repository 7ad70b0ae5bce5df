"""The server's live commands: one registry, read by push (the exec websocket) or by pull (MCP polls).

Every command started over the exec websocket (``start``) or MCP (``session_exec_start``)
becomes a :class:`LiveCommand` in the app's :class:`LiveCommands`. One task (the pump)
reads the command's output as it comes (already scrubbed, capped and under its
deadline: the gated session applied the exec-time policy at ``start``), keeps the
last ``buffer_bytes`` of it in an :class:`OutputRing` with absolute byte offsets
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
last polls. One cap per user and per session counts the commands of both doors; an
ended command kept for its readers gives its place to a new one. Only the owner (or an
admin) may see, attach, poll or kill; another user's command answers like an unknown id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..contract import (
    ExecHandle,
    ExecRequest,
    ExitItem,
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
)
from ..contract.values import MAX_LABEL_BYTES
from ..errors import SandboxQuotaError, error_body, error_status
from ..gate import ScrubbedHandle
from ..sessions import Caller

STREAMS = ("stdout", "stderr")
DOORS = ("websocket", "mcp")
#: how long a look-up of an unknown command waits for the start's adoption of held commands
ADOPT_WAIT_SECONDS = 30.0
#: the version of the label a live command's session keeps (Ticket.label)
LABEL_VERSION = 1
#: the websocket's binary frame prefix per stream
STREAM_IDS = {"stdout": 1, "stderr": 2}
Door = Literal["websocket", "mcp"]


@dataclass
class LiveCommandPolicy:
    """The one grace/idle policy, buffer size and caps of every live command (SandboxApp.live_command_*)."""

    grace_seconds: float = 300.0
    retention_seconds: float = 600.0
    buffer_bytes: int = 1 << 20
    max_per_user: int = 32
    max_per_session: int = 16


class OutputRing:
    """A command's most recent output, ``limit`` bytes at most, with absolute offsets.

    Offsets count both streams together from the command's start; each piece also knows its offset in
    its own stream, so a reader may resume each stream where it left it (exact whatever the interleaving:
    after a restart the order of the two streams is the session's replay, not the first server's). The
    oldest output goes first; a chunk larger than the whole ring keeps its tail. Reading does not consume:
    every reader (a reattach, each poll) reads from its own offset. (The provider's
    :class:`~jupyter_tai_sandbox.spool.OutputSpool` before it is a queue its one reader drains.)
    """

    def __init__(self, limit: int, start: int = 0, stream_starts: dict[str, int] | None = None) -> None:
        self.limit = limit
        #: (offset, stream, offset in the stream, data)
        self._chunks: collections.deque[tuple[int, str, int, bytes]] = collections.deque()
        self._held = 0
        self.end = start
        #: each stream's next offset
        self.stream_ends = dict.fromkeys(STREAMS, 0) | (stream_starts or {})

    @property
    def start(self) -> int:
        """The oldest offset the ring still holds."""
        return self._chunks[0][0] if self._chunks else self.end

    def stream_start(self, stream: str) -> int:
        """The oldest offset of ``stream`` the ring still holds."""
        return next((at for _, name, at, _ in self._chunks if name == stream), self.stream_ends[stream])

    def append(self, stream: str, data: bytes) -> None:
        self._chunks.append((self.end, stream, self.stream_ends[stream], data))
        self.end += len(data)
        self.stream_ends[stream] += len(data)
        self._held += len(data)
        while self._held > self.limit and len(self._chunks) > 1:
            self._held -= len(self._chunks.popleft()[3])
        if self._held > self.limit:  # one chunk larger than the ring: keep its tail
            offset, chunk_stream, at, chunk = self._chunks.popleft()
            keep = chunk[-self.limit :] if self.limit else b""
            self._held = len(keep)
            if keep:
                cut = len(chunk) - len(keep)
                self._chunks.append((offset + cut, chunk_stream, at + cut, keep))

    def since(self, offset: int, streams: dict[str, int] | None = None) -> Iterator[tuple[int, str, bytes]]:
        """``(offset, stream, data)`` pieces from ``offset`` (or the oldest held) to the end; with ``streams``,
        each stream from its own offset there instead."""
        first = max(offset, self.start)
        for start, stream, at, data in self._chunks:
            skip = (streams.get(stream, 0) - at) if streams is not None else (first - start)
            if skip >= len(data):
                continue
            yield (start + skip, stream, data[skip:]) if skip > 0 else (start, stream, data)


@dataclass(frozen=True)
class Ticket:
    """Who a live command is, fixed before it starts: what the registry lists, and the label a session that
    holds its commands keeps with it, so a later server (a restart, a second one) adopts it under the same id."""

    id: str
    session_id: str
    owner: str
    argv: tuple[str, ...]
    pty: bool
    door: Door
    started_at: float
    deadline: float

    def label(self) -> str:
        """The ticket as JSON, argv shortened to fit the label's bytes (it is only shown)."""
        record: dict[str, Any] = {
            "v": LABEL_VERSION, "exec": self.id, "session": self.session_id, "owner": self.owner, "pty": self.pty,
            "door": self.door, "started": self.started_at, "deadline": self.deadline, "argv": [],
        }
        room = MAX_LABEL_BYTES - len(json.dumps(record).encode())
        for arg in self.argv:
            room -= len(json.dumps(arg).encode()) + 2
            if room < 0:
                break
            record["argv"].append(arg)
        return json.dumps(record)

    def labelled(self, request: ExecRequest) -> ExecRequest:
        return dataclasses.replace(request, label=self.label())

    @classmethod
    def from_label(cls, label: str | None, session_id: str) -> Ticket | None:
        """The ticket a label holds; None for one that is not a live command's of this session."""
        try:
            record = json.loads(label or "")
            ticket = cls(
                id=record["exec"], session_id=record["session"], owner=record["owner"],
                argv=tuple(record["argv"]), pty=bool(record["pty"]), door=record["door"],
                started_at=float(record["started"]), deadline=float(record["deadline"]),
            )
        except (ValueError, TypeError, KeyError):
            return None
        valid = (
            record.get("v") == LABEL_VERSION and ticket.session_id == session_id and ticket.door in DOORS
            and isinstance(ticket.id, str) and ticket.id.startswith("exe-") and isinstance(ticket.owner, str)
            and all(isinstance(arg, str) for arg in ticket.argv)
        )
        return ticket if valid else None


class Listener(Protocol):
    """The attached end (a websocket): it sends output frames and the final message."""

    def send_output(self, stream_id: int, data: bytes) -> Awaitable[None]:
        """Start sending one frame; the awaitable is its flush. Raises when the listener is gone."""

    async def send_final(self, message: dict[str, Any]) -> None:
        """Send the exit (or error) message and close."""


class LiveCommand:
    """One command of the registry: its ring, its end, whoever is attached or polling."""

    def __init__(
        self, handle: ExecHandle, ticket: Ticket, *, registry: LiveCommands,
        stream_starts: dict[str, int] | None = None, adopted: bool = False, listener: Listener | None = None,
    ) -> None:
        self.id = ticket.id
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
                    self.exit_code = item.exit_code
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
        if self.exit_code is not None:
            self.final = {"type": "exit", "exit_code": self.exit_code}
        elif self.taken_over:
            self.final = {"type": "detached", "message": (self.error or {}).get("message", "")}
        else:
            self.final = {"type": "error", **(self.error or {})}
        self.ended_at = time.monotonic()
        self._pulse()
        await self._deliver_final()

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
                listener.send_output(STREAM_IDS[stream], piece) for _, stream, piece in self.ring.since(first, streams)
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
            "jupyter_tai_sandbox: live command %s of %s not watched for %g s: killed", self.id, self.owner, grace
        )
        await self.kill({
            "error": "HandleExpired",
            "message": f"the command was killed: nobody attached or polled it for {grace:g} s "
            "(SandboxApp.live_command_grace_seconds)",
        })
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


class LiveCommands:
    """The live commands of one server, by id: both doors, one policy, one cap per user and per session."""

    def __init__(self, policy: LiveCommandPolicy, *, log: logging.Logger | None = None) -> None:
        self.policy = policy
        self.log = log or logging.getLogger("jupyter_tai_sandbox")
        self._commands: dict[str, LiveCommand] = {}
        self._starting: collections.Counter[tuple[str, str]] = collections.Counter()  # (owner, session) -> starts
        #: tasks started from timers, referenced until done
        self._tasks: set[asyncio.Future[None]] = set()
        self._adopting: dict[str, asyncio.Lock] = {}
        self._adopted: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._commands)

    def running_count(self, owner: str | None = None) -> int:
        return sum(1 for c in self._commands.values() if c.running and (owner is None or c.owner == owner))

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ caps

    def _held(self, owner: str | None = None, session_id: str | None = None) -> list[LiveCommand]:
        return [
            c for c in self._commands.values()
            if (owner is None or c.owner == owner) and (session_id is None or c.session_id == session_id)
        ]

    @staticmethod
    def _make_room(held: list[LiveCommand], starting: int, cap: int) -> int:
        """Forget the oldest ended, unwatched commands of ``held`` until one more fits under ``cap``;
        the count held and starting after that."""
        count = len(held) + starting
        if not cap or count < cap:
            return count
        ended = sorted((c for c in held if not c.running and not c.attached and not c.pollers),
                       key=lambda c: c.ended_at or 0.0)
        for command in ended[: count - cap + 1]:
            command.evict()
            count -= 1
        return count

    def check_room(self, owner: str, session_id: str) -> None:
        """Refuse (SandboxQuotaError, 429) a command past the per-user or per-session cap.

        Every command counts, whichever door started it, attached or detached, polled or not; an
        ended one kept for its readers gives its place (the oldest first) before a start is refused.
        """
        policy = self.policy
        starting = sum(n for (who, _), n in self._starting.items() if who == owner)
        by_user = self._make_room(self._held(owner=owner), starting, policy.max_per_user)
        if policy.max_per_user and by_user >= policy.max_per_user:
            raise SandboxQuotaError(
                f"{owner!r} already holds {by_user} live commands (websocket and MCP, detached ones included), "
                f"the most one user may hold (SandboxApp.max_live_commands_per_user = {policy.max_per_user}): "
                "end or kill one first (one nobody attaches to or polls is killed "
                "SandboxApp.live_command_grace_seconds after its last reader left)"
            )
        starting = sum(n for (_, sid), n in self._starting.items() if sid == session_id)
        in_session = self._make_room(self._held(session_id=session_id), starting, policy.max_per_session)
        if policy.max_per_session and in_session >= policy.max_per_session:
            raise SandboxQuotaError(
                f"session {session_id!r} already holds {in_session} live commands (websocket and MCP, detached "
                f"ones included), the most one session may hold (SandboxApp.max_live_commands_per_session = "
                f"{policy.max_per_session}): end or kill one first"
            )

    @contextlib.contextmanager
    def reserve(self, owner: str, session_id: str) -> Iterator[None]:
        """Check the caps and hold a slot while the command starts (no await between the two).

        ``add`` the command inside the block: the slot passes to it; a start that fails gives it back.
        """
        self.check_room(owner, session_id)
        key = (owner, session_id)
        self._starting[key] += 1
        try:
            yield
        finally:
            self._starting[key] -= 1
            if self._starting[key] <= 0:
                del self._starting[key]

    # ------------------------------------------------------------ entries

    def ticket(self, owner: str, session_id: str, request: ExecRequest, door: Door) -> Ticket:
        """A new command's identity, made before it starts (its session may keep it as the command's label)."""
        now = time.time()
        return Ticket(
            id="exe-" + secrets.token_hex(8), session_id=session_id, owner=owner, argv=request.argv,
            pty=request.pty, door=door, started_at=now, deadline=now + request.timeout_seconds,
        )

    def add(self, handle: ExecHandle, ticket: Ticket, *, listener: Listener | None = None) -> LiveCommand:
        """A command just started. ``listener``: its reader from the first byte (the websocket that started it);
        attached later, it would get only what the ring still held."""
        command = LiveCommand(handle, ticket, registry=self, listener=listener)
        self._commands[command.id] = command
        return command

    # ------------------------------------------- commands a session held for us

    async def adopt(
        self, session: SandboxSession, *, take_over: str | None = None, caller: Caller | None = None,
    ) -> None:
        """Add the live commands a session holds (:attr:`SandboxSession.holds_commands`) that a previous
        server started (a restart) and nobody reads now: each under its own id, owner and deadline, its
        output resumed at the oldest byte the session holds, unwatched (the grace applies from now).

        ``take_over``: that command's id is adopted even when another server reads it (``caller``, its owner
        or an admin, asked for it here): that server's clients are told it left (``detached``), and it runs
        on here.
        """
        if not session.holds_commands:
            return
        async with self._adopting.setdefault(session.id, asyncio.Lock()):
            try:
                held = await session.held_commands()
            except SandboxError as e:
                self.log.warning("jupyter_tai_sandbox: listing %s's commands failed: %s", session.id, e)
                return
            for command in held:
                ticket = Ticket.from_label(command.label, session.id)
                if ticket is None or ticket.id in self._commands:
                    continue
                if command.attached and not (
                    ticket.id == take_over and caller is not None
                    and (ticket.owner == caller.name or caller.manages_all)
                ):
                    continue  # another server reads it: only its owner (or an admin) may take it over
                offsets = {stream: span[0] for stream, span in command.offsets.items() if stream in STREAMS}
                try:
                    handle = await session.attach_command(command.id, offsets)
                except SandboxError as e:
                    self.log.warning("jupyter_tai_sandbox: adopting %s of %s failed: %s", ticket.id, session.id, e)
                    continue
                self._commands[ticket.id] = LiveCommand(
                    handle, ticket, registry=self, stream_starts=offsets, adopted=True,
                )
                self.log.info("jupyter_tai_sandbox: adopted live command %s of %s (%s) from a previous server",
                              ticket.id, session.id, ticket.owner)

    async def adopt_all(self, sessions: Callable[[], Awaitable[list[SandboxSession]]]) -> None:
        """At the server's start: adopt what every session of the deployment holds (see :meth:`adopt`)."""
        try:
            found = await sessions()
        except SandboxError as e:
            self.log.warning("jupyter_tai_sandbox: finding the sessions' held commands failed: %s", e)
            return
        room = asyncio.Semaphore(8)

        async def adopt(session: SandboxSession) -> None:
            async with room:
                await self.adopt(session)

        await asyncio.gather(*(adopt(session) for session in found))

    def start_adopting(self, sessions: Callable[[], Awaitable[list[SandboxSession]]]) -> None:
        self._adopted = asyncio.ensure_future(self.adopt_all(sessions))

    async def find(self, command_id: Any, caller: Caller, session: SandboxSession | None = None) -> LiveCommand:
        """:meth:`get`, after the commands a previous server left are adopted (and, with ``session``, the
        one asked for is taken over from another server that reads it)."""
        try:
            return self.get(command_id, caller, session.id if session is not None else None)
        except SandboxNotFoundError:
            if self._adopted is not None and not self._adopted.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(self._adopted), ADOPT_WAIT_SECONDS)
            if session is not None and isinstance(command_id, str):
                await self.adopt(session, take_over=command_id, caller=caller)
        return self.get(command_id, caller, session.id if session is not None else None)

    async def listed(self, session: SandboxSession, caller: Caller) -> list[dict[str, Any]]:
        """The session's commands as the list route shows them: this server's (after adopting what a previous
        one left), then those another live server reads (``"elsewhere": true``; attaching here takes them over)."""
        await self.adopt(session)
        listed = [c.to_json() for c in self.list(session.id, caller)]
        if session.holds_commands:
            with contextlib.suppress(SandboxError):
                for command in await session.held_commands():
                    ticket = Ticket.from_label(command.label, session.id)
                    if ticket is None or ticket.id in self._commands:
                        continue
                    if not (ticket.owner == caller.name or caller.sees_all):
                        continue
                    listed.append({
                        "id": ticket.id, "session_id": session.id, "argv": list(ticket.argv), "pty": ticket.pty,
                        "started": ticket.started_at, "owner": ticket.owner, "door": ticket.door,
                        "attached": command.attached, "running": command.running,
                        "offset": sum(end for _, end in command.offsets.values()), "elsewhere": True,
                    })
        return listed

    def drop(self, command: LiveCommand) -> None:
        self._commands.pop(command.id, None)

    def get(self, command_id: Any, caller: Caller, session_id: str | None = None) -> LiveCommand:
        """The caller's command (any, for an admin); another user's answers exactly like an unknown id."""
        command = self._commands.get(command_id) if isinstance(command_id, str) else None
        if (
            command is None
            or (session_id is not None and command.session_id != session_id)
            or not (command.owner == caller.name or caller.manages_all)
        ):
            where = " in this session" if session_id is not None else ""
            raise SandboxNotFoundError(
                f"no live command {command_id!r}{where} (an ended one is kept for its readers "
                f"{self.policy.retention_seconds:g} s once polled, SandboxApp.live_command_retention_seconds)"
            )
        return command

    def list(self, session_id: str, caller: Caller) -> list[LiveCommand]:
        """The session's commands from both doors (the caller's own; all of them for an admin)."""
        return [
            c for c in self._commands.values()
            if c.session_id == session_id and (c.owner == caller.name or caller.sees_all)
        ]

    async def kill_session(self, session_id: str) -> None:
        """Kill every running command of a session (it is being destroyed)."""
        self._adopting.pop(session_id, None)
        reason = {"error": "SandboxNotFoundError", "message": f"session {session_id!r} was destroyed"}
        await asyncio.gather(*(c.kill(reason) for c in self._held(session_id=session_id) if c.running))

    async def close(self) -> None:
        """Kill and forget every command (the server stops)."""
        reason = {"error": "SandboxUnavailableError", "message": "the server is stopping"}
        await asyncio.gather(*(c.kill(reason) for c in list(self._commands.values()) if c.running))
        for command in list(self._commands.values()):
            await command.forget()
        for task in list(self._tasks):
            task.cancel()
        if self._adopted is not None:
            self._adopted.cancel()
