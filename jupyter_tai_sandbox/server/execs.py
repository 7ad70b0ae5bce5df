"""Interactive commands that outlive their websocket: exec ids, an output ring, attach and detach.

Every command started over the exec websocket becomes a :class:`LiveExec`. One
task (the pump) reads the command's output as it comes (already scrubbed, when
the policy says so, by the gated session), keeps the last ``ring_bytes`` of it
with absolute byte offsets (stdout and stderr counted together), and hands
each chunk to the attached listener, one frame in flight, so a slow client
slows the pump and the provider's spool holds the rest.

A listener that goes away *detaches*: the command runs on (within its own
deadline) and is killed after ``grace_seconds`` unless someone attaches again.
Attaching from an offset replays what the ring still holds from there, then
goes live. Only the owner (or an admin) may list or attach.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from ..contract import ExecHandle, ExitItem, SandboxError, SandboxNotFoundError
from ..errors import SandboxQuotaError, error_body, error_status
from ..sessions import Caller

STREAM_IDS = {"stdout": 1, "stderr": 2}
#: finishes started from timers and callbacks, referenced until done
_finishing: set[asyncio.Future[None]] = set()


class Listener(Protocol):
    """The attached end (a websocket): it sends output frames and the final message."""

    def send_output(self, stream_id: int, data: bytes) -> Awaitable[None]:
        """Start sending one frame; the awaitable is its flush. Raises when the listener is gone."""

    async def send_final(self, message: dict[str, Any]) -> None:
        """Send the exit (or error) message and close."""


class LiveExec:
    """One interactive command, its output ring and whoever is attached to it."""

    def __init__(
        self,
        handle: ExecHandle,
        *,
        session_id: str,
        owner: str,
        argv: tuple[str, ...],
        pty: bool,
        ring_bytes: int,
        grace_seconds: float,
        on_done: Callable[[LiveExec], None],
    ) -> None:
        self.id = "exe-" + secrets.token_hex(8)
        self.handle = handle
        self.session_id = session_id
        self.owner = owner
        self.argv = argv
        self.pty = pty
        self.started_at = time.time()
        self.final: dict[str, Any] | None = None
        self._ring: collections.deque[tuple[int, int, bytes]] = collections.deque()  # (offset, stream id, data)
        self._ring_bytes = 0
        self._ring_limit = ring_bytes
        self.end_offset = 0
        self._grace_seconds = grace_seconds
        self._on_done = on_done
        self._listener: Listener | None = None
        self._in_flight: Awaitable[None] | None = None
        self._lock = asyncio.Lock()
        self._grace: asyncio.TimerHandle | None = None
        self._done = False
        self._pump = asyncio.create_task(self._run())

    # ------------------------------------------------------------ view

    @property
    def start_offset(self) -> int:
        """The oldest offset the ring can still replay."""
        return self._ring[0][0] if self._ring else self.end_offset

    @property
    def attached(self) -> bool:
        return self._listener is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "argv": list(self.argv),
            "pty": self.pty,
            "started": self.started_at,
            "owner": self.owner,
            "attached": self.attached,
            "running": self.final is None,
            "offset": self.end_offset,
        }

    # ------------------------------------------------------------ pump

    async def _run(self) -> None:
        final: dict[str, Any]
        try:
            async for item in self.handle.output:
                if isinstance(item, ExitItem):
                    final = {"type": "exit", "exit_code": item.exit_code}
                    break
                if item.data:
                    await self._emit(STREAM_IDS[item.stream], item.data)
            else:  # pragma: no cover - the contract ends every output with an exit item or an error
                final = {"type": "error", "error": "SandboxError", "message": "the output ended without an exit"}
        except SandboxError as e:
            final = {"type": "error", **error_body(e, error_status(e))}
        except asyncio.CancelledError:
            final = {"type": "error", "error": "SandboxError", "message": "the command was stopped"}
        self.final = final
        await self._deliver_final()

    async def _emit(self, stream_id: int, data: bytes) -> None:
        async with self._lock:
            self._remember(stream_id, data)
            frame = self._send(stream_id, data)
        if frame is not None:
            await self._settle(frame)

    def _remember(self, stream_id: int, data: bytes) -> None:
        self._ring.append((self.end_offset, stream_id, data))
        self.end_offset += len(data)
        self._ring_bytes += len(data)
        while self._ring_bytes > self._ring_limit and len(self._ring) > 1:
            _, _, dropped = self._ring.popleft()
            self._ring_bytes -= len(dropped)
        if self._ring_bytes > self._ring_limit:  # one chunk larger than the ring: keep its tail
            offset, stream, chunk = self._ring.popleft()
            keep = chunk[-self._ring_limit :] if self._ring_limit else b""
            self._ring_bytes = len(keep)
            if keep:
                self._ring.append((offset + len(chunk) - len(keep), stream, keep))

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
            # kept for a reattach within the grace time, then forgotten
            self._arm_grace()
            return
        if self._in_flight is not None:
            with contextlib.suppress(Exception):
                await self._in_flight
        with contextlib.suppress(Exception):
            await listener.send_final(self.final or {})
        await self.finish()

    # ---------------------------------------------------------- attach

    async def attach(self, listener: Listener, offset: int = 0) -> int:
        """Replay from ``offset`` (what the ring still holds) then go live; returns the first offset sent.

        A listener attached already is replaced (its socket is told and closed by its handler).
        """
        if self._done:
            raise SandboxNotFoundError(f"command {self.id} has ended and was forgotten")
        self._cancel_grace()
        async with self._lock:
            previous, self._listener = self._listener, listener
            if previous is not None and previous is not listener:
                with contextlib.suppress(Exception):
                    await previous.send_final(
                        {"type": "detached", "message": "another client attached to this command"}
                    )
            first = max(offset, self.start_offset)
            frames = []
            for start, stream_id, data in self._ring:
                end = start + len(data)
                if end <= first:
                    continue
                piece = data[first - start :] if start < first else data
                frames.append(listener.send_output(stream_id, piece))
        for frame in frames:
            await frame
        if self.final is not None and self._listener is listener:
            await listener.send_final(self.final)
            await self.finish()
        return first

    def detach(self, listener: Listener) -> None:
        """The listener's socket closed: the command runs on for the grace time."""
        if self._listener is listener:
            self._lost(listener)

    def _lost(self, listener: Listener) -> None:
        if self._listener is listener:
            self._listener = None
            self._in_flight = None
            self._arm_grace()

    def _arm_grace(self) -> None:
        if self._done or self._listener is not None:
            return
        self._cancel_grace()
        if self._grace_seconds <= 0:
            self._finish_soon()
        else:
            self._grace = asyncio.get_running_loop().call_later(self._grace_seconds, self._finish_soon)

    def _finish_soon(self) -> None:
        task = asyncio.ensure_future(self.finish())
        _finishing.add(task)
        task.add_done_callback(_finishing.discard)

    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    async def write(self, data: bytes) -> None:
        await self.handle.write(data)

    async def finish(self) -> None:
        """Kill the command (if it still runs), release its handle, forget it. Idempotent.

        An attached client still gets the final message (the pump delivers it).
        """
        if self._done:
            return
        self._done = True
        self._cancel_grace()
        with contextlib.suppress(SandboxError):
            await self.handle.kill()
        if asyncio.current_task() is not self._pump and not self._pump.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._pump), 10)
        self._listener = None
        self._on_done(self)


class ExecRegistry:
    """The live interactive commands of this server, by exec id."""

    def __init__(
        self, *, ring_bytes: int, grace_seconds: float, max_per_user: int = 0, max_per_session: int = 0
    ) -> None:
        self.ring_bytes = ring_bytes
        self.grace_seconds = grace_seconds
        self.max_per_user = max_per_user
        self.max_per_session = max_per_session
        self._execs: dict[str, LiveExec] = {}
        self._starting: collections.Counter[tuple[str, str]] = collections.Counter()  # (owner, session) -> starts

    def __len__(self) -> int:
        return len(self._execs)

    def check_room(self, owner: str, session_id: str) -> None:
        """Refuse (SandboxQuotaError, 429) a command past the per-user or per-session cap.

        Every command the registry holds counts, attached or detached, running or kept for a
        reattach after its exit: each pins its output ring and its handle until it is forgotten.
        """
        by_user = sum(1 for live in self._execs.values() if live.owner == owner)
        by_user += sum(n for (who, _), n in self._starting.items() if who == owner)
        if self.max_per_user and by_user >= self.max_per_user:
            raise SandboxQuotaError(
                f"{owner!r} already holds {by_user} interactive commands (detached ones included), the most one "
                f"user may hold (SandboxApp.max_live_commands_per_user = {self.max_per_user}): end or kill one "
                "first (a detached command is forgotten SandboxApp.detach_grace_seconds after its last client left)"
            )
        in_session = sum(1 for live in self._execs.values() if live.session_id == session_id)
        in_session += sum(n for (_, sid), n in self._starting.items() if sid == session_id)
        if self.max_per_session and in_session >= self.max_per_session:
            raise SandboxQuotaError(
                f"session {session_id!r} already holds {in_session} interactive commands (detached ones "
                f"included), the most one session may hold (SandboxApp.max_live_commands_per_session = "
                f"{self.max_per_session}): end or kill one first"
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

    def add(
        self,
        handle: ExecHandle,
        *,
        session_id: str,
        owner: str,
        argv: tuple[str, ...],
        pty: bool,
    ) -> LiveExec:
        live = LiveExec(
            handle,
            session_id=session_id,
            owner=owner,
            argv=argv,
            pty=pty,
            ring_bytes=self.ring_bytes,
            grace_seconds=self.grace_seconds,
            on_done=lambda done: self._execs.pop(done.id, None),
        )
        self._execs[live.id] = live
        return live

    def get(self, exec_id: str, caller: Caller, session_id: str | None = None) -> LiveExec:
        """The caller's command (any, for an admin); 404 exactly like an unknown id otherwise."""
        live = self._execs.get(exec_id)
        if (
            live is None
            or (session_id is not None and live.session_id != session_id)
            or not (live.owner == caller.name or caller.manages_all)
        ):
            raise SandboxNotFoundError(f"no running command {exec_id!r} in this session")
        return live

    def list(self, session_id: str, caller: Caller) -> list[LiveExec]:
        return [
            live
            for live in self._execs.values()
            if live.session_id == session_id and (live.owner == caller.name or caller.sees_all)
        ]

    async def close(self) -> None:
        """Kill every command (server shutdown)."""
        for live in list(self._execs.values()):
            await live.finish()
