"""The docker provider's warm pool: pre-started containers for the default spec.

A pooled container is started like a default session's container (the
provider's image, an anonymous workspace volume, the default bridge, no caps,
no spec env) but carries the pool label instead of a session's, so it is never
listed as a session. At hand-out the provider claims it (see
``DockerSandbox._claim``): the session's identity goes into a *record*, a small
labelled volume ``tai-rec-<session id>`` that names the container (labels
cannot change on a running container), and the container is renamed
``tai-<session id>``. A claimed container is never handed out again: it goes
with its session.

The pool refills in the background, one container at a time, after a short
pause, so the create that emptied a slot and its first command do not compete
with a container start. Containers waiting longer than ``pool_idle_seconds``
are replaced; any provider's reap removes an unclaimed pooled container past
that age, or at once when its owner (a process on this host) is gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from ..contract import SandboxError

if TYPE_CHECKING:  # pragma: no cover
    from .docker import DockerSandbox

#: a pooled container this close to its idle limit is not handed out (another reap may take it)
HANDOUT_MARGIN_SECONDS = 60.0
#: pause before a refill starts, so the session just handed out runs its first command undisturbed
REFILL_DELAY_SECONDS = 0.25


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


class WarmPool:
    """Ready container ids, handed out once each and refilled in the background."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        self._sandbox = sandbox
        self.owner = new_owner()
        self._ready: collections.deque[tuple[str, float]] = collections.deque()
        self._filler: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def size(self) -> int:
        return self._sandbox.pool_size

    def ready_count(self) -> int:
        return len(self._ready)

    def take(self) -> str | None:
        """A fresh pooled container's id, or None when none is ready; schedules a refill."""
        fresh_after = time.time() - (self._sandbox.pool_idle_seconds - HANDOUT_MARGIN_SECONDS)
        found = None
        while self._ready:
            container_id, created = self._ready.popleft()
            if created >= fresh_after:
                found = container_id
                break
            self._sandbox._spawn(self._sandbox._remove_container(container_id))
        self.fill_soon(delay=REFILL_DELAY_SECONDS)
        return found

    def fill_soon(self, delay: float = 0.0) -> None:
        if self._closing or self.size <= 0 or (self._filler is not None and not self._filler.done()):
            return
        self._filler = asyncio.create_task(self._fill(delay))

    async def _fill(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        failures = 0
        while not self._closing and len(self._ready) < self.size:
            try:
                container_id = await self._sandbox._create_pooled(self.owner)
            except SandboxError as e:
                failures += 1
                self._sandbox.log.warning("sandbox-docker: the warm pool could not start a container: %s", e)
                if failures >= 3:
                    return  # the next hand-out tries again
                await asyncio.sleep(0.5 * failures)
                continue
            if self._closing:
                await self._sandbox._remove_container(container_id)
                return
            self._ready.append((container_id, time.time()))

    def is_ours(self, labels: dict[str, Any], pool_label: str) -> bool:
        return labels.get(pool_label) == self.owner

    async def close(self) -> None:
        """Stop refilling and remove every container still waiting in the pool."""
        self._closing = True
        if self._filler is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._filler)
        waiting = [container_id for container_id, _ in self._ready]
        self._ready.clear()
        await asyncio.gather(*(self._sandbox._remove_container(c) for c in waiting), return_exceptions=True)
