"""A swarm session: a docker session whose container is the task of a one-replica service.

Commands and files go to the task container's agent exactly as the docker
provider's do (:class:`~._docker_session.DockerSession`), over the engine of
the node that runs the task; the session also knows its service and node. The
:class:`NodeEngines` registry keeps one :class:`~.engine.SwarmEngine`
(with its agent site and agent volumes) per node address.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...contract import (
    SandboxError,
    SandboxNotFoundError,
    SandboxUnavailableError,
    SessionInfo,
)
from .._docker_agent import AgentVolumes
from .._docker_session import DockerSession
from ..container import ContainerSession, ContainerSite
from ..docker_engine.names import LABEL, Deployment
from .engine import SwarmEngine, TlsMaterial

#: on a service: the swarm provider made it; on a workspace record: the node that holds the volume
LABEL_NODE = f"{LABEL}.node"
#: task states on the way to running (anything else, but running, has ended)
STARTING_STATES = frozenset(
    {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting"}
)
RECORD_PREFIX = "tai-ws-"


def record_name(deployment: Deployment, key: str, owner: str | None = None) -> str:
    """The swarm config recording where the deployment's workspace ``key`` lives: the key's unscoped
    one (``owner`` None), or ``owner``'s own (config names take 64 characters)."""
    named = f"{deployment.name}\0{key}" if owner is None else f"{deployment.name}\0{key}\0{owner}"
    return RECORD_PREFIX + hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:32]


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
    """One engine per node address, with its agent site and agent volumes, made on first use; closed together."""

    def __init__(
        self,
        *,
        tls: TlsMaterial | None,
        timeout: float,
        agent_site: Callable[[SwarmEngine], ContainerSite],
        scope: Mapping[str, str],
        direct_agent: bool = True,
        log: Any = None,
    ) -> None:
        self._tls = tls
        self._scope = dict(scope)
        self._timeout = timeout
        self._make_agent_site = agent_site
        self._direct_agent = direct_agent
        self._log = log
        self._engines: dict[str, SwarmEngine] = {}
        self._agent_sites: dict[str, ContainerSite] = {}
        self._agent_volumes: dict[str, AgentVolumes] = {}

    async def engine(self, address: str) -> SwarmEngine:
        engine = self._engines.get(address)
        if engine is None:
            engine = self._engines[address] = SwarmEngine(
                address, tls=self._tls, timeout=self._timeout, scope=self._scope
            )
            if not self._direct_agent:
                engine.direct_agent = False
        await engine.connect()
        return engine

    async def agent_site(self, address: str) -> ContainerSite:
        engine = await self.engine(address)
        site = self._agent_sites.get(address)
        if site is None:
            site = self._agent_sites[address] = self._make_agent_site(engine)
        return site

    async def agent_volume(self, address: str, arch: str, image: str) -> str:
        """The node's agent volume for ``arch``, filled (through a container of ``image``) on first use."""
        engine = await self.engine(address)
        volumes = self._agent_volumes.setdefault(address, AgentVolumes(engine))
        return await volumes.volume_for(arch, image)

    async def fill_agent_volumes(
        self, nodes: list[dict[str, Any]], engine_label: str, image: str
    ) -> tuple[str, str]:
        """``(volume, arch)``: the agent volume filled on every ready node of ``nodes`` that names its engine in
        ``engine_label`` (a task may land on any of them). A swarm of several architectures runs sessions on the
        first listed node's, which the caller pins by a constraint."""
        by_arch: dict[str, list[str]] = {}
        for node in nodes:
            address = ((node.get("Spec") or {}).get("Labels") or {}).get(engine_label)
            if not address or (node.get("Status") or {}).get("State") != "ready":
                continue
            arch = str(
                ((node.get("Description") or {}).get("Platform") or {}).get("Architecture") or "x86_64"
            )
            by_arch.setdefault(arch, []).append(address)
        if not by_arch:
            raise SandboxUnavailableError(
                f"no ready swarm node names its engine ({engine_label} label): no session can run"
            )
        arch = next(iter(by_arch))
        names = set()
        for address in by_arch[arch]:
            try:
                names.add(await self.agent_volume(address, arch, image))
            except SandboxUnavailableError as e:  # that node's engine does not answer: its tasks fail loudly
                self._log.warning("sandbox-swarm: the agent volume could not be filled on %s: %s", address, e)
        if not names:
            raise SandboxUnavailableError("the agent volume could not be filled on any swarm node")
        return names.pop(), arch

    def vouched(self, session_id: str) -> ContainerSession | None:
        """The session found or made here before on any node, while its agent connection is open
        (ContainerSite.vouched); None otherwise."""
        for site in self._agent_sites.values():
            found = site.vouched(session_id)
            if found is not None:
                return found
        return None

    async def reap_agent_volumes(self) -> None:
        """On every node this provider filled: other builds' agent volumes no container uses."""
        for volumes in list(self._agent_volumes.values()):
            with contextlib.suppress(SandboxError):
                await volumes.reap()

    async def close(self) -> None:
        agent_sites, self._agent_sites = list(self._agent_sites.values()), {}
        for site in agent_sites:
            channels = [known.channel for known in site.containers.values()]
            site.containers.clear()
            await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            await engine.close()


class SwarmSession(DockerSession):
    """One session: a service, its task's container, and the node engine that runs it."""

    def __init__(self, *args: Any, service_id: str, placement: Placement, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service_id = service_id
        self.placement = placement

    @property
    def node_id(self) -> str:
        return self.placement.node_id

    @property
    def engine(self) -> SwarmEngine:
        return self._engine  # type: ignore[return-value]  # a swarm session is made with its SwarmEngine

    async def info(self) -> SessionInfo:
        """The container on its node, and the end as the service's labels say now."""
        self._check_live()
        try:
            return await super().info()
        except SandboxNotFoundError:
            raise SandboxNotFoundError(
                f"no swarm sandbox session {self.id!r} (its container is gone)"
            ) from None
        except SandboxUnavailableError as e:
            raise SandboxUnavailableError(
                f"session {self.id} runs on node {self.placement.hostname}, whose engine cannot be reached: {e}"
            ) from None


def placement_of(task: dict[str, Any], node: dict[str, Any] | None, engine_label: str) -> Placement:
    status = task.get("Status") or {}
    container = (status.get("ContainerStatus") or {}).get("ContainerID") or None
    if node is None:
        return Placement(
            task.get("NodeID", ""),
            "?",
            "removed",
            None,
            container,
            status.get("State", ""),
            status.get("Err", ""),
        )
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


__all__ = [
    "LABEL_NODE",
    "STARTING_STATES",
    "NodeEngines",
    "Placement",
    "SwarmSession",
    "placement_of",
    "record_name",
]
