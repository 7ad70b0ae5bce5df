"""Forks of docker sessions: what a fork keeps, and the images it leaves to clean.

A docker fork keeps files, not processes: the source is frozen (the engine's freezer) while its root
filesystem's changes are committed as an image of the deployment, when that filesystem is writable (with
the disk ceiling on, the default, it is read-only and the source's own image serves), and while its
workspace is copied into the fork's new container. ``/tmp`` (a tmpfs when the root is read-only), memory
and running processes are not kept.

A committed image is named ``tai-sbx-fork:<fork session id>`` and labelled with it (``LABEL_FORK``); it is
removed with its session, or by the reap once its session is gone (one another fork still stands on waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Collection, Mapping

from ...contract import SandboxError
from ..docker_engine import DockerEngine
from ..docker_engine.names import LABEL_FORK

FORK_REPOSITORY = "tai-sbx-fork"
#: a fork image this young may belong to a fork under way (committed, its container not made yet)
FORK_IMAGE_GRACE_SECONDS = 600.0


class ForkImages:
    """Freezes a source for its fork, commits it when its root is writable, and removes fork images."""

    def __init__(self, engine: DockerEngine, labels: Mapping[str, str], paused: set[str]) -> None:
        self._engine = engine
        self._labels = dict(labels)
        #: the containers this server knows paused (its site's): a fork leaves it as a user left it
        self._paused = paused
        #: per source container: its lock and how many forks want it
        self._freezing: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        #: per container a fork holds frozen: whether it stays paused when the fork ends (a user's word)
        self._stays_paused: dict[str, bool] = {}

    def defer(self, container_id: str, paused: bool) -> bool:
        """A user's pause (True) or resume of ``container_id``: while a fork holds it frozen, kept for the
        fork's end (True: nothing else to do now)."""
        if container_id not in self._stays_paused:
            return False
        self._stays_paused[container_id] = paused
        return True

    @contextlib.asynccontextmanager
    async def frozen(self, container_id: str, fork_id: str) -> AsyncIterator[tuple[str, bool]]:
        """Hold ``container_id`` frozen; yield the image the fork ``fork_id`` starts from and whether it was
        committed for it (it is when the container's root is writable). Thawed at the end unless it was paused
        before, or a user paused it meanwhile; a committed image is removed if the fork fails."""
        lock, wanting = self._freezing.setdefault(container_id, (asyncio.Lock(), [0]))
        wanting[0] += 1
        try:
            async with (
                lock
            ):  # two forks of one source: the second must not take the first's freeze for a user's
                attrs = await self._engine.inspect_container(container_id, what="inspect a session")
                was_paused = self._stays_paused[container_id] = bool((attrs.get("State") or {}).get("Paused"))
                try:
                    if not was_paused:
                        await self._engine.set_paused(container_id, True)
                    committed = not (attrs.get("HostConfig") or {}).get("ReadonlyRootfs")
                    image = await self._commit(container_id, fork_id) if committed else str(attrs["Image"])
                    try:
                        yield image, committed
                    except BaseException:
                        if committed:
                            with contextlib.suppress(SandboxError):
                                await self.drop(fork_id)
                        raise
                finally:
                    if self._stays_paused.pop(container_id):
                        await self._engine.set_paused(container_id, True)  # a no-op unless the freeze failed
                        self._paused.add(container_id)
                    else:
                        await self._engine.set_paused(container_id, False)
                        # a call that waited on the frozen agent may have seen it paused meanwhile
                        self._paused.discard(container_id)
        finally:
            wanting[0] -= 1
            if not wanting[0]:
                self._freezing.pop(container_id, None)

    async def _commit(self, container_id: str, fork_id: str) -> str:
        return await self._engine.commit(
            container_id,
            repository=FORK_REPOSITORY,
            tag=fork_id,
            labels={**self._labels, LABEL_FORK: fork_id},
        )

    async def drop(self, fork_id: str) -> None:
        """Remove the fork ``fork_id``'s image, and the fork images it stood on that nothing uses any more (a
        fork of a fork: its source's image waits for it when the source ends first)."""
        for image in await self._engine.images(f"{LABEL_FORK}={fork_id}"):
            image_id: str | None = image["Id"]
            while image_id:
                found = await self._engine.image(image_id)
                if found is None or LABEL_FORK not in ((found.get("Config") or {}).get("Labels") or {}):
                    break
                if not await self._engine.remove_image(image_id):
                    break  # used: by a live session's container, or by a later fork's image
                image_id = found.get("Parent") or None

    async def reap(self, live: Collection[str], now: float | None = None) -> None:
        """Remove fork images whose session is not in ``live`` (the deployment's sessions), past a grace."""
        now = time.time() if now is None else now
        for image in await self._engine.images(LABEL_FORK):
            fork_id = (image.get("Labels") or {}).get(LABEL_FORK)
            if fork_id in live or now - float(image.get("Created") or now) < FORK_IMAGE_GRACE_SECONDS:
                continue
            with contextlib.suppress(SandboxError):
                await self._engine.remove_image(image["Id"])
