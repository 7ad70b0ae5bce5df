"""DockerEngine: every call this package makes to one Docker engine.

A :class:`DockerEngine` is built from the engine's address (``unix://`` or
``tcp://``; TLS material later) and knows nothing of sessions: the docker
provider (and a future swarm provider, with one engine object per node) say
*what* to create, run or remove, and the engine object does it.

It is one class composed of mixins, one module a family of calls (no module imports one above it):

``calls``     :class:`EngineCalls`: the SDK client and its worker threads, error
              translation, the deployment scope, a bound on every call
``volumes``   :class:`EngineVolumes`: volumes, the deployment's and engine-wide shared ones
``networks``  :class:`EngineNetworks`: networks
``execs``     :class:`EngineExecs`: execs, the session agent's connection, the path stat,
              small archives in and out
``images``    :class:`EngineImages`: a container committed, the deployment's images, a
              folder copied between containers (a fork's)
``engine``    :class:`DockerEngine`: those composed, with the calls on containers
              (create-and-start, list, stats, rename, remove) (this module)

The names other modules import stay importable from the package (``docker_engine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ...contract import SandboxUnavailableError
from .calls import (
    DEFAULT_SLOW_TIMEOUT,
    DEFAULT_TIMEOUT,
    WORKERS,
    WORKERS_PER_PRINCIPAL,
    EngineRefusedError,
    MissingImageError,
    docker_sdk,
    readable,
)
from .execs import READ_FILE_LIMIT, RUN_OUTPUT_LIMIT, EngineExecs
from .images import EngineImages
from .networks import LEAVING_WAIT_SECONDS, EngineNetworks
from .stream import EngineRefusal
from .volumes import EngineVolumes


class DockerEngine(EngineExecs, EngineImages, EngineNetworks, EngineVolumes):
    """One Docker engine, reached at ``base_url``; every method is a coroutine unless noted."""

    # ---------------------------------------------------------- containers

    async def create_container(
        self,
        image: str,
        options: Mapping[str, Any],
        *,
        what: str = "create a container",
    ) -> str:
        """Create and start a container (``options`` as the SDK's ``containers.create`` takes them).

        A start that fails removes the container again. MissingImageError when the
        image is not on the engine. The container carries the deployment's labels.
        """
        docker = docker_sdk()
        from docker.models.containers import _create_container_args as create_container_args

        options = {**options, "labels": self.scoped_labels(options.get("labels"))}

        def create() -> str:
            # the SDK's containers.create, less the inspect it makes of the new container (nothing here reads it)
            args = create_container_args(
                {**options, "image": image, "command": options.get("command"), "version": self._api._version}
            )
            try:
                container_id = str(self._api.create_container(**args)["Id"])
            except docker.errors.ImageNotFound as e:
                raise MissingImageError(
                    f"image {image!r} is not on the Docker engine at {self.base_url}: {readable(e)}",
                    image=image,
                ) from None
            try:
                self._api.start(container_id)
            except BaseException:
                with contextlib.suppress(Exception):
                    self._api.remove_container(container_id, force=True, v=True)
                raise
            return container_id

        await self.connect()
        made = asyncio.ensure_future(self._thread(create))
        try:
            return await self._bounded(asyncio.shield(made), self.slow_timeout, what)
        except SandboxUnavailableError:
            # the engine may still make it later: remove it then, nobody will own it
            made.add_done_callback(functools.partial(self._remove_late, options.get("name")))
            raise
        except Exception as e:
            raise self.translate(e, what) from None

    def _remove_late(self, name: str | None, made: asyncio.Future[str]) -> None:
        """After a create its caller gave up on: remove the container (by name, as a failed start whose
        own removal timed out leaves one behind too)."""
        made_id = None if made.cancelled() or made.exception() is not None else made.result()
        container_id, client = made_id or name, self._client
        if container_id is None or client is None:
            return

        def remove() -> None:
            with contextlib.suppress(Exception):
                client.api.remove_container(container_id, force=True, v=True)

        # a thread of its own: the engine object may be closed meanwhile
        threading.Thread(target=remove, name="docker-engine-late-remove", daemon=False).start()

    async def containers(
        self, label: str | Sequence[str], *, what: str = "list containers"
    ) -> list[dict[str, Any]]:
        """Summaries of every container (all states) of the deployment carrying ``label`` (``key`` or
        ``key=value``; all of a list)."""
        await self.connect()
        filters = {"label": self.label_filter(label)}
        return list(await self._call(what, "containers", all=True, filters=filters) or [])

    async def stats(self, container_id: str) -> dict[str, Any]:
        """One sample of the container's stats (``one_shot``: no second sample is waited for), bounded
        by ``timeout``; an engine older than API 1.41 takes about 2 s for it."""
        docker = docker_sdk()

        def sample() -> dict[str, Any]:
            try:
                return self._api.stats(container_id, stream=False, one_shot=True)
            except docker.errors.InvalidVersion:
                return self._api.stats(container_id, stream=False)

        return dict(await self._call("read a container's stats", sample) or {})

    async def rename(self, container_id: str, name: str) -> None:
        await self._call("name a container", "rename", container_id, name)

    async def set_paused(self, container_id: str, paused: bool) -> None:
        """Freeze every process of a container (the cgroup freezer) or thaw them; already so is fine."""
        docker = docker_sdk()

        def change() -> None:
            try:
                (self._client.api.pause if paused else self._client.api.unpause)(container_id)
            except docker.errors.APIError as e:
                # "is already paused" (409), "is not paused" (409 on newer engines, 500 on 20.10)
                if e.status_code != 409 and "is not paused" not in str(e.explanation or ""):
                    raise

        await self._call("pause a container" if paused else "resume a container", change)

    async def remove_container(self, container_id: str, *, volume: str | None = None) -> None:
        """Remove a container with its anonymous volumes (and the named ``volume``); missing ones are fine."""
        docker = docker_sdk()

        def remove() -> None:
            try:
                self._client.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise
            if volume is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    self._client.api.remove_volume(volume)

        await self._slow_call("remove a container", remove)


__all__ = [
    "DEFAULT_SLOW_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "LEAVING_WAIT_SECONDS",
    "READ_FILE_LIMIT",
    "RUN_OUTPUT_LIMIT",
    "WORKERS",
    "WORKERS_PER_PRINCIPAL",
    "DockerEngine",
    "EngineRefusal",
    "EngineRefusedError",
    "MissingImageError",
    "docker_sdk",
    "readable",
]
