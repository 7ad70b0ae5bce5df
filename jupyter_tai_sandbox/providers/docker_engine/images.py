"""EngineImages: the image calls of a :class:`~.docker_engine.DockerEngine` that a fork needs.

A container's writable layer committed as an image of the deployment, those images listed and removed,
and a folder copied from one container to another through the engine's archive API (engine to engine in
one worker thread, streamed: nothing is held whole).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ...contract import SandboxNotFoundError
from .calls import EngineCalls, EngineRefusedError

T = TypeVar("T")

#: a folder copy between two containers gives up after this many seconds (a tmpfs workspace of a few GiB
#: copies in seconds on one engine)
COPY_SECONDS = 300.0


class EngineImages(EngineCalls):
    """Images of the deployment (a mixin of :class:`~.docker_engine.DockerEngine`)."""

    async def commit(self, container_id: str, *, repository: str, tag: str, labels: Mapping[str, str]) -> str:
        """The container's filesystem (its image and writable layer) as a new image ``repository:tag``; its id.

        The engine puts the container's own labels in the image too (and so in containers made from it):
        ``labels`` (with the deployment's) are added, and win over the container's of the same name."""
        made = await self._slow_call(
            f"commit container {container_id[:12]}",
            "commit",
            container_id,
            repository=repository,
            tag=tag,
            conf={"Labels": self.scoped_labels(labels)},
            pause=False,
        )
        return str(made["Id"])

    async def image(self, image_id: str) -> dict[str, Any] | None:
        """The image's description, or None when there is none in the deployment."""
        try:
            found = await self._call(f"inspect image {image_id[:19]}", "inspect_image", image_id)
        except SandboxNotFoundError:
            return None
        return found if self.in_scope((found.get("Config") or {}).get("Labels")) else None

    async def images(self, label: str) -> list[dict[str, Any]]:
        """Summaries of the deployment's images carrying ``label`` (``key`` or ``key=value``)."""
        return list(
            await self._call("list images", "images", filters={"label": self.label_filter(label)}) or []
        )

    async def remove_image(self, image_id: str) -> bool:
        """Remove an image (a missing one is fine); False when the engine refuses because something still
        uses it (a container, or an image made from it)."""
        try:
            await self._slow_call(f"remove image {image_id[:19]}", "remove_image", image_id, noprune=False)
        except SandboxNotFoundError:
            pass
        except EngineRefusedError as e:
            if e.status != 409:
                raise
            return False
        return True

    async def import_image(
        self, archive: bytes, *, repository: str, tag: str, changes: Sequence[str]
    ) -> None:
        """``archive`` (a tar of a root filesystem) as the image ``repository:tag`` (``changes``: Dockerfile
        instructions such as CMD): an image every deployment on the engine shares, as a built one."""
        await self._slow_call(
            f"import image {repository}:{tag}",
            "import_image_from_data",
            archive,
            repository=repository,
            tag=tag,
            changes=list(changes),
        )

    async def run_long(self, what: str, within: float, fn: Callable[..., T], *args: Any) -> T:
        """A blocking function of the caller's that calls the engine (:attr:`api`) for a long while, such as an
        image's export, in a worker thread, its errors typed, bounded by ``within`` seconds."""
        return await self._call_within(within, what, fn, *args)

    async def copy_folder(self, source: str, target: str, folder: str) -> None:
        """Copy what ``folder`` of container ``source`` holds (files, modes, owners, links) into the same folder
        of container ``target``, streamed from one archive call into the other. The folder may be a volume in
        a read-only root: the archive holds its contents (``folder/.``), extracted into it."""

        def copy() -> None:
            chunks, _ = self._api.get_archive(source, f"{folder.rstrip('/')}/.", chunk_size=1 << 20)
            if not self._api.put_archive(target, folder, chunks):
                raise EngineRefusedError(
                    f"copy {folder} into container {target[:12]}: the engine refused",
                    status=None,
                    detail="put_archive returned false",
                )

        await self._call_within(
            max(self.slow_timeout, COPY_SECONDS), f"copy {folder} between containers", copy
        )
