"""The vm provider's warm pool: guests restored from their golden and set up ahead of the creates that take them.

Under TCG a create restored from a golden still waits for a new QEMU to translate the guest's code again
(the agent, the kernel's paths for a command), a few hundred milliseconds; a pooled guest did all of it
before any session asked. The pool holds ``VmSandbox.pool_size`` guests of one shape, the default spec's on
network ``none`` (default memory and vCPUs, the package's own guest, ephemeral, no egress policy): each
restored in a folder named for the session it will serve, its workspace mounted for the provider's user
and one command run as that user (its code translated), then its agent connection closed. A create of that
shape *claims* one: it writes the session's record (its labels, env and end) into the guest's folder, and
the session's first command opens the connection whose handshake gives the guest the host's clock and a
fresh seed for its RNG, as for any restored guest. Anything else (another shape, an image, a network, an
egress policy, a persistent workspace) creates as before, and so does a create that finds the pool empty.

A waiting guest's record says it is a pool's (``pool``: its keeper, ``host:pid:token``), never a session's:
no server lists, gets or reaps it as one. The pool refills in the background, one guest at a time, a moment
after a claim (the claimed session's first command goes undisturbed); after ``pool_idle_seconds`` without a
claim it stops its guests and stays empty until a create of its shape asks again; close() stops them. A
server that dies leaves its guests running (they are daemons, like sessions): any server's reap of the
deployment stops a pool guest whose keeper is gone from this host, or that waited past its record's end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ...contract import SandboxError
from ..docker.pool import new_owner, owner_gone
from .guest.qemu import VmError

#: pause after a claim before the refill starts, so the claimed session's first commands go undisturbed
REFILL_DELAY_SECONDS = 0.5
#: a guest this close to its idle end is not handed out (another server's reap may be stopping it)
HANDOUT_MARGIN_SECONDS = 30.0
#: failed starts in a row after which the pool waits for the next create of its shape to try again
MAX_FAILURES = 3

__all__ = ["POOL_KEY", "Pooled", "VmPool", "owner_gone"]

#: the record's key that makes a guest a pool's (its value: the keeper), not a session's
POOL_KEY = "pool"


@dataclass(frozen=True)
class Pooled:
    """A guest waiting in the pool."""

    session_id: str  # its folder's name: the session it will serve
    made: float  # time.monotonic() when it was ready
    key: Hashable  # what it serves (shape, user, workspace size): a claim takes only its own key's
    record: dict[str, Any]  # its record as the pool wrote it (shape, user, golden)


class VmPool:
    """Ready guests of one key, handed out once each, refilled in the background, emptied when unused."""

    def __init__(
        self,
        *,
        size: int,
        idle_seconds: float,
        start: Callable[[str], Awaitable[Pooled]],
        stop: Callable[[str], Awaitable[None]],
        running: Callable[[str], bool],
        log: Any,
    ) -> None:
        self.size = size
        self.idle_seconds = idle_seconds
        self._start = start  # (keeper) -> a ready guest
        self._stop = stop
        self._running = running
        self._log = log
        self.owner = new_owner()
        self._ready: collections.deque[Pooled] = collections.deque()
        self._last_use = time.monotonic()
        self._keeper: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._claimed = False
        self._dormant = False
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()

    def ready_count(self) -> int:
        return len(self._ready)

    def holds(self, session_id: str) -> bool:
        """Whether ``session_id`` is a guest waiting in this pool."""
        return any(p.session_id == session_id for p in self._ready)

    def start(self) -> None:
        """Start keeping the pool filled (again: after it idled out, or on another event loop)."""
        if self.size <= 0 or self._closing:
            return
        self._last_use = time.monotonic()
        self._dormant = False
        loop = asyncio.get_running_loop()
        if self._keeper is None or self._keeper.done() or self._keeper.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._keeper = loop.create_task(self._keep())
        elif self._wake is not None:
            self._wake.set()

    def take(self, key: Hashable) -> Pooled | None:
        """The oldest ready guest of ``key`` whose QEMU runs; None when none is. Counts as the pool's use (an
        idle pool fills again) and schedules a refill."""
        now = time.monotonic()
        found = None
        for pooled in list(self._ready):
            stale = now - pooled.made > self.idle_seconds - min(HANDOUT_MARGIN_SECONDS, self.idle_seconds / 4)
            if pooled.key != key or stale or not self._running(pooled.session_id):
                self._ready.remove(pooled)  # the settings changed, it waited too long, or its QEMU died
                self._spawn(self._stop(pooled.session_id))
            elif found is None:
                found = pooled
        if found is not None:
            self._ready.remove(found)
        self._claimed = True
        self.start()
        return found

    async def full(self, timeout: float = 120.0) -> None:
        """Wait until the pool holds ``size`` guests (a benchmark's or a test's warm start)."""
        self.start()
        async with asyncio.timeout(timeout):
            while len(self._ready) < self.size:
                if self._keeper is not None and self._keeper.done():
                    self._keeper.result()  # its failure, if any
                    self.start()
                await asyncio.sleep(0.05)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _keep(self) -> None:
        failures = 0
        asked = True  # started by a create (or a warm start): the idle time counts from the filled pool
        while not self._closing:
            assert self._wake is not None
            self._wake.clear()  # a take from now on wakes the wait below
            while (
                not self._closing
                and not self._dormant
                and failures < MAX_FAILURES
                and len(self._ready) < self.size
            ):
                try:
                    pooled = await self._start(self.owner)
                except (SandboxError, VmError, OSError) as e:
                    failures += 1
                    self._log.warning("sandbox-vm: the warm pool could not start a guest: %s", e)
                    await asyncio.sleep(0.5 * failures)
                    continue
                if self._closing:
                    await self._stop(pooled.session_id)
                    return
                failures = 0
                self._ready.append(pooled)
            now = time.monotonic()
            if asked:
                self._last_use, asked = max(self._last_use, now), False
            idle_end = self._last_use + self.idle_seconds
            if not self._dormant and now >= idle_end:  # no claim for pool_idle_seconds: empty until asked
                if await self._drain():
                    self._log.info("sandbox-vm: the warm pool idled out: its guests are stopped")
                self._dormant = True
            stale = [p for p in self._ready if now - p.made >= self.idle_seconds]
            for pooled in stale:  # waited too long unclaimed: replaced (its record's end is near)
                self._ready.remove(pooled)
                await self._stop(pooled.session_id)
            if stale:
                continue
            ends = [] if self._dormant else [idle_end, *(p.made + self.idle_seconds for p in self._ready)]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, min(ends) - now) + 0.01 if ends else None):
                    await self._wake.wait()
                    failures, asked = 0, True  # a create asked: fill (and try) again
            if self._claimed:  # the claimed session's first commands go first
                self._claimed = False
                await asyncio.sleep(REFILL_DELAY_SECONDS)

    async def _drain(self) -> int:
        """Stop every waiting guest; how many there were."""
        waiting = list(self._ready)
        self._ready.clear()
        await asyncio.gather(*(self._stop(p.session_id) for p in waiting), return_exceptions=True)
        return len(waiting)

    async def close(self) -> None:
        """Stop refilling and stop every guest waiting in the pool (one being started too)."""
        self._closing = True
        keeper, self._keeper = self._keeper, None
        if keeper is not None and not keeper.done() and keeper.get_loop() is asyncio.get_running_loop():
            keeper.cancel()  # a start under way stops its own guest
            with contextlib.suppress(BaseException):
                await keeper
        await self._drain()
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    @staticmethod
    def abandoned(record: dict[str, Any], now: float) -> bool:
        """Whether a pool guest's record (another keeper's) is one to stop: its keeper is gone from this
        host, or it waited past its end."""
        try:
            until = float(record.get("pool_until") or 0)
        except (TypeError, ValueError):
            until = 0.0
        return owner_gone(str(record.get(POOL_KEY) or "")) or until <= now
