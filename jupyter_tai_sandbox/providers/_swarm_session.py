"""A swarm session: a docker session whose container is the task of a one-replica service.

Commands and files run exactly as the docker provider runs them
(:class:`~._docker_session.DockerSession`), against the engine of the node
that runs the task; the session also knows its service and node. The
:class:`NodeEngines` registry keeps one :class:`~._swarm_engine.SwarmEngine`
(and one :class:`~._docker_session.SessionSite`) per node address.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..contract import (
    SandboxNotFoundError,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
)
from ._docker_names import LABEL, Deployment
from ._docker_session import CommandRegistry, DockerSession, SessionSite
from ._swarm_engine import SwarmEngine, TlsMaterial

#: on a service: the swarm provider made it; on a workspace record: the node that holds the volume
LABEL_NODE = f"{LABEL}.node"
#: task states on the way to running (anything else, but running, has ended)
STARTING_STATES = frozenset({"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting"})
RECORD_PREFIX = "tai-ws-"


def record_name(deployment: Deployment, key: str) -> str:
    """The swarm config recording where the deployment's workspace ``key`` lives (config names take
    64 characters)."""
    return RECORD_PREFIX + hashlib.sha256(f"{deployment.name}\0{key}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Placement:
    """Where a task runs: its node (id, hostname, state, engine address) and its container."""

    node_id: str
    hostname: str
    state: str
    address: str | None
    container_id: str | None
    task_state: str
    task_error: str


class NodeEngines:
    """One engine (and session site) per node address, made on first use; closed together."""

    def __init__(
        self,
        *,
        tls: TlsMaterial | None,
        timeout: float,
        site: Callable[[SwarmEngine], SessionSite],
        scope: Mapping[str, str],
    ) -> None:
        self._tls = tls
        self._scope = dict(scope)
        self._timeout = timeout
        self._make_site = site
        self._sites: dict[str, SessionSite] = {}

    async def site(self, address: str) -> SessionSite:
        site = self._sites.get(address)
        if site is None:
            engine = SwarmEngine(address, tls=self._tls, timeout=self._timeout, scope=self._scope)
            site = self._sites[address] = self._make_site(engine)
        await site.engine.connect()
        return site

    async def close(self) -> None:
        sites, self._sites = list(self._sites.values()), {}
        for site in sites:
            await site.engine.close()


class SwarmSession(DockerSession):
    """One session: a service, its task's container, and the node engine that runs it."""

    def __init__(
        self,
        site: SessionSite,
        container_id: str,
        session_id: str,
        spec: SessionSpec,
        created_at: float,
        expires_at: float,
        *,
        service_id: str,
        placement: Placement,
    ) -> None:
        super().__init__(site, container_id, session_id, spec, created_at, expires_at)
        self.service_id = service_id
        self.placement = placement

    @property
    def node_id(self) -> str:
        return self.placement.node_id

    @property
    def engine(self) -> SwarmEngine:
        return self._engine  # type: ignore[return-value]

    async def info(self) -> SessionInfo:
        self._check_live()
        try:
            await self._engine.inspect_container(self._container, what="inspect a session")
        except SandboxNotFoundError:
            raise SandboxNotFoundError(f"no swarm sandbox session {self._id!r} (its container is gone)") from None
        except SandboxUnavailableError as e:
            raise SandboxUnavailableError(
                f"session {self._id} runs on node {self.placement.hostname}, whose engine cannot be reached: {e}"
            ) from None
        return self._info()


def placement_of(task: dict[str, Any], node: dict[str, Any] | None, engine_label: str) -> Placement:
    status = task.get("Status") or {}
    container = (status.get("ContainerStatus") or {}).get("ContainerID") or None
    if node is None:
        return Placement(task.get("NodeID", ""), "?", "removed", None, container, status.get("State", ""), status.get("Err", ""))
    labels = (node.get("Spec") or {}).get("Labels") or {}
    return Placement(
        node["ID"],
        (node.get("Description") or {}).get("Hostname", node["ID"][:12]),
        (node.get("Status") or {}).get("State", "unknown"),
        labels.get(engine_label),
        container,
        status.get("State", ""),
        status.get("Err", ""),
    )


Teardown = Callable[[DockerSession, bool], Awaitable[None]]

__all__ = [
    "LABEL_NODE",
    "STARTING_STATES",
    "CommandRegistry",
    "NodeEngines",
    "Placement",
    "SwarmSession",
    "placement_of",
    "record_name",
]
