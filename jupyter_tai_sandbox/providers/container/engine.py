"""The engine seam of container providers: only what a container engine must provide.

A container provider (docker, swarm, later Kubernetes) is one engine adapter that satisfies
:class:`ContainerEngine` plus the provider's own traits; sessions, commands and files run on
the session agent (``providers.container.session``) and never on the engine's exec API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ...agent import AgentClient


@runtime_checkable
class ContainerEngine(Protocol):
    """A container engine as the container base uses it (every call async, never blocking the loop)."""

    async def create_container(self, image: str, options: Mapping[str, Any]) -> str:
        """Create and start a container; its id."""

    async def remove_container(self, container_id: str, *, volume: str | None = None) -> None:
        """Remove a container (and its anonymous volumes); gone already is not an error."""

    async def put_archive(self, container_id: str, folder: str, archive: bytes | Iterable[bytes]) -> None:
        """Extract a tar archive into ``folder`` of the container."""

    async def open_agent(self, container_id: str) -> AgentClient:
        """A new connection to the session agent of the container (its ``connect`` relay's byte stream)."""

    async def inspect_container(self, container_id: str) -> dict[str, Any]:
        """The container's record; SandboxNotFoundError when there is none."""

    async def containers(self, label: str | Sequence[str]) -> list[dict[str, Any]]:
        """The containers with these labels, in the provider's deployment scope."""
