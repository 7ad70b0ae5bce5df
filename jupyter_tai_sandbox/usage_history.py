"""The recent resource use of the sessions (CPU, memory, disk), sampled on the server while someone looks.

``GET /api/sandbox/usage`` (server/usage_handlers.py) answers, in one request, the last samples of every
session the caller may see, from the history here; the panel draws them as sparklines. The history is a
bounded ring per session (:attr:`UsageHistory.samples_kept`), filled by one sampler task that runs only
while someone asked within :attr:`UsageHistory.idle_seconds`: every :attr:`UsageHistory.interval_seconds`
it lists the sessions (one call), measures those of the owners who asked (each session's
:meth:`~jupyter_tai_sandbox.contract.SandboxSession.usage`, at most :attr:`UsageHistory.concurrency` at once,
each under :attr:`UsageHistory.measure_timeout_seconds`), and forgets the sessions that are gone. A request
never measures anything itself: however many panels refresh, a session is measured once a round.

A sample: ``time`` (when it was measured, epoch seconds), ``cpu`` (the fraction of one core used since the
sample before: 0.5 is half a core; null for the first, or where the provider cannot attribute CPU),
``cpu_seconds``, ``memory_bytes``, ``memory_limit_bytes``, ``disk_bytes``, ``disk_partial`` (as
``usage()`` gives them, null where not measured). A paused session is not measured (its figures would not
move, and a frozen container cannot run the disk measure).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Iterable
from typing import Any

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from . import labels
from .contract import SandboxError, SandboxNotFoundError, SandboxSession, SessionInfo
from .fair_share import act_for

__all__ = ["ALL", "UsageHistory", "serves"]

#: the interest of an admin who asked for every user's sessions (no user name is None)
ALL = None
#: the fields of a sample that come from a usage record as they are
_COPIED = ("cpu_seconds", "memory_bytes", "memory_limit_bytes", "disk_bytes", "disk_partial")


def serves(consumer: str) -> dict[str, str]:
    """What a session serves, from its consumer label: ``{"kind": "kernel", "name": ID}`` (a sandboxed
    kernel), ``agent`` (a coding agent's persona key), ``magics`` (a ``%sandbox`` session's name), ``tool``,
    ``user``; a label under a user's (``user:NAME/kernel:ID``, as the remote provider gives its kernels) is
    read by its last part."""
    last = consumer.rsplit("/", 1)[-1] if "/" in consumer else consumer
    kind, sep, name = last.partition(":")
    if sep and kind == "magics":
        return {"kind": "magics", "name": name.split("@", 1)[0]}
    if sep and labels.kind_of(last) is not None:
        return {"kind": kind, "name": name}
    whole = labels.kind_of(consumer)
    return {"kind": whole or "other", "name": consumer.partition(":")[2] if whole else consumer}


class UsageHistory(LoggingConfigurable):
    """The sessions' recent usage samples and the sampler that takes them (one per server)."""

    interval_seconds = Float(
        5.0,
        help="""Seconds between two rounds of the usage sampler (each measures every session of the users
        who look, once); the panel's sparklines move at this pace. At least 1.""",
    ).tag(config=True)

    samples_kept = Integer(
        60,
        help="""Samples kept per session (a ring: the oldest goes first); with the default interval, 60 are
        the last 5 minutes. At least 2.""",
    ).tag(config=True)

    idle_seconds = Float(
        30.0,
        help="""The sampler stops when nobody asked for usage (GET /api/sandbox/usage) within this many
        seconds, and starts again at the next request; a user's sessions are measured only while that user
        (or an admin asking for every user's) looks.""",
    ).tag(config=True)

    concurrency = Integer(
        4,
        help="How many sessions the usage sampler measures at once (the rest wait their turn in the round).",
    ).tag(config=True)

    measure_timeout_seconds = Float(
        10.0,
        help="""Seconds one session's measure may take; past it the round goes on without its sample (a
        provider's own measure is bounded too: docker's disk measure gives up after 3 s).""",
    ).tag(config=True)

    def __init__(self, access: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: the server's own sandbox (SandboxApp.access: ``require()`` is its gate)
        self.access = access
        #: session id -> its last samples, oldest first
        self._rings: dict[str, collections.deque[dict[str, Any]]] = {}
        #: session id -> its info as the last round's listing gave it
        self._infos: dict[str, SessionInfo] = {}
        #: session id -> its last usage record (the provider's note included)
        self._last: dict[str, dict[str, Any]] = {}
        #: session id -> the session object, kept across rounds (no look-up per round)
        self._sessions: dict[str, SandboxSession] = {}
        #: owner name (or ALL) -> when (monotonic) they last asked
        self._asked: dict[str | None, float] = {}
        self._task: asyncio.Task[None] | None = None
        #: set when a round ends (a new one for the next round); _wake cuts the sampler's wait short
        self._round_done: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        #: rounds started and ended, measures taken (for tests and the curious)
        self.rounds_started = 0
        self.rounds = 0
        self.measures = 0
        self._stopped = False

    # ------------------------------------------------------------ asking

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def interval(self) -> float:
        return max(1.0, float(self.interval_seconds))

    async def ask(self, owner: str, *, everyone: bool = False, wait_seconds: float | None = None) -> None:
        """``owner`` looks at their sessions' usage now (``everyone``: an admin at every user's): the sampler
        runs (started when it was not) and measures their sessions from its next round on. When it was not
        measuring for this interest yet, waits for that round (at most ``wait_seconds``, default
        :attr:`measure_timeout_seconds` or one interval, the longer), so a first request already answers a
        sample."""
        key = ALL if everyone else owner
        now = time.monotonic()
        new = key not in self._asked or self._stale(self._asked[key], now)
        self._asked[key] = now
        if self._stopped:
            return
        if not self.running:
            self._round_done, self._wake = asyncio.Event(), asyncio.Event()
            self._task = asyncio.create_task(self._sample_forever(), name="jupyter-tai-sandbox usage sampler")
            new = True
        elif new and self._wake is not None:
            self._wake.set()  # the round for this interest starts now, not at the end of the interval
        if new:
            target = self.rounds_started + 1  # the round after this moment is the first that includes it
            if wait_seconds is None:
                wait_seconds = max(self.interval, float(self.measure_timeout_seconds))
            await self._rounds_reach(target, wait_seconds)

    async def _rounds_reach(self, target: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.rounds < target and self.running:
            done = self._round_done
            left = deadline - time.monotonic()
            if done is None or left <= 0:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), left)

    def answer(self, owner: str | None) -> dict[str, Any]:
        """The history of ``owner``'s sessions (None: every session's), as GET /api/sandbox/usage answers it."""
        sessions: list[dict[str, Any]] = []
        for session_id, info in sorted(self._infos.items()):
            if owner is not None and info.owner != owner:
                continue
            last = self._last.get(session_id)
            sessions.append(
                {
                    "id": session_id,
                    "owner": info.owner,
                    "consumer": info.consumer,
                    "serves": serves(info.consumer),
                    "paused": info.paused,
                    "samples": list(self._rings.get(session_id, ())),
                    "last": last,
                }
            )
        return {
            "interval_seconds": self.interval,
            "samples_kept": self._kept(),
            "sampling": self.running,
            "sessions": sessions,
        }

    # ------------------------------------------------------------ the sampler

    def _kept(self) -> int:
        return max(2, int(self.samples_kept))

    def _stale(self, asked: float, now: float) -> bool:
        return now - asked > max(self.interval, float(self.idle_seconds))

    async def _sample_forever(self) -> None:
        try:
            while True:
                now = time.monotonic()
                for key, asked in list(self._asked.items()):
                    if self._stale(asked, now):
                        del self._asked[key]
                if not self._asked:
                    return  # nobody looks: stop (the next request starts it again)
                started = time.monotonic()
                self.rounds_started += 1
                if self._wake is not None:
                    self._wake.clear()
                try:
                    await self.sample_once(set(self._asked))
                except Exception as e:  # one bad round never ends the history (logged, tried again)
                    self.log.warning("jupyter_tai_sandbox: a usage round failed: %s", e)
                finally:
                    self.rounds += 1
                    done, self._round_done = self._round_done, asyncio.Event()
                    if done is not None:
                        done.set()
                if self._wake is not None:
                    with contextlib.suppress(asyncio.TimeoutError):
                        left = self.interval - (time.monotonic() - started)
                        await asyncio.wait_for(self._wake.wait(), max(0.0, left))
        finally:
            if self._round_done is not None:
                self._round_done.set()  # nobody waits for a round that will not come

    async def sample_once(self, interests: Iterable[str | None]) -> None:
        """One round: list the sessions, forget those gone, measure those of ``interests`` (owners, or ALL)."""
        wanted = set(interests)
        if self.access is None:
            return
        try:
            sandbox = self.access.require()
        except SandboxError:
            self._forget_all()
            return
        infos = {info.id: info for info in await sandbox.list()}
        for gone in set(self._infos) | set(self._rings) | set(self._sessions):
            if gone not in infos:
                self._forget(gone)
        self._infos = infos
        chosen = [
            info for info in infos.values() if (ALL in wanted or info.owner in wanted) and not info.paused
        ]
        if not chosen:
            return
        room = asyncio.Semaphore(max(1, int(self.concurrency)))

        async def measure(info: SessionInfo) -> None:
            async with room:
                act_for(info.owner)  # the provider's work counts against the owner's share
                try:
                    record = await asyncio.wait_for(
                        self._measure(sandbox, info.id), max(0.1, float(self.measure_timeout_seconds))
                    )
                except SandboxNotFoundError:
                    self._forget(info.id)
                    self._infos.pop(info.id, None)
                    return
                except (TimeoutError, SandboxError) as e:
                    self.log.debug("jupyter_tai_sandbox: usage of %s not measured: %s", info.id, e)
                    self._sessions.pop(info.id, None)  # looked up afresh next round (a lost connection)
                    return
                self._record(info.id, record)

        await asyncio.gather(*(measure(info) for info in chosen))

    async def _measure(self, sandbox: Any, session_id: str) -> dict[str, Any]:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = await sandbox.get(session_id)
        self.measures += 1
        return dict(await session.usage() or {})

    def _record(self, session_id: str, record: dict[str, Any]) -> None:
        """A measure's sample appended to the session's ring (CPU as the fraction of a core since the last)."""
        if session_id not in self._infos:
            return  # gone while it was measured
        self._last[session_id] = record
        at = record.get("measured_at")
        sample: dict[str, Any] = {"time": at if isinstance(at, (int, float)) else time.time()}
        for name in _COPIED:
            sample[name] = record.get(name)
        ring = self._rings.get(session_id)
        if ring is None or ring.maxlen != self._kept():
            ring = self._rings[session_id] = collections.deque(ring or (), maxlen=self._kept())
        sample["cpu"] = _cpu_fraction(ring[-1] if ring else None, sample)
        ring.append(sample)

    def _forget(self, session_id: str) -> None:
        self._rings.pop(session_id, None)
        self._last.pop(session_id, None)
        self._sessions.pop(session_id, None)

    def _forget_all(self) -> None:
        self._rings.clear()
        self._last.clear()
        self._sessions.clear()
        self._infos.clear()

    async def stop(self) -> None:
        """The server stops: the sampler ends and no request starts it again."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._forget_all()


def _cpu_fraction(before: dict[str, Any] | None, now: dict[str, Any]) -> float | None:
    """CPU used between two samples, as a fraction of one core (None when either lacks CPU time)."""
    if before is None:
        return None
    a, b = before.get("cpu_seconds"), now.get("cpu_seconds")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    elapsed = now["time"] - before["time"]
    if elapsed <= 0 or b < a:  # a restarted container counts from zero again
        return None
    return round((b - a) / elapsed, 4)
