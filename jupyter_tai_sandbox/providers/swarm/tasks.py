"""A swarm session's task: its template (the agent as PID 1, limits and reservations, placement), and the
watch that waits for it to run and finds the node and engine it runs on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from ...agent.client import AGENT_DIR, AGENT_PATH
from ...contract import SandboxError, SandboxUnavailableError, SessionSpec
from .._docker_agent import AGENT_USER_CAPABILITIES
from .._docker_disk import SCRATCH
from .._docker_sandbox import ContainerSandbox, rejected
from ..docker_engine import docker_sdk
from ..docker_engine.names import LABEL_OWNER, LABEL_SESSION, LABEL_USER, LABEL_WORKSPACE, WORKSPACE
from .engine import SwarmEngine
from .session import STARTING_STATES, NodeEngines, Placement, placement_of

#: how often a starting task is looked at
POLL_SECONDS = 0.05
#: while a task is starting, its node's engine is asked this often, and the manager again after this long
NODE_POLL_SECONDS = 0.01
NODE_WATCH_SECONDS = 0.5


def task_template(
    sandbox: ContainerSandbox,
    spec: SessionSpec,
    labels: Mapping[str, str],
    network: str | None,
    pin: str | None,
    agent: tuple[str, str],
    *,
    workspace: str | None = None,
    constraints: Sequence[str],
    spread: Sequence[str],
    reserve_fraction: float,
) -> dict[str, Any]:
    """The service's task for ``spec`` under ``sandbox``'s settings: the agent as PID 1, from ``agent`` (its
    volume and architecture); on node ``pin`` when given (a persistent workspace's); ``workspace``: the
    volume of a persistent spec's workspace (WorkspaceRecords.volume)."""
    types = docker_sdk().types
    session_id = labels[LABEL_SESSION]
    ceiling = sandbox.disk_limit_mb if sandbox.disk_limit_mb > 0 else None
    if spec.durability == "persistent":
        key = str(spec.workspace_key)
        volume_labels = {**sandbox.own_labels, LABEL_WORKSPACE: key}
        if spec.owner is not None:
            volume_labels[LABEL_OWNER] = spec.owner
        if workspace is None:
            raise SandboxError("a persistent session's task needs its workspace volume named")
        mounts = [types.Mount(WORKSPACE, workspace, type="volume", labels=volume_labels)]
    else:
        # a plain anonymous volume: one with driver options is made by the node as a volume of its own,
        # which the node then leaves behind when the task goes (so the workspace is not capped on swarm)
        workspace_labels = {**sandbox.own_labels, LABEL_SESSION: session_id}
        mounts = [types.Mount(WORKSPACE, None, type="volume", labels=workspace_labels)]
    read_only = bool(ceiling or sandbox.read_only_rootfs)
    if read_only:
        size = ceiling << 20 if ceiling else None
        mounts.append(types.Mount(SCRATCH, None, type="tmpfs", tmpfs_mode=0o1777, tmpfs_size=size))
    env = {"HOME": WORKSPACE, "SANDBOX_WORKSPACE": WORKSPACE, **spec.env}
    volume, arch = agent
    mounts.append(types.Mount(AGENT_DIR, volume, type="volume", read_only=True))
    cap_add = list(sandbox.cap_add)
    if labels.get(LABEL_USER):  # the agent becomes the session user for each command (see DockerSandbox)
        cap_add = sorted({*cap_add, *AGENT_USER_CAPABILITIES})
    container = types.ContainerSpec(
        sandbox._image_of(spec),
        command=[AGENT_PATH, "serve"],
        env=[f"{k}={v}" for k, v in env.items()],
        workdir=WORKSPACE,
        user="0:0",
        labels=dict(labels),
        mounts=mounts,
        init=False,
        read_only=read_only or None,
        cap_drop=list(sandbox.cap_drop) or None,
        cap_add=cap_add or None,
    )
    fraction = min(max(reserve_fraction, 0.0), 1.0)
    resources = types.Resources(
        cpu_limit=int(spec.cpu * 1e9) if spec.cpu else None,
        mem_limit=spec.memory_mb << 20 if spec.memory_mb else None,
        cpu_reservation=int(spec.cpu * 1e9 * fraction) if spec.cpu and fraction else None,
        mem_reservation=int((spec.memory_mb << 20) * fraction) if spec.memory_mb and fraction else None,
    )
    if sandbox.pids_limit > 0:
        resources.setdefault("Limits", {})["Pids"] = sandbox.pids_limit
    placed = [*constraints, *([f"node.id=={pin}"] if pin else []), f"node.platform.arch=={arch}"]
    placement = types.Placement(
        constraints=placed or None,
        preferences=[("spread", label) for label in spread] or None,
    )
    return types.TaskTemplate(
        container,
        resources=resources,
        restart_policy=types.RestartPolicy(condition="none"),
        placement=placement,
        networks=[{"Target": network}] if network else None,
    )


def running(task: dict[str, Any], container_id: str) -> dict[str, Any]:
    """``task`` as running ``container_id``: what its node's engine said before the manager heard it."""
    status = {
        **(task.get("Status") or {}),
        "State": "running",
        "ContainerStatus": {"ContainerID": container_id},
    }
    return {**task, "Status": status}


class TaskWatch:
    """Where the manager's tasks run: the wait for a new task to run, and its node and engine address (the
    node label ``engine_label``)."""

    def __init__(
        self, manager: SwarmEngine, nodes: NodeEngines, *, engine_label: str, start_timeout_seconds: float
    ) -> None:
        self._manager = manager
        self._nodes = nodes
        self.engine_label = engine_label
        self.start_timeout_seconds = start_timeout_seconds

    async def wait_running(self, service_id: str, image: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``(task, node)``: the service's task once it runs, with its node once read; a task that ends first,
        or no start in time, raises. Once the task is on a node, that node's engine is asked too: its container
        runs about 50-100 ms before the manager hears so from the node."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.start_timeout_seconds
        waiting = "no task yet"
        node: dict[str, Any] | None = None
        while loop.time() < give_up:
            tasks = await self._manager.tasks(service_id)
            if tasks:
                task = tasks[0]
                status = task.get("Status") or {}
                state, error = status.get("State", ""), status.get("Err", "")
                if state == "running" and (status.get("ContainerStatus") or {}).get("ContainerID"):
                    return task, node
                if state == "starting" and task.get("NodeID"):
                    # the node starts the container: its engine is asked closely, the manager again in a while
                    if node is None or node.get("ID") != task["NodeID"]:
                        node = await self._manager.node(task["NodeID"])
                    ask_manager_at = min(give_up, loop.time() + NODE_WATCH_SECONDS)
                    while loop.time() < ask_manager_at:
                        container_id = await self.running_on_node(task, node)
                        if container_id is not None:
                            return running(task, container_id), node
                        await asyncio.sleep(NODE_POLL_SECONDS)
                    continue
                if state not in STARTING_STATES and state != "running":
                    if "no such image" in error.lower() or ("not found" in error.lower() and image in error):
                        raise rejected(
                            f"image {image!r} is not on the swarm node that took the session: load it on every "
                            f"node (docker save {image} | docker -H NODE load) ({error})"
                        )
                    raise SandboxError(f"the session's task did not start: {state}: {error}")
                waiting = f"{state}: {error}" if error else state
            await asyncio.sleep(POLL_SECONDS)
        raise SandboxUnavailableError(
            f"the swarm did not start the session within {self.start_timeout_seconds:g} s ({waiting})"
        )

    async def running_on_node(self, task: dict[str, Any], node: dict[str, Any] | None) -> str | None:
        """The id of the task's container once its node's engine runs it (None: not yet, or the node cannot be
        asked; the manager's word is waited for then)."""
        address = (((node or {}).get("Spec") or {}).get("Labels") or {}).get(self.engine_label)
        if not address or ((node or {}).get("Status") or {}).get("State") != "ready":
            return None
        try:
            engine = await self._nodes.engine(address)
            found = await engine.containers(
                f"com.docker.swarm.task.id={task['ID']}", what="find a task's container"
            )
        except SandboxError:
            return None
        return next((str(c["Id"]) for c in found if c.get("State") == "running"), None)

    async def placement(self, task: dict[str, Any], node: dict[str, Any] | None = None) -> Placement:
        if node is None or node.get("ID") != task.get("NodeID"):
            node = await self._manager.node(task["NodeID"]) if task.get("NodeID") else None
        return placement_of(task, node, self.engine_label)

    def node_address(self, placement: Placement) -> str:
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
