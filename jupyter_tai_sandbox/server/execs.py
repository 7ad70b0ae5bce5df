"""The server's live commands: one registry, read by push (the exec websocket) or by pull (MCP polls).

Every command started over the exec websocket (``start``) or MCP (``session_exec_start``)
becomes a :class:`~.live_command.LiveCommand` (its pump, its output ring, its push and pull
faces and the one grace policy: live_command.py) in the app's :class:`LiveCommands`, under the
:class:`~.ticket.Ticket` it was given before it started. One cap per user and per session counts
the commands of both doors; an ended command kept for its readers gives its place to a new one.
Only the owner (or an admin) may see, attach, poll or kill; another user's command answers like
an unknown id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..contract import ExecHandle, ExecRequest, SandboxError, SandboxNotFoundError, SandboxSession
from ..errors import SandboxQuotaError, SandboxSessionGoneError
from ..sessions import Caller
from .live_command import STREAM_IDS, Listener, LiveCommand, LiveCommandPolicy
from .output_ring import STREAMS, OutputRing
from .ticket import DOORS, LABEL_VERSION, Door, Ticket

#: how long a look-up of an unknown command waits for the start's adoption of held commands
ADOPT_WAIT_SECONDS = 30.0
#: sessions this server saw end (reaped or destroyed), remembered for their commands' and clients' messages
GONE_REMEMBERED = 512
#: how long a command that ended in an error waits to learn whether its session is gone
GONE_CHECK_SECONDS = 5.0

__all__ = [
    "ADOPT_WAIT_SECONDS",
    "DOORS",
    "LABEL_VERSION",
    "STREAMS",
    "STREAM_IDS",
    "Door",
    "Listener",
    "LiveCommand",
    "LiveCommandPolicy",
    "LiveCommands",
    "OutputRing",
    "Ticket",
]


class LiveCommands:
    """The live commands of one server, by id: both doors, one policy, one cap per user and per session."""

    def __init__(self, policy: LiveCommandPolicy, *, log: logging.Logger | None = None) -> None:
        self.policy = policy
        self.log = log or logging.getLogger("jupyter_tai_sandbox")
        self._commands: dict[str, LiveCommand] = {}
        self._starting: collections.Counter[tuple[str, str]] = (
            collections.Counter()
        )  # (owner, session) -> starts
        #: tasks started from timers, referenced until done
        self._tasks: set[asyncio.Future[None]] = set()
        self._adopting: dict[str, asyncio.Lock] = {}
        self._adopted: asyncio.Future[None] | None = None
        #: session id -> why it is gone (reaped at its TTL, destroyed) and who may be told, newest last
        self._gone: collections.OrderedDict[str, tuple[SandboxSessionGoneError, set[str]]] = (
            collections.OrderedDict()
        )

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
            c
            for c in self._commands.values()
            if (owner is None or c.owner == owner) and (session_id is None or c.session_id == session_id)
        ]

    @staticmethod
    def _make_room(held: list[LiveCommand], starting: int, cap: int) -> int:
        """Forget the oldest ended, unwatched commands of ``held`` until one more fits under ``cap``;
        the count held and starting after that."""
        count = len(held) + starting
        if not cap or count < cap:
            return count
        ended = sorted(
            (c for c in held if not c.running and not c.attached and not c.pollers),
            key=lambda c: c.ended_at or 0.0,
        )
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
            id="exe-" + secrets.token_hex(8),
            session_id=session_id,
            owner=owner,
            argv=tuple(request.argv),  # a tuple already (ExecRequest holds one): typed as one here
            pty=request.pty,
            door=door,
            started_at=now,
            deadline=now + request.timeout_seconds,
        )

    def add(
        self,
        handle: ExecHandle,
        ticket: Ticket,
        *,
        listener: Listener | None = None,
        session: SandboxSession | None = None,
    ) -> LiveCommand:
        """A command just started. ``listener``: its reader from the first byte (the websocket that started it);
        attached later, it would get only what the ring still held. ``session``: where it runs (asked, when the
        command ends in an error, whether the session is gone)."""
        command = LiveCommand(handle, ticket, registry=self, listener=listener, session=session)
        self._commands[command.id] = command
        return command

    # ------------------------------------------- commands a session held for us

    async def adopt(
        self,
        session: SandboxSession,
        *,
        take_over: str | None = None,
        caller: Caller | None = None,
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
                    ticket.id == take_over
                    and caller is not None
                    and (ticket.owner == caller.name or caller.manages_all)
                ):
                    continue  # another server reads it: only its owner (or an admin) may take it over
                offsets = {stream: span[0] for stream, span in command.offsets.items() if stream in STREAMS}
                try:
                    handle = await session.attach_command(command.id, offsets)
                except SandboxError as e:
                    self.log.warning(
                        "jupyter_tai_sandbox: adopting %s of %s failed: %s", ticket.id, session.id, e
                    )
                    continue
                self._commands[ticket.id] = LiveCommand(
                    handle,
                    ticket,
                    registry=self,
                    stream_starts=offsets,
                    adopted=True,
                    session=session,
                )
                self.log.info(
                    "jupyter_tai_sandbox: adopted live command %s of %s (%s) from a previous server",
                    ticket.id,
                    session.id,
                    ticket.owner,
                )

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

    async def find(
        self, command_id: Any, caller: Caller, session: SandboxSession | None = None
    ) -> LiveCommand:
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
                    listed.append(
                        {
                            "id": ticket.id,
                            "session_id": session.id,
                            "argv": list(ticket.argv),
                            "pty": ticket.pty,
                            "started": ticket.started_at,
                            "owner": ticket.owner,
                            "door": ticket.door,
                            "attached": command.attached,
                            "running": command.running,
                            "offset": sum(end for _, end in command.offsets.values()),
                            "elsewhere": True,
                        }
                    )
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
            c
            for c in self._commands.values()
            if c.session_id == session_id and (c.owner == caller.name or caller.sees_all)
        ]

    # ------------------------------------------------ sessions that end under their commands

    def mark_gone(
        self, session_id: str, reason: str = "destroyed", *, by: str | None = None
    ) -> SandboxSessionGoneError:
        """Remember that the session is ending (``ttl``: reaped; ``destroyed``): its commands, which end as it
        goes, say so instead of the transport's error. Call it before the destroy. Told later only to whom it
        concerns (``by``, who destroyed it, and the owners of its commands): to anyone else a gone session
        answers as an unknown id does."""
        known = self._gone.get(session_id)
        gone = known[0] if known is not None else SandboxSessionGoneError(session_id, reason)
        told = known[1] if known is not None else set()
        told.update(c.owner for c in self._held(session_id=session_id))
        if by is not None:
            told.add(by)
        self._gone[session_id] = (gone, told)
        self._gone.move_to_end(session_id)
        while len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)
        return gone

    def unmark_gone(self, session_id: str) -> None:
        """The destroy failed: the session lives on."""
        self._gone.pop(session_id, None)

    def gone(self, session_id: str, caller: Caller | None = None) -> SandboxSessionGoneError | None:
        """Why the session is gone, when this server saw it end (with ``caller``: only when it concerns them)."""
        known = self._gone.get(session_id)
        if known is None:
            return None
        gone, told = known
        if caller is not None and not (caller.name in told or caller.manages_all):
            return None
        return gone

    async def why_gone(self, command: LiveCommand) -> SandboxSessionGoneError | None:
        """Whether the command ended because its session is gone, and why: as recorded here, else as its
        session says (no longer there, or past its end: reaped by any server of the deployment)."""
        known = self.gone(command.session_id)
        if known is not None or command.session is None:
            return known
        session = command.session
        for attempt in range(3):
            if attempt:
                await asyncio.sleep(0.3)  # a container being removed is still found for a moment
            try:
                info = await asyncio.wait_for(session.info(), GONE_CHECK_SECONDS)
            except SandboxNotFoundError:
                expires_at = _last_known_end(session) or command.session_end
                ended_by_ttl = expires_at is not None and expires_at <= time.time() + 1
                return self.mark_gone(command.session_id, "ttl" if ended_by_ttl else "destroyed")
            except (TimeoutError, SandboxError):
                return None
            command.session_end = info.expires_at
            if info.expires_at <= time.time():
                return self.mark_gone(command.session_id, "ttl")
        return None

    async def end_session(self, session_id: str, reason: str = "destroyed") -> None:
        """The session is gone: its commands still running are stopped, and their readers told why."""
        gone = self.mark_gone(session_id, reason)
        self._adopting.pop(session_id, None)
        await asyncio.gather(
            *(c.kill(gone.to_json()) for c in self._held(session_id=session_id) if c.running)
        )

    async def kill_session(self, session_id: str) -> None:
        """Kill every running command of a session (it is being destroyed)."""
        await self.end_session(session_id, "destroyed")

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


def _last_known_end(session: SandboxSession) -> float | None:
    """The session's end as its object last knew it (a destroyed one cannot be asked)."""
    end = getattr(session, "expires_at", None)  # the providers' sessions keep it (a gated one passes it on)
    if isinstance(end, (int, float)) and not isinstance(end, bool):
        return float(end)
    with contextlib.suppress(Exception):
        info = session.known_info()
        if info is not None:
            return info.expires_at
    return None
