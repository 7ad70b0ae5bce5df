"""sandbox-swarm: each session is a one-replica Docker Swarm service.

The swarm manager schedules; the provider never picks a node itself (but for a
persistent workspace, which pins its session to the node holding its volume).
Commands and files go to the session agent of the task's container, over the
engine of the node that runs it, through the container base's session and
command classes, so every guarantee of sandbox-docker holds unchanged.

Its modules: the provider package's docstring.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from traitlets import Float, List, Unicode

from ...contract import (
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
)
from .._common import new_session_id
from .._docker_agent import agent_site
from .._docker_sandbox import ContainerSandbox, rejected, spec_from_labels, user_checked
from ..container import CommandRegistry, ContainerCommand, ContainerSite
from ..docker_engine import DockerEngine, EngineRefusedError
from ..docker_engine.names import (
    LABEL_CREATED,
    LABEL_EXPIRES,
    LABEL_NETWORK,
    LABEL_SESSION,
    LABEL_USER,
    WORKSPACE,
    is_session_id,
)
from .engine import SwarmEngine, TlsMaterial
from .session import (
    LABEL_NODE,
    STARTING_STATES,
    NodeEngines,
    Placement,
    SwarmSession,
)
from .tasks import TaskWatch, running, task_template
from .workspaces import WorkspaceRecords

__all__ = ["LABEL_NODE", "SwarmSandbox", "SwarmSession"]


class SwarmSandbox(ContainerSandbox):
    """sandbox-swarm: each session is a one-replica Docker Swarm service, its commands run on its node.

    The manager (``base_url``) places a session's service ``tai-<session id>`` (restart condition none,
    ``constraints``, ``spread``, reservations of ``reserve_fraction`` of its limits); its task runs the
    session agent as PID 1 from the read-only agent volume, filled on every ready node first. Commands and
    files go to that agent over the engine of the task's node (node label ``engine_label``; TLS with
    ``tls_*``), through the container base, so every guarantee of sandbox-docker holds. Deployments work as
    on docker. ``egress`` is the node's default bridge, ``internal`` an overlay per owner, ``none`` a task
    disconnected before it is handed out. A persistent workspace is a volume on one node, recorded on the
    manager, and pins its sessions there. A node that is down makes its sessions answer
    SandboxUnavailableError and leaves the others alone. Not on a service (API 1.41): ``no_new_privileges``
    and the warm pool. The docs' page operators/providers/swarm.md says it all at length.
    """

    _engine: SwarmEngine  # the manager's (ContainerSandbox types it DockerEngine)
    egress_policy = False
    egress_refusal = "the swarm provider cannot enforce an egress allow-list yet; use docker"

    kind = "swarm"
    max_isolation = "container"
    networks = frozenset({"egress", "internal", "none"})
    supports_limits = True

    base_url = Unicode(
        help="""The swarm manager's engine (unix:// or tcp://; with tls_* set, tcp:// uses TLS).
        Default: $DOCKER_HOST, else unix:///var/run/docker.sock.""",
    ).tag(config=True)

    tls_ca = Unicode(
        "", help="CA certificate (PEM) the manager's and the nodes' tcp:// engines are checked against."
    ).tag(config=True)
    tls_cert = Unicode(
        "", help="Client certificate (PEM) for the manager's and the nodes' tcp:// engines."
    ).tag(config=True)
    tls_key = Unicode("", help="Client key (PEM) for tls_cert.").tag(config=True)

    engine_label = Unicode(
        "tai.engine",
        help="""Node label holding the address of the node's own engine (unix:// or tcp://), where a
        session's commands and files go: `docker node update --label-add tai.engine=tcp://HOST:2376 NODE`.""",
    ).tag(config=True)

    constraints = List(
        Unicode(),
        default_value=[],
        help="Placement constraints of every session, as Swarm takes them ('node.labels.sandbox==yes').",
    ).tag(config=True)

    spread = List(
        Unicode(),
        default_value=[],
        help="Placement preferences: spread sessions evenly over the values of these node labels "
        "('node.labels.zone'); empty: the scheduler's own balancing.",
    ).tag(config=True)

    reserve_fraction = Float(
        0.1,
        help="Share of a session's cpu and memory limit reserved on its node (the scheduler places by "
        "reservations); 0: no reservation, 1: reserve the whole limit.",
    ).tag(config=True)

    start_timeout_seconds = Float(
        60.0, help="Longest a create waits for its task to run (an unplaceable session is removed then)."
    ).tag(config=True)

    node_timeout_seconds = Float(
        10.0, help="Longest a call to a node's engine may wait for it (a frozen node answers no later)."
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        tls = TlsMaterial(self.tls_ca, self.tls_cert, self.tls_key) if self.tls_cert else None
        self._engine = SwarmEngine(self.base_url, tls=tls, scope=self.scope.labels)
        self._engine.share.per_principal = self.engine_threads_per_user
        self._commands: CommandRegistry[ContainerCommand] = CommandRegistry()
        self._workspaces = WorkspaceRecords(
            self._engine, self.scope, self.own_labels, self.log, self.home_owner
        )
        self._nodes = NodeEngines(
            tls=tls,
            timeout=self.node_timeout_seconds,
            agent_site=self._agent_site_for,
            scope=self.scope.labels,
            direct_agent=self.agent_transport == "auto",
            log=self.log,
        )
        self._tasks = TaskWatch(
            self._engine,
            self._nodes,
            engine_label=self.engine_label,
            start_timeout_seconds=self.start_timeout_seconds,
        )

    @property
    def manager(self) -> SwarmEngine:
        return self._engine

    def _agent_site_for(self, engine: SwarmEngine) -> ContainerSite:
        engine.share.per_principal = self.engine_threads_per_user
        return agent_site(
            self,
            engine,
            self._commands,
            answer_within=self.node_timeout_seconds,
            current_end=self._current_end,
        )

    async def _current_end(self, session_id: str) -> float | None:
        """The session's end as its service's labels say now (another server may have moved it)."""
        found = await self.manager.services(f"{LABEL_SESSION}={session_id}")
        try:
            return self._spec_from(found[0])[3] if found else None
        except (KeyError, ValueError, SandboxError):
            return None

    async def _connect(self) -> None:
        await self._engine.connect()

    async def _workspace_volume(self, engine: DockerEngine, spec: SessionSpec) -> str:
        """The spec's workspace volume, as the manager's workspace records say (whichever node ``engine`` is)."""
        return await self._workspaces.volume(spec)

    # ------------------------------------------------------------ the agent

    async def _session_user(self, image: str) -> str:
        """Who a session's commands run as: ``user``, else the image's USER as the manager's engine
        knows it ('' = root)."""
        if self.user:
            return self.user
        try:
            return await self.manager.image_user(image)
        except SandboxError:
            return ""  # the manager does not hold the image: its USER is read in the session at the create

    # ------------------------------------------------------------ services

    # -------------------------------------------------------------- sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        spec = await self._prepared(spec)
        image = self._image_of(spec)
        for _ in range(3):
            session = await self._create(spec, image)
            if session is not None:
                return await user_checked(session)
        raise SandboxConflictError(
            f"workspace {spec.workspace_key!r} is being made by another session meanwhile"
        )

    async def _create(self, spec: SessionSpec, image: str) -> SwarmSession | None:
        session_id = new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        agent = await self._nodes.fill_agent_volumes(await self.manager.nodes(), self.engine_label, image)
        labels = self._new_labels(session_id, spec, now, expires, await self._session_user(image))
        pin = await self._workspaces.pin(spec) if spec.durability == "persistent" else None
        workspace = await self._workspaces.volume(spec) if spec.durability == "persistent" else None
        network = self._network_of(spec)
        template = task_template(
            self,
            spec,
            labels,
            network,
            pin,
            agent,
            workspace=workspace,
            constraints=self.constraints,
            spread=self.spread,
            reserve_fraction=self.reserve_fraction,
        )
        if network is not None:
            async with self._networks.hold(network):
                await self.manager.ensure_overlay(
                    network, labels={**self.own_labels, LABEL_NETWORK: "internal"}, subnet=self._pick_subnet
                )
                service_id = await self._create_service(template, session_id, labels, network)
        else:
            service_id = await self._create_service(template, session_id, labels, None)
        session: SwarmSession | None = None
        try:
            task, node = await self._tasks.wait_running(service_id, image)
            placement = await self._tasks.placement(task, node)
            session = await self._session_on(placement, session_id, spec, now, expires, service_id, labels)
            if spec.network == "none":
                await session.engine.network_disconnect(session.container_id, "bridge")
            if (
                spec.durability == "persistent"
                and pin is None
                and not await self._workspaces.keep(spec, placement.node_id)
            ):
                await self._teardown(session, False)
                return None  # another session put this new workspace on another node first: go there
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._remove(service_id, session, network))
            raise
        self.log.debug("sandbox-swarm: created %s on %s", session_id, placement.hostname)
        return session

    async def _create_service(
        self, template: dict[str, Any], session_id: str, labels: Mapping[str, str], network: str | None
    ) -> str:
        try:
            return await self.manager.create_service(template, name=f"tai-{session_id}", labels=labels)
        except EngineRefusedError as e:
            if network is not None:
                with contextlib.suppress(SandboxError):
                    await self.manager.drop_overlay(network)
            if e.status is not None and 400 <= e.status < 500 and e.status != 409:
                raise rejected(f"the swarm manager refused the session: {e.detail}") from None
            raise

    def _spec_from(self, service: dict[str, Any]) -> tuple[str, SessionSpec, float, float]:
        labels = (service.get("Spec") or {}).get("Labels") or {}
        container = ((service.get("Spec") or {}).get("TaskTemplate") or {}).get("ContainerSpec") or {}
        spec = spec_from_labels(labels, container.get("Env"))
        return labels[LABEL_SESSION], spec, float(labels[LABEL_CREATED]), float(labels[LABEL_EXPIRES])

    async def _attach(self, service: dict[str, Any]) -> SwarmSession:
        """The session of a service, on its node (SandboxUnavailableError when that node is down)."""
        try:
            session_id, spec, created, expires = self._spec_from(service)
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(
                f"service {service.get('ID', '?')[:12]} has unreadable session labels: {e}"
            ) from None
        tasks = await self.manager.tasks(service["ID"])
        if not tasks:
            raise SandboxNotFoundError(f"session {session_id} has no task")
        task = tasks[0]
        node = await self.manager.node(task["NodeID"]) if task.get("NodeID") else None
        if (task.get("Status") or {}).get(
            "State"
        ) == "starting":  # its node may run it already (TaskWatch.wait_running)
            container_id = await self._tasks.running_on_node(task, node)
            if container_id is not None:
                task = running(task, container_id)
        placement = await self._tasks.placement(task, node)
        if placement.task_state != "running" and placement.state in ("ready", "removed"):
            raise SandboxNotFoundError(
                f"session {session_id} ended: its task is {placement.task_state} ({placement.task_error or 'no error'})"
            )
        labels = (service.get("Spec") or {}).get("Labels") or {}
        # a node down or gone raises
        return await self._session_on(placement, session_id, spec, created, expires, service["ID"], labels)

    async def _session_on(
        self,
        placement: Placement,
        session_id: str,
        spec: SessionSpec,
        created: float,
        expires: float,
        service_id: str,
        labels: Mapping[str, str],
    ) -> SwarmSession:
        """The session of a running task, on its node's engine."""
        address = self._tasks.node_address(placement)
        site = await self._nodes.agent_site(address)
        return site.remember(
            SwarmSession(
                site,
                str(placement.container_id),
                session_id,
                spec,
                created,
                expires,
                engine=await self._nodes.engine(address),
                user=labels.get(LABEL_USER, ""),
                service_id=service_id,
                placement=placement,
            )
        )

    async def get(self, session_id: str) -> SandboxSession:
        if not is_session_id(session_id):
            raise SandboxNotFoundError(f"no swarm sandbox session {session_id!r}")
        vouched = self._nodes.vouched(
            session_id
        )  # found here before, its agent connection open: no engine call
        if vouched is not None:
            return vouched
        await self._connect()
        found = await self.manager.services(f"{LABEL_SESSION}={session_id}")
        if not found:
            raise SandboxNotFoundError(f"no swarm sandbox session {session_id!r}")
        return await self._attach(found[0])

    async def list(self) -> list[SessionInfo]:
        await self._connect()
        infos = []
        for service in await self.manager.services(LABEL_SESSION):
            try:
                session_id, spec, created, expires = self._spec_from(service)
            except (KeyError, ValueError, SandboxError):
                continue
            infos.append(
                SessionInfo(
                    id=session_id,
                    kind=self.kind,
                    spec=spec,
                    isolation=self.max_isolation,
                    workspace=WORKSPACE,
                    created_at=created,
                    expires_at=expires,
                )
            )
        return sorted(infos, key=lambda i: i.created_at)

    async def reap(self) -> builtins.list[str]:
        """Destroy sessions past their TTL, and remove services whose task ended or whose node left."""
        await self._connect()
        now = time.time()
        reaped = []
        for service in await self.manager.services(LABEL_SESSION):
            try:
                session_id, spec, _, expires = self._spec_from(service)
            except (KeyError, ValueError, SandboxError):
                continue
            tasks = await self.manager.tasks(service["ID"])
            placement = await self._tasks.placement(tasks[0]) if tasks else None
            lost = placement is not None and (
                placement.state == "removed"
                or (placement.task_state not in STARTING_STATES and placement.task_state != "running")
            )
            if expires > now and not lost:
                continue
            try:
                session = await self._attach(service)
            except (SandboxNotFoundError, SandboxUnavailableError):
                if expires > now and not lost:
                    continue
                # its node is down or its task is gone: remove what the manager holds
                await self._remove(service["ID"], None, self._network_of(spec))
                self._commands.abandon(session_id)
            else:
                try:
                    await session.destroy(remove_workspace=False)
                except SandboxNotFoundError:
                    continue
            reaped.append(session_id)
        await self._drop_idle_networks()
        await self._nodes.reap_agent_volumes()
        if reaped:
            self.log.info("sandbox-swarm: reaped %s", ", ".join(reaped))
        return reaped

    async def _drop_idle_networks(self) -> None:
        """Owner networks left behind (their last session's task was still being cleaned up then)."""
        with contextlib.suppress(SandboxError):
            for network in await self.manager.overlays(f"{LABEL_NETWORK}=internal"):
                async with self._networks.hold(network["Name"]):
                    await self.manager.drop_overlay(network["Name"])

    async def _remove(
        self,
        service_id: str,
        session: SwarmSession | None,
        network: str | None,
    ) -> None:
        """Remove a service, its container now when its node answers (its agent would, later), and the
        owner's overlay network when it was the last to use it."""
        await self.manager.remove_service(service_id)
        if session is not None:
            with contextlib.suppress(SandboxUnavailableError):
                await session.engine.remove_container(session.container_id)
        if network is not None:
            async with self._networks.hold(network):
                for _ in range(20):  # the swarm lets go of a network once the removed task is cleaned up
                    if await self.manager.drop_overlay(network) or await self._network_in_use(network):
                        break
                    await asyncio.sleep(0.25)

    def _network_of(self, spec: SessionSpec) -> str | None:
        """Only internal sessions have an owner network (an overlay); egress is the node's default bridge."""
        return (
            self.scope.owner_network(self.internal_network, spec.owner)
            if spec.network == "internal"
            else None
        )

    async def _network_in_use(self, network: str) -> bool:
        """Whether a session service of this provider is on the owner network ``network``."""
        for service in await self.manager.services(LABEL_SESSION):
            try:
                spec = self._spec_from(service)[1]
            except (KeyError, ValueError, SandboxError):
                continue
            if self._network_of(spec) == network:
                return True
        return False

    async def _retime(
        self,
        session: SwarmSession,
        expires_at: float,
    ) -> None:
        """A service's labels can change (its task keeps running): the new end goes in its expires label."""
        await self.manager.set_service_labels(session.service_id, {LABEL_EXPIRES: repr(float(expires_at))})

    async def _teardown(
        self,
        session: SwarmSession,
        remove_workspace: bool,
    ) -> None:
        self._commands.abandon(session.id)
        spec = session.spec
        await self._remove(session.service_id, session, self._network_of(spec))
        if remove_workspace and spec.durability == "persistent":
            await self._remove_workspace(session.engine, spec)
            await self._workspaces.forget(spec)
        self.log.debug("sandbox-swarm: destroyed %s", session.id)

    async def close(self) -> None:
        await asyncio.gather(*(c.kill() for c in self._commands.all()), return_exceptions=True)
        await self._nodes.close()
        await self._engine.close()
