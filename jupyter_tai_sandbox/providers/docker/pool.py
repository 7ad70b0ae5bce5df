"""The docker provider's warm pool: pre-started containers for the default spec.

A pooled container is started like a default session's container (the
provider's image, an anonymous workspace volume, the default limits, no spec
env) and named ``tai-<session id>`` for the session it will serve, but carries
the pool label instead of a session's, so it is never listed as a session. It
waits on the deployment's holding network (internal, reaching nothing), and a
claim moves it to its session owner's egress network (see
``PoolNetworks.claim`` in ``pool_networks``); or, as an owner's *spare*, on the egress
network of an owner who took from the pool lately, for that owner's next
create only (no network to join at the claim: the create is one volume
away from done). At most one spare per owner and ``size // 2`` in all wait
this way, so other owners still find containers on the holding network. At
hand-out the pool *claims* a container for its session: the session's
identity goes into a *record*, a small labelled volume ``tai-rec-<session
id>`` that names the container (labels cannot change on a running
container). The session's spec env is passed to each exec and kept
on the record volume (a label, :data:`LABEL_POOLED_ENV`) for a restarted
server: never in the container, whose files the session can write, so no
server state is read back from anything a session controls (the label is as
visible to engine users as a container's own env is). A claimed container is
never handed out again: it goes with its session.

The pool refills in the background, up to :data:`FILL_STARTS` containers
starting at once (waiting and starting never more than ``size`` together), after
a short pause; while claims are under way only one start runs, so a burst of
creates and their first commands do not compete with container starts.
Containers waiting longer than ``idle_seconds`` are replaced; any provider's
reap removes an unclaimed pooled container past that age, or at once when its
owner (a process on this host) is gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from ...contract import SandboxError, SandboxNotFoundError, session_gone
from ...metrics.hooks import pool_take
from .._common import new_session_id
from ..docker_engine import DockerEngine
from ..docker_engine.names import (
    LABEL,
    LABEL_CREATED,
    LABEL_EXPIRES,
    LABEL_POOL,
    LABEL_RECORD,
    LABEL_SESSION,
    RECORD_PREFIX,
)

#: a pooled container this close to its idle limit is not handed out (another reap may take it)
HANDOUT_MARGIN_SECONDS = 60.0
#: pause before a refill starts, so the session just handed out runs its first command undisturbed
REFILL_DELAY_SECONDS = 0.25
#: an owner who took from the pool this recently gets a spare on their own network
SPARE_FOR_SECONDS = 600.0
#: pooled containers a refill starts at once (one only while claims are under way)
FILL_STARTS = 4
#: failed starts after which a refill gives up (the next hand-out tries again)
FILL_FAILURES = 3

#: on a pooled session's record volume: the session's spec env, as JSON (the session cannot touch it)
LABEL_POOLED_ENV = f"{LABEL}.env"

#: starts a default-spec container: (name, container labels, anonymous volume labels, network: '' for the
#: holding one) -> (container id, the session user it was started for)
Starter = Callable[[str, dict[str, str], dict[str, str], str], Awaitable[tuple[str, str]]]


def new_owner() -> str:
    """``host:pid:token``: who keeps a pooled container (so a reap can tell a dead owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def owner_gone(owner: str) -> bool:
    """True when ``owner`` was a process on this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class PoolSettings(LoggingConfigurable):
    """The warm pool's settings (a docker provider's)."""

    pool_size = Integer(
        0,
        help="""Warm pool: how many pre-started containers wait for sessions of the default spec (the
        default image, ephemeral, egress network, the default cpu/memory limits; any env, which is then
        given to each command). A create takes one instead of starting a container, and the pool refills
        in the background. A pooled container serves one session only. With 2 or more, an owner who took
        from the pool in the last 10 minutes gets a spare waiting on their own egress network (at most
        pool_size // 2 spares), so their next create joins no network. At most what the pool's holding
        network holds (253 at the default network_prefix; a larger value keeps that many, with a warning).
        0 turns the pool off.""",
    ).tag(config=True)

    pool_idle_seconds = Float(
        3600.0,
        help="""Longest a pooled container waits unclaimed: older ones are replaced, and any provider's
        reap removes an unclaimed pooled container past this age (at once when its owning process on this
        host is gone). close() removes the pool's containers.""",
    ).tag(config=True)


@dataclass(frozen=True)
class Ready:
    """A pooled container waiting for its session."""

    container_id: str
    session_id: str  # the container is named for it
    created: float
    user: str  # the session user it was started for (its image's USER, read then)
    network: str = ""  # an owner's egress network (a spare for that owner), or '' for the holding network


@dataclass(frozen=True)
class PooledSession:
    """A session living in a pooled container, as its record volume tells it."""

    session_id: str
    container_id: str
    record: str
    labels: Mapping[str, str]
    env: Mapping[str, str]


class WarmPool:
    """Ready containers, handed out once each and refilled in the background; and the records of the
    sessions living in pooled containers."""

    def __init__(
        self,
        engine: DockerEngine,
        start: Starter,
        *,
        size: int,
        idle_seconds: float,
        labels: Mapping[str, str],
        log: Any,
        fill_starts: int = FILL_STARTS,
    ) -> None:
        self._engine = engine
        self._start = start
        self.size = size
        #: containers a refill starts at once while no claim is under way
        self.fill_starts = max(1, fill_starts)
        self.idle_seconds = idle_seconds
        self._labels = dict(labels)
        self._log = log
        self.owner = new_owner()
        self._ready: collections.deque[Ready] = collections.deque()
        #: owner networks that took from the pool -> when they last did (who gets a spare)
        self._takers: dict[str, float] = {}
        #: every owner network that took from the pool: kept for a spare, so close() offers each for removal
        self.kept_networks: set[str] = set()
        self._filler: asyncio.Task[None] | None = None
        self._closing = False
        #: starts under way, by the network each will wait on ('' for the holding one)
        self._starting: collections.Counter[str] = collections.Counter()
        #: the refill's failed starts so far
        self._failures = 0
        #: claims under way, and the event set when none is (the refill's extra starts wait for it)
        self._claims = 0
        self._no_claims: asyncio.Event | None = None
        #: spec env of the pooled sessions this pool handed out (others read it from the container)
        self._env: dict[str, dict[str, str]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # -------------------------------------------------------------- filling

    def ready_count(self) -> int:
        return len(self._ready)

    def starting_count(self) -> int:
        """Pooled containers starting now."""
        return sum(self._starting.values())

    def busy_on(self, network: str) -> bool:
        """Whether a pooled container waits, or is starting, on ``network`` ('' for the holding one)."""
        return self._starting[network] > 0 or any(r.network == network for r in self._ready)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Housekeeping in the background; close() and settle() wait for it."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self) -> None:
        """Wait for the background housekeeping under way (env saves, removals)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def create(self, owner: str | None = None, network: str = "") -> Ready:
        """Start one pooled container kept by ``owner`` (default: this pool), on ``network`` (an owner's
        egress network, or '' for the holding one)."""
        owner = owner or self.owner
        now = time.time()
        session_id = new_session_id()
        labels = {
            **self._labels,
            LABEL_POOL: owner,
            LABEL_CREATED: repr(now),
            LABEL_EXPIRES: repr(now + self.idle_seconds),
        }
        container_id, user = await self._start(
            f"tai-{session_id}", labels, {**self._labels, LABEL_POOL: owner}, network
        )
        return Ready(container_id, session_id, time.time(), user, network)

    def wants(self, network: str) -> bool:
        """Whether a spare waits, or is the next refill, on the owner network ``network`` (so the network
        stays when its owner's last session ends)."""
        return self.busy_on(network) or (
            len(self._ready) + self.starting_count() < self.size and self._next_network() == network != ""
        )

    def take(self, network: str) -> Ready | None:
        """A fresh pooled container for a session on the owner network ``network``: that owner's spare, else
        one on the holding network (never another owner's spare); None when none is ready. Schedules a
        refill."""
        now = time.time()
        fresh_after = now - (self.idle_seconds - HANDOUT_MARGIN_SECONDS)
        self._takers = {n: t for n, t in self._takers.items() if t > now - SPARE_FOR_SECONDS}
        for ready in list(self._ready):
            if ready.created < fresh_after or (ready.network and ready.network not in self._takers):
                self._ready.remove(ready)  # stale, or a spare for an owner who stopped coming
                self._spawn(self._engine.remove_container(ready.container_id))
        found = next((r for r in self._ready if r.network == network), None) or next(
            (r for r in self._ready if not r.network), None
        )
        if found is not None:
            self._ready.remove(found)
        self._takers[network] = now
        self.kept_networks.add(network)
        self.fill_soon(delay=REFILL_DELAY_SECONDS)
        pool_take(found is not None)  # a hit or a miss, counted when a server's metrics are on
        return found

    def _next_network(self) -> str:
        """Where the next refill waits: on the network of the latest taker without a spare (waiting or
        starting; at most ``size // 2`` spares), else on the holding network."""
        spares = {r.network for r in self._ready if r.network} | {
            n for n, c in self._starting.items() if n and c
        }
        if len(spares) >= self.size // 2:
            return ""
        waiting = [n for n in self._takers if n not in spares]
        return max(waiting, key=self._takers.__getitem__, default="")

    def discard(self, container_id: str) -> None:
        """Remove a container taken from the pool that will serve no session (in the background)."""
        self._spawn(self._engine.remove_container(container_id))

    def fill_soon(self, delay: float = 0.0) -> None:
        if self._closing or self.size <= 0 or (self._filler is not None and not self._filler.done()):
            return
        self._filler = asyncio.create_task(self._fill(delay))

    async def _fill(self, delay: float) -> None:
        """Start containers until the pool is full: ``fill_starts`` at once, one while claims are under way
        (the first of the starters goes on then, the others wait for the claims to end)."""
        if delay:
            await asyncio.sleep(delay)
        self._failures = 0
        await asyncio.gather(*(self._fill_one_by_one(first=i == 0) for i in range(self.fill_starts)))

    def _full(self) -> bool:
        return len(self._ready) + self.starting_count() >= self.size

    async def _fill_one_by_one(self, *, first: bool) -> None:
        while not self._closing and not self._full() and self._failures < FILL_FAILURES:
            if not first and self._claims:
                await self.claims_ended()
                continue  # look again: the pool may be full, or closing, by now
            network = self._next_network()
            self._starting[network] += 1
            try:
                ready = await self.create(network=network)
            except SandboxError as e:
                self._failures += 1
                self._log.warning("sandbox-docker: the warm pool could not start a container: %s", e)
                if self._failures >= FILL_FAILURES:
                    return  # the next hand-out tries again
                await asyncio.sleep(0.5 * self._failures)
                continue
            finally:
                self._starting[network] -= 1
                if self._starting[network] <= 0:
                    del self._starting[network]
            if self._closing:
                await self._engine.remove_container(ready.container_id)
                return
            self._ready.append(ready)

    # ------------------------------------------------------------- sessions

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a claim: while one is under way, the refill starts one container at a time."""
        self._claims += 1
        if self._no_claims is not None:
            self._no_claims.clear()
        try:
            yield
        finally:
            self._claims -= 1
            if not self._claims and self._no_claims is not None:
                self._no_claims.set()

    async def claims_ended(self, within: float | None = None) -> None:
        """Return once no claim is under way (or the pool closes), or after ``within`` seconds."""
        if self._no_claims is None:
            self._no_claims = asyncio.Event()
        if self._claims and not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._no_claims.wait(), within)

    async def claim(self, ready: Ready, labels: Mapping[str, str], env: Mapping[str, str]) -> str | None:
        """Make a pooled container the session's (its record volume carries ``labels``); the record's
        name, or None when that failed (the container is then removed)."""
        record = RECORD_PREFIX + ready.session_id
        record_labels = {**labels, LABEL_RECORD: ready.container_id}
        if env:
            record_labels[LABEL_POOLED_ENV] = json.dumps(dict(env), sort_keys=True)
        try:
            await self._engine.create_volume(record, record_labels)
        except SandboxError as e:
            self._log.warning("sandbox-docker: a pooled container could not be claimed: %s", e)
            self._spawn(self._engine.remove_container(ready.container_id, volume=record))
            return None
        self._env[ready.session_id] = dict(env)
        return record

    def knows(self, session_id: str) -> bool:
        """Whether this pool handed out ``session_id`` (and it was not forgotten since)."""
        return session_id in self._env

    def forget(self, session_id: str) -> None:
        self._env.pop(session_id, None)

    @staticmethod
    def env_of(labels: Mapping[str, str]) -> dict[str, str]:
        """A pooled session's spec env, from its record volume's labels (never from the container)."""
        try:
            env = json.loads(labels.get(LABEL_POOLED_ENV) or "{}")
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}

    async def records(self) -> list[dict[str, Any]]:
        """The record volumes of sessions in pooled containers (this pool's and others')."""
        return await self._engine.volumes(LABEL_RECORD)

    async def containers(self) -> list[dict[str, Any]]:
        """Every pooled container on the engine, claimed or not (a fork of a pooled session runs an image
        committed from its container, whose labels it inherits: a session label says it is no pooled one)."""
        found = await self._engine.containers(LABEL_POOL, what="list pooled containers")
        return [c for c in found if LABEL_SESSION not in (c.get("Labels") or {})]

    @staticmethod
    def from_record(volume: Mapping[str, Any], env: Mapping[str, str]) -> PooledSession:
        labels = volume.get("Labels") or {}
        return PooledSession(labels[LABEL_SESSION], labels[LABEL_RECORD], volume["Name"], labels, env)

    async def find(self, session_id: str) -> PooledSession:
        """A session in a pooled container, from its record volume; SandboxNotFoundError when none."""
        missing = session_gone(session_id)
        volume = await self._engine.volume(RECORD_PREFIX + session_id)
        labels = (volume or {}).get("Labels") or {}
        if volume is None or labels.get(LABEL_SESSION) != session_id or LABEL_RECORD not in labels:
            raise missing
        try:
            await self._engine.inspect_container(labels[LABEL_RECORD], what="inspect a session")
        except SandboxNotFoundError:
            raise missing from None
        env = self._env.get(session_id)
        if env is None:
            env = self.env_of(labels)
        return self.from_record(volume, env)

    async def reap(
        self, now: float, on_gone: Callable[[str], None], expiries: Mapping[str, float] | None = None
    ) -> list[str]:
        """Remove expired pooled sessions, records left without a container, and stale unclaimed
        containers; the ids of the expired sessions (``on_gone`` is told of every session removed).
        ``expiries``: session ends moved since the record was made (session id -> epoch seconds)."""
        records, pooled = await asyncio.gather(self.records(), self.containers())
        alive = {c["Id"] for c in pooled}
        claimed = set()
        reaped = []
        for volume in records:
            labels = volume.get("Labels") or {}
            container_id = labels.get(LABEL_RECORD, "")
            claimed.add(container_id)
            try:
                expires = (expiries or {}).get(labels.get(LABEL_SESSION, ""), labels[LABEL_EXPIRES])
                expired = float(expires) <= now
            except (KeyError, ValueError):
                expired = True
            if expired or container_id not in alive:
                session_id = labels.get(LABEL_SESSION, "")
                self.forget(session_id)
                on_gone(session_id)
                await self._engine.remove_container(container_id, volume=volume["Name"])
                if expired and session_id:
                    reaped.append(session_id)
        for container in pooled:
            labels = container.get("Labels") or {}
            if container["Id"] in claimed or labels.get(LABEL_POOL) == self.owner:
                continue
            try:
                stale = float(labels[LABEL_EXPIRES]) <= now
            except (KeyError, ValueError):
                stale = True
            if stale or owner_gone(labels.get(LABEL_POOL, "")):
                await self._engine.remove_container(container["Id"])
        return reaped

    async def close(self) -> None:
        """Stop refilling (starts under way end, and their containers go) and remove every container still
        waiting in the pool."""
        self._closing = True
        if self._no_claims is not None:
            self._no_claims.set()  # starters waiting for claims to end stop now
        if self._filler is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._filler)
        waiting = [ready.container_id for ready in self._ready]
        self._ready.clear()
        await asyncio.gather(*(self._engine.remove_container(c) for c in waiting), return_exceptions=True)
        await self.settle()
