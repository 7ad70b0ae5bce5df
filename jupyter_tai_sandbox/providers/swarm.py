"""sandbox-swarm: each session is a one-replica Docker Swarm service.

The swarm manager schedules; the provider never picks a node itself (but for a
persistent workspace, which pins its session to the node holding its volume).
Commands and files go to the session agent of the task's container, over the
engine of the node that runs it, through the container base's session and
command classes, so every guarantee of sandbox-docker holds unchanged.

``_swarm_engine``   :class:`SwarmEngine`: a DockerEngine with TLS exec streams and the manager's API
``_swarm_session``  :class:`SwarmSession`, the node engines (and their agent volumes), where a task runs
``_swarm_workspaces`` where persistent workspaces live: one record per key on the manager
``swarm``           :class:`SwarmSandbox`, the configurable provider (this module)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from traitlets import Float, List, Unicode

from ..agent.client import AGENT_DIR, AGENT_PATH
from ..contract import (
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
)
from ._common import new_session_id
from ._docker_agent import AGENT_USER_CAPABILITIES, agent_site
from ._docker_disk import SCRATCH
from ._docker_names import (
    LABEL_AGENT,
    LABEL_CREATED,
    LABEL_EXPIRES,
    LABEL_NETWORK,
    LABEL_OWNER,
    LABEL_SESSION,
    LABEL_USER,
    LABEL_WORKSPACE,
    WORKSPACE,
    is_session_id,
    session_labels,
)
from ._swarm_engine import SwarmEngine, TlsMaterial
from ._swarm_session import (
    LABEL_NODE,
    STARTING_STATES,
    NodeEngines,
    Placement,
    SwarmSession,
    placement_of,
)
from ._swarm_workspaces import WorkspaceRecords
from .container import CommandRegistry, ContainerSite
from .container.sandbox import ContainerSandbox, spec_from_labels, user_checked
from .docker_engine import EngineRefusedError, docker_sdk

__all__ = ["LABEL_NODE", "SwarmSandbox", "SwarmSession"]

#: how often a starting task is looked at
_POLL_SECONDS = 0.05
#: while a task is starting, its node's engine is asked this often, and the manager again after this long
_NODE_POLL_SECONDS = 0.01
_NODE_WATCH_SECONDS = 0.5


def _running(task: dict[str, Any], container_id: str) -> dict[str, Any]:
    """``task`` as running ``container_id``: what its node's engine said before the manager heard it."""
    status = {**(task.get("Status") or {}), "State": "running", "ContainerStatus": {"ContainerID": container_id}}
    return {**task, "Status": status}


def _reject(message: str) -> SandboxSpecRejectedError:
    return SandboxSpecRejectedError(message)


class SwarmSandbox(ContainerSandbox):
    """sandbox-swarm: each session is a one-replica Docker Swarm service, its commands run on its node.

    **Sessions.** A session is a service ``tai-<session id>`` (one replica,
    restart condition ``none``, endpoint mode ``dnsrr``) whose task runs the
    session agent as PID 1 from the read-only agent volume (filled on every
    ready node first), with the docker provider's labels on the service and its container. The manager
    (``base_url``) places it: ``constraints`` and ``spread`` preferences,
    resource limits from the spec (or ``default_cpu``/``default_memory_mb``,
    bounded by ``max_cpu``/``max_memory_mb``) and reservations of
    ``reserve_fraction`` of them. A create returns once the task runs.

    **Exec and files** go to the engine of the task's node, its address taken
    from the node label ``engine_label`` (``unix://`` or ``tcp://``; TLS with
    ``tls_ca``/``tls_cert``/``tls_key``, the same material as the manager),
    through the session's agent: the
    held process group, the 5 s kill, deadlines, the spool, confined file transfer,
    commands that outlive the server, kernels' ports dialled inside.

    **Networks.** ``egress``: the node's default bridge. ``internal``: an
    internal, attachable overlay network per owner (``internal_network`` plus
    a hash of the owner), spanning nodes, no route out, with a subnet the
    provider picks from ``network_pool`` (``network_prefix`` long, never the
    swarm's default pool); removed with its last session. Egress sessions of
    different owners share the node's default bridge (no per-owner egress
    network on a swarm yet). ``none``: the task starts on the default bridge (Swarm in API 1.41
    cannot start a task without a network) and is disconnected from it on its
    node before the session is handed out, so commands only ever see loopback.

    **Deployments** work as on the docker provider: the deployment's label is on
    every service, container, volume, network and record, and on every query of
    the manager and the nodes.

    **Persistent workspaces** are volumes ``tai-sbx-<deployment tag>-<key>`` local
    to a node. The node holding one is recorded in a swarm config
    (``tai-ws-<hash of deployment and key>``,
    labelled with the key, node and owner) on the manager, so any server finds
    it; a session with that key is constrained to that node. A new key goes
    where the scheduler puts the session, and is recorded then.

    **Node loss.** A session whose node is down answers SandboxUnavailableError
    (its engine cannot be reached, or the manager reports the node down); other
    nodes' sessions are untouched. ``reap`` removes services whose task has
    ended (a node that came back kills what it ran) or whose node left the swarm.

    **Images** are not pulled: each node must hold the session image (``.ci/swarm``
    loads it with ``docker save | docker load``); run the engines with
    ``DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1`` so a task never tries a registry.

    Not available on a Swarm service (API 1.41): ``no_new_privileges`` (the
    default ``cap_drop=ALL`` still leaves a setuid program no capability), and
    the warm pool (``pool_size`` is ignored).
    """

    kind = "swarm"
    max_isolation = "container"
    networks = frozenset({"egress", "internal", "none"})
    supports_limits = True

    base_url = Unicode(
        help="""The swarm manager's engine (unix:// or tcp://; with tls_* set, tcp:// uses TLS).
        Default: $DOCKER_HOST, else unix:///var/run/docker.sock.""",
    ).tag(config=True)

    tls_ca = Unicode("", help="CA certificate (PEM) the manager's and the nodes' tcp:// engines are checked against.").tag(config=True)
    tls_cert = Unicode("", help="Client certificate (PEM) for the manager's and the nodes' tcp:// engines.").tag(config=True)
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

    start_timeout = Float(
        60.0, help="Longest a create waits for its task to run (an unplaceable session is removed then)."
    ).tag(config=True)

    node_timeout = Float(
        10.0, help="Longest a call to a node's engine may wait for it (a frozen node answers no later)."
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        tls = TlsMaterial(self.tls_ca, self.tls_cert, self.tls_key) if self.tls_cert else None
        self._engine = SwarmEngine(self.base_url, tls=tls, scope=self.scope.labels)
        self._engine.share.per_principal = self.engine_threads_per_user
        self._commands = CommandRegistry()
        self._workspaces = WorkspaceRecords(self._engine, self.scope, self.own_labels, self.log)
        self._nodes = NodeEngines(tls=tls, timeout=self.node_timeout, agent_site=self._agent_site_for,
                                  scope=self.scope.labels, direct_agent=self.agent_transport == "auto", log=self.log)

    @property
    def manager(self) -> SwarmEngine:
        return self._engine  # type: ignore[return-value]

    def _agent_site_for(self, engine: SwarmEngine) -> ContainerSite:
        engine.share.per_principal = self.engine_threads_per_user
        return agent_site(self, engine, self._commands, answer_within=self.node_timeout, current_end=self._current_end)

    async def _current_end(self, session_id: str) -> float | None:
        """The session's end as its service's labels say now (another server may have moved it)."""
        found = await self.manager.services(f"{LABEL_SESSION}={session_id}")
        try:
            return self._spec_from(found[0])[3] if found else None
        except (KeyError, ValueError, SandboxError):
            return None

    async def _connect(self) -> None:
        await self._engine.connect()

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

    def _task_template(
        self, spec: SessionSpec, labels: Mapping[str, str], network: str | None, pin: str | None,
        agent: tuple[str, str],
    ) -> dict[str, Any]:
        """The service's task: the agent as PID 1, from ``agent`` (its volume and architecture)."""
        types = docker_sdk().types
        session_id = labels[LABEL_SESSION]
        ceiling = self.disk_limit_mb if self.disk_limit_mb > 0 else None
        if spec.durability == "persistent":
            key = str(spec.workspace_key)
            volume_labels = {**self.own_labels, LABEL_WORKSPACE: key}
            if spec.owner is not None:
                volume_labels[LABEL_OWNER] = spec.owner
            mounts = [types.Mount(WORKSPACE, self.scope.workspace_volume(key), type="volume", labels=volume_labels)]
        else:
            # a plain anonymous volume: one with driver options is made by the node as a volume of its own,
            # which the node then leaves behind when the task goes (so the workspace is not capped on swarm)
            workspace_labels = {**self.own_labels, LABEL_SESSION: session_id}
            mounts = [types.Mount(WORKSPACE, None, type="volume", labels=workspace_labels)]
        read_only = bool(ceiling or self.read_only_rootfs)
        if read_only:
            size = ceiling << 20 if ceiling else None
            mounts.append(types.Mount(SCRATCH, None, type="tmpfs", tmpfs_mode=0o1777, tmpfs_size=size))
        env = {"HOME": WORKSPACE, "SANDBOX_WORKSPACE": WORKSPACE, **spec.env}
        volume, arch = agent
        mounts.append(types.Mount(AGENT_DIR, volume, type="volume", read_only=True))
        cap_add = list(self.cap_add)
        if labels.get(LABEL_USER):  # the agent becomes the session user for each command (see DockerSandbox)
            cap_add = sorted({*cap_add, *AGENT_USER_CAPABILITIES})
        container = types.ContainerSpec(
            self._image_of(spec),
            command=[AGENT_PATH, "serve"],
            env=[f"{k}={v}" for k, v in env.items()],
            workdir=WORKSPACE,
            user="0:0",
            labels=dict(labels),
            mounts=mounts,
            init=False,
            read_only=read_only or None,
            cap_drop=list(self.cap_drop) or None,
            cap_add=cap_add or None,
        )
        fraction = min(max(self.reserve_fraction, 0.0), 1.0)
        resources = types.Resources(
            cpu_limit=int(spec.cpu * 1e9) if spec.cpu else None,
            mem_limit=spec.memory_mb << 20 if spec.memory_mb else None,
            cpu_reservation=int(spec.cpu * 1e9 * fraction) if spec.cpu and fraction else None,
            mem_reservation=int((spec.memory_mb << 20) * fraction) if spec.memory_mb and fraction else None,
        )
        if self.pids_limit > 0:
            resources.setdefault("Limits", {})["Pids"] = self.pids_limit
        constraints = [*self.constraints, *([f"node.id=={pin}"] if pin else []), f"node.platform.arch=={arch}"]
        placement = types.Placement(
            constraints=constraints or None,
            preferences=[("spread", label) for label in self.spread] or None,
        )
        return types.TaskTemplate(
            container,
            resources=resources,
            restart_policy=types.RestartPolicy(condition="none"),
            placement=placement,
            networks=[{"Target": network}] if network else None,
        )

    async def _wait_running(self, service_id: str, image: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``(task, node)``: the service's task once it runs, with its node once read; a task that ends first,
        or no start in time, raises. Once the task is on a node, that node's engine is asked too: its container
        runs about 50-100 ms before the manager hears so from the node."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.start_timeout
        waiting = "no task yet"
        node: dict[str, Any] | None = None
        while loop.time() < give_up:
            tasks = await self.manager.tasks(service_id)
            if tasks:
                task = tasks[0]
                status = task.get("Status") or {}
                state, error = status.get("State", ""), status.get("Err", "")
                if state == "running" and (status.get("ContainerStatus") or {}).get("ContainerID"):
                    return task, node
                if state == "starting" and task.get("NodeID"):
                    # the node starts the container: its engine is asked closely, the manager again in a while
                    if node is None or node.get("ID") != task["NodeID"]:
                        node = await self.manager.node(task["NodeID"])
                    ask_manager_at = min(give_up, loop.time() + _NODE_WATCH_SECONDS)
                    while loop.time() < ask_manager_at:
                        container_id = await self._running_on_node(task, node)
                        if container_id is not None:
                            return _running(task, container_id), node
                        await asyncio.sleep(_NODE_POLL_SECONDS)
                    continue
                if state not in STARTING_STATES and state != "running":
                    if "no such image" in error.lower() or ("not found" in error.lower() and image in error):
                        raise _reject(
                            f"image {image!r} is not on the swarm node that took the session: load it on every "
                            f"node (docker save {image} | docker -H NODE load) ({error})"
                        )
                    raise SandboxError(f"the session's task did not start: {state}: {error}")
                waiting = f"{state}: {error}" if error else state
            await asyncio.sleep(_POLL_SECONDS)
        raise SandboxUnavailableError(
            f"the swarm did not start the session within {self.start_timeout:g} s ({waiting})"
        )

    async def _running_on_node(self, task: dict[str, Any], node: dict[str, Any] | None) -> str | None:
        """The id of the task's container once its node's engine runs it (None: not yet, or the node cannot be
        asked; the manager's word is waited for then)."""
        address = (((node or {}).get("Spec") or {}).get("Labels") or {}).get(self.engine_label)
        if not address or ((node or {}).get("Status") or {}).get("State") != "ready":
            return None
        try:
            engine = await self._nodes.engine(address)
            found = await engine.containers(f"com.docker.swarm.task.id={task['ID']}", what="find a task's container")
        except SandboxError:
            return None
        return next((str(c["Id"]) for c in found if c.get("State") == "running"), None)

    async def _placement(self, task: dict[str, Any], node: dict[str, Any] | None = None) -> Placement:
        if node is None or node.get("ID") != task.get("NodeID"):
            node = await self.manager.node(task["NodeID"]) if task.get("NodeID") else None
        return placement_of(task, node, self.engine_label)

    async def _node_address(self, placement: Placement) -> str:
        """The engine address of the node a task runs on (SandboxUnavailableError when it cannot be reached)."""
        if placement.state not in ("ready",):
            raise SandboxUnavailableError(
                f"node {placement.hostname} is {placement.state}: its sessions cannot be reached"
            )
        if not placement.address:
            raise SandboxUnavailableError(
                f"node {placement.hostname} has no {self.engine_label} label naming its engine: "
                f"docker node update --label-add {self.engine_label}=tcp://HOST:2376 {placement.node_id}"
            )
        return placement.address

    # -------------------------------------------------------------- sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        self.check_spec(spec)
        spec = self._limited(spec)
        image = self._image_of(spec)
        await self._connect()
        for _ in range(3):
            session = await self._create(spec, image)
            if session is not None:
                return await user_checked(session)
        raise SandboxConflictError(f"workspace {spec.workspace_key!r} is being made by another session meanwhile")

    async def _create(self, spec: SessionSpec, image: str) -> SwarmSession | None:
        session_id = new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = session_labels(session_id, spec, now, expires, self.own_labels)
        agent = await self._nodes.fill_agent_volumes(await self.manager.nodes(), self.engine_label, image)
        labels[LABEL_AGENT] = "1"
        user = await self._session_user(image)
        if user:
            labels[LABEL_USER] = user
        pin = await self._workspaces.pin(spec) if spec.durability == "persistent" else None
        network = self._network_of(spec)
        template = self._task_template(spec, labels, network, pin, agent)
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
            task, node = await self._wait_running(service_id, image)
            placement = await self._placement(task, node)
            session = await self._session_on(placement, session_id, spec, now, expires, service_id, labels)
            if spec.network == "none":
                await session.engine.network_disconnect(session.container_id, "bridge")
            if spec.durability == "persistent" and pin is None and not await self._workspaces.keep(spec, placement.node_id):
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
                raise _reject(f"the swarm manager refused the session: {e.detail}") from None
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
            raise SandboxNotFoundError(f"service {service.get('ID', '?')[:12]} has unreadable session labels: {e}") from None
        tasks = await self.manager.tasks(service["ID"])
        if not tasks:
            raise SandboxNotFoundError(f"session {session_id} has no task")
        task = tasks[0]
        node = await self.manager.node(task["NodeID"]) if task.get("NodeID") else None
        if (task.get("Status") or {}).get("State") == "starting":  # its node may run it already (_wait_running)
            container_id = await self._running_on_node(task, node)
            if container_id is not None:
                task = _running(task, container_id)
        placement = await self._placement(task, node)
        if placement.task_state != "running" and placement.state in ("ready", "removed"):
            raise SandboxNotFoundError(
                f"session {session_id} ended: its task is {placement.task_state} ({placement.task_error or 'no error'})"
            )
        labels = (service.get("Spec") or {}).get("Labels") or {}
        # a node down or gone raises
        return await self._session_on(placement, session_id, spec, created, expires, service["ID"], labels)

    async def _session_on(
        self, placement: Placement, session_id: str, spec: SessionSpec, created: float, expires: float,
        service_id: str, labels: Mapping[str, str],
    ) -> SwarmSession:
        """The session of a running task, on its node's engine."""
        address = await self._node_address(placement)
        site = await self._nodes.agent_site(address)
        return site.remember(SwarmSession(
            site, str(placement.container_id), session_id, spec, created, expires,
            engine=await self._nodes.engine(address), user=labels.get(LABEL_USER, ""), service_id=service_id,
            placement=placement,
        ))

    async def get(self, session_id: str) -> SandboxSession:
        if not is_session_id(session_id):
            raise SandboxNotFoundError(f"no swarm sandbox session {session_id!r}")
        vouched = self._nodes.vouched(session_id)  # found here before, its agent connection open: no engine call
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
                    id=session_id, kind=self.kind, spec=spec, isolation=self.max_isolation,
                    workspace=WORKSPACE, created_at=created, expires_at=expires,
                )
            )
        return sorted(infos, key=lambda i: i.created_at)

    async def reap(self) -> list[str]:
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
            placement = await self._placement(tasks[0]) if tasks else None
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
        self, service_id: str, session: SwarmSession | None, network: str | None,
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
        return self.scope.owner_network(self.internal_network, spec.owner) if spec.network == "internal" else None

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

    async def _retime(  # type: ignore[override]
        self, session: SwarmSession, expires_at: float,
    ) -> None:
        """A service's labels can change (its task keeps running): the new end goes in its expires label."""
        await self.manager.set_service_labels(session.service_id, {LABEL_EXPIRES: repr(float(expires_at))})

    async def _teardown(  # type: ignore[override]
        self, session: SwarmSession, remove_workspace: bool,
    ) -> None:
        self._commands.abandon(session.id)
        spec = session.spec
        await self._remove(session.service_id, session, self._network_of(spec))
        if remove_workspace and spec.durability == "persistent":
            key = str(spec.workspace_key)
            try:
                await session.engine.remove_volume(self.scope.workspace_volume(key))
            except EngineRefusedError as e:
                if e.status == 409:
                    raise SandboxConflictError(
                        f"workspace {key!r} is in use by another session: destroy that one first"
                    ) from None
                raise
            await self._workspaces.forget(key)
        self.log.debug("sandbox-swarm: destroyed %s", session.id)

    async def close(self) -> None:
        await asyncio.gather(*(c.kill() for c in self._commands.all()), return_exceptions=True)
        await self._nodes.close()
        await self._engine.close()
