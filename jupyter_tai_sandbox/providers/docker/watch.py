"""The deployment's session and pooled containers as ``list()`` reads them: a full listing kept current by
the engine's events.

A list of 1,000 containers costs the engine itself about 50 ms (it builds every container's summary, mounts and
networks included, ~2 KiB of JSON each) and the SDK as much again to read it. So :class:`ContainerWatch` lists
them once (the seed), then at each ``list()`` asks the engine only for the events stamped since it last looked
(``GET /events?since=&until=``, answered from the events the engine holds: a millisecond) and applies the
container ones of the deployment (create, start, die, pause, unpause, destroy) to what it holds. Nothing runs
between lists: no stream to lose, no thread.

It stays exact, for this server's sessions and every other server's of the deployment on the engine:

* every list reads the events up to the engine's *now* before it answers, so a container another server made
  or removed before the list began is in its answer (the engine records a create's or a removal's event
  before it answers that call); the engine's clock is this host's for a local socket, else measured at each
  seed (``EngineCalls.clock_offset``);
* the engine holds only its latest :data:`~..docker_engine.calls.EVENTS_HELD` events, of every kind and
  deployment: a read that returns nearly that many may have missed older ones, and is replaced by a full
  listing (a new seed), as is one whose call failed, and any seed older than :data:`RESYNC_SECONDS`;
* a seed takes its mark (the engine's time, less :data:`GUARD_NS`) *before* its listing and then applies
  every event from the mark on, oldest first: a container's last event wins, and one without events since
  the mark is as the listing found it; each read starts :data:`GUARD_NS` before the previous one's end (an
  event is stamped just before the engine holds it), and an event older than the last applied to its
  container is skipped, so reading one twice changes nothing.

A summary here has the engine's ``Id`` and ``State`` and the container's ``jupyter-tai-sandbox.*`` labels
(an event gives the labels together with attributes of its own, such as ``name``; nothing else is read).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ...contract import SandboxError
from ..docker_engine import DockerEngine
from ..docker_engine.calls import EVENTS_HELD
from ..docker_engine.names import LABEL, LABEL_POOL, LABEL_SESSION

#: each read of events starts this long before the previous one ended (an event may be held a little after
#: it was stamped), and a seed's mark this long before its listing
GUARD_NS = 1_000_000_000
#: a seed older than this is replaced by a new full listing at the next list
RESYNC_SECONDS = 120.0
#: a read returning at least EVENTS_HELD less this many may have lost older events: a full listing instead
MISSED_MARGIN = 64
#: the container state each event leaves (others, such as exec_start or kill, change none list reads)
STATES = {
    "create": "created",
    "start": "running",
    "restart": "running",
    "unpause": "running",
    "pause": "paused",
    "die": "exited",
}


def _summary(container_id: str, labels: Mapping[str, str], state: str | None) -> dict[str, Any]:
    return {
        "Id": container_id,
        "Labels": {k: v for k, v in labels.items() if k.startswith(LABEL + ".")},
        "State": state,
    }


class ContainerWatch:
    """The deployment's containers with a session or pool label on one engine (see the module's docstring)."""

    def __init__(self, engine: DockerEngine) -> None:
        self._engine = engine
        #: container id -> its summary
        self._containers: dict[str, dict[str, Any]] = {}
        #: container id -> the engine time (ns) of its last event applied (removed ones too, for a while)
        self._last: dict[str, int] = {}
        #: the engine time (ns) the next read of events starts at; None: a full listing first
        self._mark: int | None = None
        self._offset_ns = 0
        self._seeded = 0.0
        self._lock: asyncio.Lock | None = None
        #: full listings made so far (the seed and every resync)
        self.listings = 0
        #: reads of events replaced by a full listing (the engine may have dropped some, or did not answer)
        self.overflows = 0

    def _now_ns(self) -> int:
        return time.time_ns() + self._offset_ns

    async def summaries(self) -> list[dict[str, Any]]:
        """Every session and pooled container of the deployment now (see the module's docstring)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._mark is None or time.monotonic() - self._seeded > RESYNC_SECONDS:
                await self._seed()
            else:
                until = self._now_ns()
                try:
                    events = await self._engine.events_between(self._mark, until)
                except SandboxError:
                    events = None
                if events is None or len(events) >= EVENTS_HELD - MISSED_MARGIN:
                    self.overflows += 1
                    await self._seed()
                else:
                    self._apply(events, until)
            return list(self._containers.values())

    def forget(self) -> None:
        """The next list lists everything again (a seed)."""
        self._mark = None

    async def _seed(self) -> None:
        self._offset_ns = round(await self._engine.clock_offset() * 1e9)
        mark = self._now_ns() - GUARD_NS
        sessions, pooled = await asyncio.gather(
            self._engine.containers(LABEL_SESSION),
            self._engine.containers(LABEL_POOL, what="list pooled containers"),
        )
        seeded = time.monotonic()
        self.listings += 1
        containers = {}
        for found in [*sessions, *pooled]:
            containers[found["Id"]] = _summary(found["Id"], found.get("Labels") or {}, found.get("State"))
        until = self._now_ns()
        try:
            events: list[dict[str, Any]] | None = await self._engine.events_between(mark, until)
        except SandboxError:
            events = None
        self._containers, self._last, self._seeded = containers, {}, seeded
        if events is None or len(events) >= EVENTS_HELD - MISSED_MARGIN:
            # as exact as the listing alone; the next list lists again
            self.overflows += 1
            self._mark = None
            return
        self._mark = mark
        self._apply(events, until)

    def _apply(self, events: list[dict[str, Any]], until: int) -> None:
        """The deployment's container events, oldest first, on what is held; the next read's start."""
        for event in events:
            if event.get("Type") != "container":
                continue
            actor = event.get("Actor") or {}
            container_id, attrs = actor.get("ID"), actor.get("Attributes") or {}
            stamp = event.get("timeNano")
            if not isinstance(container_id, str) or not isinstance(stamp, int):
                continue
            if not self._engine.in_scope(attrs) or not (LABEL_SESSION in attrs or LABEL_POOL in attrs):
                continue
            if stamp < self._last.get(container_id, 0):
                continue  # read before, or older than what its container's last event said
            self._last[container_id] = stamp
            action = str(event.get("Action") or event.get("status") or "").split(":", 1)[0].strip()
            if action == "destroy":
                self._containers.pop(container_id, None)
                continue
            held = self._containers.get(container_id)
            state = STATES.get(action, held["State"] if held is not None else "running")
            self._containers[container_id] = _summary(container_id, attrs, state)
        assert self._mark is not None
        self._mark = max(self._mark, until - GUARD_NS)
        # a removed container's last event is kept while a read may return it again
        for container_id, stamp in list(self._last.items()):
            if stamp < self._mark - GUARD_NS and container_id not in self._containers:
                del self._last[container_id]
