"""EngineVolumes: the volume calls of a :class:`~.docker_engine.DockerEngine`.

The deployment's volumes (inspect, create, list, remove), and the engine-wide
shared ones, each filled once from an archive through a container never started.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...contract import SandboxNotFoundError
from .calls import EngineCalls, EngineRefusedError, MissingImageError, docker_sdk, readable


def _age(created: Any, now: float) -> float:
    """Seconds since an engine timestamp (RFC 3339, nanoseconds and all); 0 when unreadable."""
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d+", r"\1", str(created or "")).replace("Z", "+00:00")
    try:
        return now - datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


class EngineVolumes(EngineCalls):
    """The volume calls of one engine (a mixin of :class:`~.docker_engine.DockerEngine`)."""

    # ------------------------------------------------------------- volumes

    async def volume(self, name: str) -> dict[str, Any] | None:
        """The volume's description, or None when there is none in the deployment."""
        try:
            found = await self._call(f"inspect volume {name}", "inspect_volume", name)
        except SandboxNotFoundError:
            return None
        return found if self.in_scope(found.get("Labels")) else None

    async def create_volume(self, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        """Create a volume of the deployment; the engine returns an existing one of that name unchanged
        (check its labels): one of another deployment is an EngineRefusedError (409)."""
        made = await self._call(
            f"create volume {name}", "create_volume", name, labels=self.scoped_labels(labels)
        )
        if not self.in_scope(made.get("Labels")):
            raise EngineRefusedError(
                f"create volume {name}: another deployment on this engine holds that name",
                status=409,
                detail="the name is taken",
            )
        return made

    async def volumes(self, label: str | Sequence[str]) -> list[dict[str, Any]]:
        """The deployment's volumes carrying ``label`` (all of a list)."""
        found = await self._call("list volumes", "volumes", filters={"label": self.label_filter(label)})
        return list((found or {}).get("Volumes") or [])

    async def fill_shared_volume(
        self,
        name: str,
        image: str,
        archive: bytes,
        *,
        labels: Mapping[str, str],
        refill: bool = False,
        stale_seconds: float = 60.0,
    ) -> None:
        """Make the engine-wide volume ``name`` hold ``archive``, unless it does already (``refill``: even
        then). The volume is shared by every deployment on the engine, like an image, so it carries
        ``labels`` and no deployment's. It is filled through a container of ``image`` named ``<name>-fill``,
        created with the volume (which it creates), given the archive and removed, never started: that
        container's name is the fill's lock, so a volume that exists while no such container does is whole.
        A fill container older than ``stale_seconds`` was left by a crash: it is removed and the fill redone."""
        docker = docker_sdk()
        filler = f"{name}-fill"

        def exists(look: Callable[[str], Any], what: str) -> Any:  # the SDK's look, None for a 404
            try:
                return look(what)
            except docker.errors.NotFound:
                return None

        def fill() -> None:
            api = self._client.api
            forced = refill
            while True:
                volume = exists(api.inspect_volume, name)
                holder = exists(api.inspect_container, filler)
                if volume is not None and holder is None and not forced:
                    return
                if holder is not None:
                    if _age(holder.get("Created"), time.time()) > stale_seconds:
                        with contextlib.suppress(docker.errors.NotFound):
                            api.remove_container(filler, force=True)
                    else:
                        time.sleep(0.1)  # another server fills it: wait for its lock to go
                        forced = False
                    continue
                mount = docker.types.Mount("/fill", name, type="volume", labels=dict(labels))
                try:
                    made = api.create_container(
                        image,
                        name=filler,
                        entrypoint=["/fill/none"],
                        command=[],
                        labels=dict(labels),
                        host_config=api.create_host_config(mounts=[mount], network_mode="none"),
                    )
                except docker.errors.ImageNotFound as e:
                    raise MissingImageError(
                        f"image {image!r} is not on the Docker engine at {self.base_url}: {readable(e)}",
                        image=image,
                    ) from None
                except docker.errors.APIError as e:
                    if getattr(e.response, "status_code", None) == 409:
                        continue  # another server took the lock first
                    raise
                try:
                    api.put_archive(made["Id"], "/fill", archive)
                finally:
                    with contextlib.suppress(docker.errors.NotFound):
                        api.remove_container(made["Id"], force=True)
                return

        await self._slow_call(f"fill volume {name}", fill)

    async def shared_volumes(self, label: str, *, dangling: bool = False) -> list[dict[str, Any]]:
        """Engine-wide volumes carrying ``label`` (any deployment's, or none's: see :meth:`fill_shared_volume`)."""
        filters: dict[str, Any] = {"label": [label]}
        if dangling:
            filters["dangling"] = True
        found = await self._call("list volumes", "volumes", filters=filters)
        return list((found or {}).get("Volumes") or [])

    async def remove_volume(self, name: str) -> None:
        """Remove a volume; a missing one is fine, one in use is an EngineRefusedError (409)."""
        with contextlib.suppress(SandboxNotFoundError):
            await self._slow_call(f"remove volume {name}", "remove_volume", name)
