"""How the docker provider starts a session's container: the engine's options for a spec (its limits, the
disk ceiling, capabilities, the workspace mount, the session agent as PID 1) and the start itself, with
the engine's refusals of what the spec asks turned into spec rejections."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import Any

from ...contract import SandboxError, SandboxUnavailableError, SessionSpec
from .._docker_agent import AGENT_USER_CAPABILITIES, AgentVolumes, is_missing_agent, with_agent
from .._docker_disk import scratch_tmpfs, workspace_driver
from .._docker_networks import full_network_error
from .._docker_sandbox import ContainerSandbox, how_to_get, rejected
from ..docker_engine import DockerEngine, EngineRefusedError, MissingImageError, docker_sdk
from ..docker_engine.names import LABEL_AGENT, WORKSPACE


class ContainerStarts:
    """Starts session containers on ``engine`` as the provider ``sandbox``'s settings say (read at each
    start, so a trait changed after construction counts)."""

    def __init__(self, sandbox: ContainerSandbox, engine: DockerEngine) -> None:
        self._sandbox = sandbox
        self._engine = engine
        self.agent_volumes = AgentVolumes(engine)
        #: the engine's architecture (which agent binary its containers run), once asked
        self._arch: str | None = None

    def options(
        self,
        spec: SessionSpec,
        name: str,
        labels: Mapping[str, str],
        volume_labels: Mapping[str, str],
        network: str | None,
        agent_volume: str,
        user: str = "",
        workspace: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The SDK's container options for ``spec`` (its limits already in force); ``workspace``: the volume
        of a persistent spec's workspace (DockerSandbox._workspace); ``extra``: options of a session behind an
        egress gateway (its ``environment`` goes under the spec's env; see docker/gateway.py)."""
        extra = dict(extra or {})
        sandbox = self._sandbox
        types = docker_sdk().types
        ceiling = sandbox.disk_limit_mb if sandbox.disk_limit_mb > 0 else None
        if spec.durability == "persistent":
            if workspace is None:
                raise SandboxError("a persistent session's container needs its workspace volume named")
            mount = types.Mount(WORKSPACE, workspace, type="volume")
        else:
            driver = workspace_driver(ceiling) if ceiling else None
            mount = types.Mount(
                WORKSPACE, None, type="volume", labels=dict(volume_labels), driver_config=driver
            )
        options: dict[str, Any] = {
            "name": name,
            "labels": dict(labels),
            "environment": {
                "HOME": WORKSPACE,
                "SANDBOX_WORKSPACE": WORKSPACE,
                **extra.pop("environment", {}),
                **spec.env,
            },
            "working_dir": WORKSPACE,
            "mounts": [mount],
            "cap_drop": list(sandbox.cap_drop) or None,
            "cap_add": list(sandbox.cap_add) or None,
            "security_opt": ["no-new-privileges"] if sandbox.no_new_privileges else None,
            "privileged": False,
            "detach": True,
            **extra,
        }
        if network is not None:
            options["network"] = network
        else:
            options["network_mode"] = "none"
        if spec.cpu is not None:
            options["nano_cpus"] = int(spec.cpu * 1e9)
        if spec.memory_mb is not None:
            options["mem_limit"] = options["memswap_limit"] = f"{spec.memory_mb}m"
        if sandbox.pids_limit > 0:
            options["pids_limit"] = sandbox.pids_limit
        if ceiling or sandbox.read_only_rootfs:
            options["read_only"] = True
            options["tmpfs"] = scratch_tmpfs(ceiling)
        # the agent is root; commands and file operations run as the session user (LABEL_USER), which
        # needs the capabilities to become that user and to signal its processes: a command loses them
        # all as it becomes a user other than root
        options = {**with_agent(options, agent_volume), "user": "0:0"}
        if user:
            options["cap_add"] = sorted({*(options.get("cap_add") or ()), *AGENT_USER_CAPABILITIES})
        options["labels"][LABEL_AGENT] = "1"
        return options

    async def start(
        self,
        spec: SessionSpec,
        name: str,
        labels: Mapping[str, str],
        volume_labels: Mapping[str, str],
        network: str | None = None,
        *,
        user: str | None = None,
        image: str | None = None,
        workspace: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Create and start a container; the engine's refusals of what the spec asks are spec rejections.
        ``user``: the session's user (None: the provider's, else the image's); ``image``: another than the
        spec's (a fork's); ``workspace``: a persistent spec's workspace volume; ``extra``: see :meth:`options`."""
        image = image or self._sandbox._image_of(spec)
        try:
            if user is None:
                user = await self.session_user(image)
            arch = await self.engine_arch()
            for attempt in (1, 2):
                volume = await self.agent_volumes.volume_for(arch, image)
                options = self.options(
                    spec,
                    name,
                    labels,
                    volume_labels,
                    network,
                    agent_volume=volume,
                    user=user,
                    workspace=workspace,
                    extra=extra,
                )
                try:
                    return await self._engine.create_container(image, options)
                except EngineRefusedError as e:
                    if attempt == 2 or not is_missing_agent(e):
                        raise
                    self.agent_volumes.forget(
                        arch, image
                    )  # removed behind our back: the engine made an empty one
            raise AssertionError("unreachable")
        except MissingImageError:
            raise self.missing_image(image) from None
        except EngineRefusedError as e:
            if e.status is not None and 400 <= e.status < 500 and e.status != 409:
                raise rejected(f"the Docker engine refused the session: {e.detail}") from None
            full = full_network_error(e, type(self._sandbox).__name__, self._sandbox.network_prefix, network)
            if full is not None:
                raise full from None
            raise

    async def engine_arch(self) -> str:
        """The engine's ``Architecture``, asked at the first start."""
        if self._arch is None:
            info = await self._engine.blocking(lambda: self._engine.api.info())
            self._arch = str(info.get("Architecture") or "") or platform.machine()
        return self._arch

    async def session_user(self, image: str) -> str:
        """Who a session's commands run as: the provider's ``user``, else the image's USER ('' = root)."""
        try:
            return self._sandbox.user or await self._engine.image_user(image)
        except MissingImageError:
            raise self.missing_image(image) from None

    def missing_image(self, image: str) -> SandboxError:
        """A spec's image the engine lacks is the caller's to change (400); the provider's own default image
        missing stops every create, the operator's to fix (503)."""
        sandbox = self._sandbox
        if image == sandbox.default_image:
            setting = (
                "DockerSandbox.image" if sandbox.image else "the default image: DockerSandbox.image is empty"
            )
            return SandboxUnavailableError(
                f"no session can start: the provider's image {image!r} ({setting}) is not on the Docker engine at "
                f"{sandbox.base_url}: {how_to_get(image)}"
            )
        return rejected(
            f"image {image!r} is not on the Docker engine at {sandbox.base_url}: {how_to_get(image)}"
        )
