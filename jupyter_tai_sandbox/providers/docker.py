"""sandbox-docker: each session is one container on a Docker engine.

The provider is split along its seams (no module imports one above it):

``docker_engine``     :class:`DockerEngine`, every call to the engine (reused by other providers)
``_docker_stream``    an exec's attached stream over asyncio (the engine's hijacked HTTP)
``_docker_archive``   tar archives in and out (small files of the provider's own)
``_docker_agent``     the session agent: its read-only volume, its place as PID 1, its channel
``_docker_session``   :class:`DockerSession`, the container base's session plus the engine's figures
``_docker_pool``      :class:`WarmPool`, pre-started containers and their session records
``_docker_names``     labels, prefixes and paths on the engine
``_docker_networks``  session networks: their subnets, locks and host firewall
``docker``            :class:`DockerSandbox`, the configurable provider (this module)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import platform
import time
from collections.abc import Mapping, Sequence
from typing import Any

from traitlets import Enum, Float, Integer, Unicode

from ..contract import (
    SandboxCapacityError,
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxSpecRejectedError,
    SessionInfo,
    SessionSpec,
    session_gone,
)
from ._common import new_session_id
from ._docker_agent import (
    AGENT_USER_CAPABILITIES,
    AgentVolumes,
    agent_site,
    is_missing_agent,
    with_agent,
)
from ._docker_disk import scratch_tmpfs, workspace_driver
from ._docker_names import (
    LABEL,
    LABEL_AGENT,
    LABEL_CONSUMER,
    LABEL_CREATED,
    LABEL_DEPLOYMENT,
    LABEL_EXPIRES,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_RECORD,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TTL,
    LABEL_USER,
    LABEL_WORKSPACE,
    RECORD_PREFIX,
    TTL_PREFIX,
    VOLUME_PREFIX,
    WORKSPACE,
    Deployment,
    is_session_id,
    session_labels,
)
from ._docker_networks import HostFirewall, SessionBridges
from ._docker_pool import PooledSession, Ready, WarmPool
from ._docker_session import DockerSession
from ._docker_ttl import TtlRecords, expiries, retimed
from .container import KILL_LIMIT_SECONDS, CommandRegistry
from .container.command import in_background
from .container.sandbox import (
    ContainerSandbox,
    how_to_get,
    rejected,
    spec_from_labels,
    user_checked,
)
from .docker_engine import (
    DockerEngine,
    EngineRefusedError,
    MissingImageError,
    docker_sdk,
)

__all__ = [
    "KILL_LIMIT_SECONDS",
    "LABEL",
    "LABEL_CONSUMER",
    "LABEL_DEPLOYMENT",
    "LABEL_OWNER",
    "LABEL_POOL",
    "LABEL_RECORD",
    "LABEL_SESSION",
    "LABEL_SPEC",
    "LABEL_TTL",
    "LABEL_WORKSPACE",
    "RECORD_PREFIX",
    "TTL_PREFIX",
    "VOLUME_PREFIX",
    "WORKSPACE",
    "Deployment",
    "DockerEngine",
    "DockerSandbox",
    "DockerSession",
]


class DockerSandbox(ContainerSandbox):
    """sandbox-docker: each session is one container on a Docker engine.

    **Deployments.** The provider works inside one deployment (``deployment``):
    its label ``jupyter-tai-sandbox.deployment`` is on every container, volume,
    network and record it makes, and on every engine query (the engine object
    adds it, see ``docker_engine``), so it sees, gets, lists, reaps, pools and
    counts only its deployment's sessions, and admin rights reach no further.
    Servers that name the same deployment share its sessions (a restarted
    server, or servers set up to share on purpose); others on the engine are
    invisible to each other.

    **Sessions.** A session is a container running the session agent as PID 1
    (``_docker_agent``): it runs the session's commands, file transfers and path
    look-ups, and reaps what commands leave behind. The image needs nothing
    (no shell, no ``/tmp``): the agent is a static program on a read-only volume.
    Its labels (``jupyter-tai-sandbox.session``, ``.deployment``, ``.consumer``,
    ``.owner``, ``.created``, ``.expires``, ``.spec`` with env *names* only) let
    any DockerSandbox of the deployment -- a restarted server included -- find,
    list and reap it; containers without them are never touched. The spec's
    env values live only in the container's environment.

    **Workspaces.** ``/workspace`` is an anonymous volume removed with the
    container (ephemeral), or the named volume
    ``tai-sbx-<deployment tag>-<workspace_key>`` (persistent; the tag is a short
    hash of the deployment, so two deployments' same key are two volumes), which survives destroy and reap and goes only with
    ``destroy(remove_workspace=True)``. A persistent volume records the owner
    who made it (label ``jupyter-tai-sandbox.owner``); a spec with another
    owner finds no such workspace and never mounts it (``owner=None``, direct
    use or an admin door, skips the check; a volume without an owner, made
    before owners were recorded, is anyone's).

    **Disk ceiling.** With ``disk_limit_mb`` (the default), the root filesystem is
    read-only and the ephemeral workspace and /tmp are tmpfs of at most that size
    (see ``_docker_disk``): nothing a session writes lands on the engine's disk.
    A persistent workspace is a named volume on the engine's storage, not capped.

    **Operator limits.** Every session gets cpu and memory limits (NanoCpus,
    Memory): ``default_cpu`` / ``default_memory_mb`` when the spec names none,
    and a spec over ``max_cpu`` / ``max_memory_mb`` or under the engine's
    minimum (0.01 CPU, 6 MiB) is rejected, never run uncapped. Images are the
    configured ``image`` and ``allowed_images`` (:meth:`image_allowed`, which
    the server asks for callers who are not admins); an image that is not on
    the engine, or no valid reference, is a SandboxSpecRejectedError.

    **Networks.** ``none`` has no network. ``egress`` joins a bridge of the
    session's owner with a route out (``egress_network`` plus a short hash of
    deployment and owner), ``internal`` an internal bridge of the owner's (no
    route out, no address of this machine on it; ``internal_network`` plus
    the hash). No session reaches another owner's session or any other
    container; egress bridges have inter-container traffic off (an egress
    session reaches no session at all), while an owner's internal sessions
    reach each other on their internal bridge. They
    are made on demand, each with a small subnet (``network_prefix``) the
    provider picks from ``network_pool``, and removed when their last session
    goes (a reap removes those a crash left). Where the server can, host
    firewall rules keep sessions from the host and 169.254.0.0/16
    (``egress_firewall``, see ``_docker_networks``).

    **Commands** are the agent's (``agent/PROTOCOL.md``): it holds each command's
    process group while it runs or a process it started still holds its output;
    every stop kills that group and the command's own process, with a fixed limit
    of 5 s (a pty command works the same way on its terminal's session). The agent
    keeps each command and a bounded ring of its output, so a command outlives
    the server that started it (see the container base).

    **TTL changes.** Container labels cannot change, so a session's new end is
    a small record volume on the engine (``_docker_ttl``), read by get(), list()
    and reap() in the round of engine calls they already make.

    **Warm pool.** With ``pool_size`` > 0, containers for the default spec are
    started ahead and handed out at create (see ``_docker_pool``).

    **Transport.** Blocking SDK calls run in the engine object's worker threads
    (``docker_engine``). Each session's agent channel is one asyncio connection,
    no thread per command: the agent's socket itself for a root server on the
    engine's host (``agent_transport``), else an exec stream of its relay
    (``_docker_stream``).
    """

    kind = "docker"
    max_isolation = "container"
    networks = frozenset({"egress", "internal", "none"})
    supports_limits = True

    egress_network = Unicode(
        "tai-sbx-egress",
        help="""Base name of the Docker networks that network='egress' sessions join: one bridge per owner
        (this name, '-', a short hash of deployment and owner) with a route out and inter-container
        traffic off, made on demand and removed with its last session. The warm pool's containers wait
        on '<this name>-pool-<deployment tag>', which reaches nothing.""",
    ).tag(config=True)

    egress_firewall = Enum(
        ["auto", "require", "off"],
        "auto",
        help="""Host firewall rules (iptables) that keep sessions on the provider's bridges from the engine's
        host (any of its addresses, the bridge gateway's among them) and from 169.254.0.0/16 (the cloud
        metadata service). 'auto': set them when the server can (it runs as root, iptables is installed,
        the engine is a unix:// socket whose bridges are in the server's network namespace), else warn
        once; 'require': refuse egress and internal sessions when it cannot; 'off': none.""",
    ).tag(config=True)

    pool_size = Integer(
        0,
        help="""Warm pool: how many pre-started containers wait for sessions of the default spec (the
        default image, ephemeral, egress network, the default cpu/memory limits; any env, which is then
        given to each command). A create takes one instead of starting a container, and the pool refills
        in the background. A pooled container serves one session only. With 2 or more, an owner who took
        from the pool in the last 10 minutes gets a spare waiting on their own egress network (at most
        pool_size // 2 spares), so their next create joins no network. 0 turns the pool off.""",
    ).tag(config=True)

    pool_idle_seconds = Float(
        3600.0,
        help="""Longest a pooled container waits unclaimed: older ones are replaced, and any provider's
        reap removes an unclaimed pooled container past this age (at once when its owning process on this
        host is gone). close() removes the pool's containers.""",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._engine = DockerEngine(
            self.base_url,
            timeout=self.engine_timeout_seconds,
            slow_timeout=self.engine_slow_timeout_seconds,
            scope=self.scope.labels,
        )
        self._engine.share.per_principal = self.engine_threads_per_user
        if self.agent_transport == "exec":
            self._engine.direct_agent = False
        self._bridges = SessionBridges(
            self._engine, locks=self._networks, labels=self.own_labels, pick_subnet=self._pick_subnet,
            firewall=HostFirewall(self.egress_firewall, self.base_url, self.scope.tag, self.log),
        )
        self._ttls = TtlRecords(self._engine, self.own_labels)
        self._agent_site = agent_site(self, self._engine, CommandRegistry(), answer_within=self.engine_timeout_seconds,
                                      current_end=self._current_end)
        #: the engine's architecture (which agent binary its containers run), once asked
        self._arch: str | None = None
        self._agent_volumes = AgentVolumes(self._engine)
        self._pool = WarmPool(
            self._engine,
            self._start_pooled,
            size=self.pool_size,
            idle_seconds=self.pool_idle_seconds,
            labels=self.own_labels,
            log=self.log,
        )

    @property
    def engine(self) -> DockerEngine:
        return self._engine

    async def _connect(self) -> None:
        if not self._engine.connected:
            await self._engine.connect()
            await self._choose_default_image()
            self._pool.fill_soon()
        elif not self._image_chosen:
            await self._choose_default_image()

    # ------------------------------------------------------------ containers

    def _options(
        self, spec: SessionSpec, name: str, labels: Mapping[str, str], volume_labels: Mapping[str, str], network: str | None,
        agent_volume: str, user: str = "",
    ) -> dict[str, Any]:
        """The SDK's container options for ``spec`` (its limits already in force)."""
        types = docker_sdk().types
        ceiling = self.disk_limit_mb if self.disk_limit_mb > 0 else None
        if spec.durability == "persistent":
            mount = types.Mount(WORKSPACE, self.scope.workspace_volume(str(spec.workspace_key)), type="volume")
        else:
            driver = workspace_driver(ceiling) if ceiling else None
            mount = types.Mount(WORKSPACE, None, type="volume", labels=dict(volume_labels), driver_config=driver)
        options: dict[str, Any] = {
            "name": name,
            "labels": dict(labels),
            "environment": {"HOME": WORKSPACE, "SANDBOX_WORKSPACE": WORKSPACE, **spec.env},
            "working_dir": WORKSPACE,
            "mounts": [mount],
            "cap_drop": list(self.cap_drop) or None,
            "cap_add": list(self.cap_add) or None,
            "security_opt": ["no-new-privileges"] if self.no_new_privileges else None,
            "privileged": False,
            "detach": True,
        }
        if network is not None:
            options["network"] = network
        else:
            options["network_mode"] = "none"
        if spec.cpu is not None:
            options["nano_cpus"] = int(spec.cpu * 1e9)
        if spec.memory_mb is not None:
            options["mem_limit"] = options["memswap_limit"] = f"{spec.memory_mb}m"
        if self.pids_limit > 0:
            options["pids_limit"] = self.pids_limit
        if ceiling or self.read_only_rootfs:
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

    async def _start_container(
        self, spec: SessionSpec, name: str, labels: Mapping[str, str], volume_labels: Mapping[str, str],
        network: str | None = None, *, user: str | None = None,
    ) -> str:
        """Create and start a container; the engine's refusals of what the spec asks are spec rejections.
        ``user``: the session's user (None: this provider's, else the image's)."""
        image = self._image_of(spec)
        try:
            if user is None:
                user = await self._session_user(image)
            arch = await self._engine_arch()
            for attempt in (1, 2):
                volume = await self._agent_volumes.volume_for(arch, image)
                options = self._options(spec, name, labels, volume_labels, network, agent_volume=volume, user=user)
                try:
                    return await self._engine.create_container(image, options)
                except EngineRefusedError as e:
                    if attempt == 2 or not is_missing_agent(e):
                        raise
                    self._agent_volumes.forget(arch, image)  # removed behind our back: the engine made an empty one
            raise AssertionError("unreachable")
        except MissingImageError:
            raise self._missing_image(image) from None
        except EngineRefusedError as e:
            if e.status is not None and 400 <= e.status < 500 and e.status != 409:
                raise rejected(f"the Docker engine refused the session: {e.detail}") from None
            raise

    async def _engine_arch(self) -> str:
        """The engine's ``Architecture``, asked at the first create (whoever connected the engine)."""
        if self._arch is None:
            info = await self._engine.blocking(lambda: self._engine.api.info())
            self._arch = str(info.get("Architecture") or "") or platform.machine()
        return self._arch

    async def _session_user(self, image: str) -> str:
        """Who a session's commands run as: ``user``, else the image's USER ('' = root)."""
        try:
            return self.user or await self._engine.image_user(image)
        except MissingImageError:
            raise self._missing_image(image) from None

    def _missing_image(self, image: str) -> SandboxError:
        return rejected(f"image {image!r} is not on the Docker engine at {self.base_url}: {how_to_get(image)}")

    async def _start_pooled(self, name: str, labels: dict[str, str], volume_labels: dict[str, str],
                            network: str) -> tuple[str, str]:
        """A pooled container waits on the pool's holding network (it reaches nothing), or as an owner's
        spare on ``network``, that owner's egress network; its id and session user."""
        kind = "egress" if network else "pool"
        network = network or self.pool_network
        spec = self._limited(SessionSpec())
        user = await self._session_user(self._image_of(spec))
        async with self._networks.hold(network):
            await self._bridges.ensure(network, kind)
            container_id = await self._start_container(spec, name, labels, volume_labels, network, user=user)
        # its agent connection and environment are ready before a claim: the first command goes at once
        with contextlib.suppress(SandboxError):
            await self._agent_site.warm(container_id)
        return container_id, user

    async def _claim_pooled(self, ready: Ready, labels: Mapping[str, str], spec: SessionSpec) -> str | None:
        """Make a pooled container the session's, moving it to the owner's egress network unless it waits
        there already; its record, or None when that failed (the container is then removed)."""
        network = str(self._network_of(spec))
        if ready.network == network:  # the owner's spare
            return await self._pool.claim(ready, labels, spec.env)
        container_id = ready.container_id
        async with self._networks.hold(network):
            try:
                await self._bridges.ensure(network, "egress")
                await self._engine.network_connect(container_id, network)
            except SandboxError as e:
                self._pool.discard(container_id)
                with contextlib.suppress(SandboxError):
                    await self._bridges.drop(network)
                if isinstance(e, SandboxCapacityError):
                    raise
                self.log.warning("sandbox-docker: a pooled container could not join %s: %s", network, e)
                return None
            record = await self._pool.claim(ready, labels, spec.env)
            if record is None:
                with contextlib.suppress(SandboxError):
                    await self._bridges.drop(network)
                return None
        # off the holding network after the claim (a slow engine call the session need not wait for): it is
        # internal, with no host address and no traffic between its containers, so meanwhile it reaches nothing
        in_background(self._leave_pool_network(container_id))
        return record

    async def _leave_pool_network(self, container_id: str) -> None:
        try:
            await self._engine.network_disconnect(container_id, self.pool_network)
        except SandboxNotFoundError:
            pass  # the session already ended
        except SandboxError as e:
            self.log.warning("sandbox-docker: %s stays on the pool's network (it reaches nothing there): %s",
                             container_id[:12], e)

    def _poolable(self, spec: SessionSpec) -> bool:
        """A spec a pooled container can serve: the default one (its limits in force), env aside."""
        default = self._limited(SessionSpec())
        return (
            self.pool_size > 0
            and spec.image in (None, self.default_image)
            and spec.durability == "ephemeral"
            and spec.network == "egress"
            and (spec.cpu, spec.memory_mb) == (default.cpu, default.memory_mb)
        )

    def _network_of(self, spec: SessionSpec) -> str | None:
        """The owner network a session of ``spec`` joins (None: no network)."""
        if spec.network == "none":
            return None
        base = self.internal_network if spec.network == "internal" else self.egress_network
        return self.scope.owner_network(base, spec.owner)

    @property
    def pool_network(self) -> str:
        """The network pooled containers wait on: internal, no host address, reaching nothing."""
        return f"{self.egress_network}-pool-{self.scope.tag}"

    async def _drop_pooled_networks(self, records: Sequence[Mapping[str, Any]]) -> None:
        """The owner networks of pooled sessions a pool reap may just have removed (it removes their
        containers, not through a teardown), and the pool's holding network, when idle."""
        networks = {self.pool_network}
        for volume in records:
            with contextlib.suppress(KeyError, ValueError, SandboxError):
                networks.add(str(self._network_of(self._session_from_pooled(self._pool.from_record(volume, {})).spec)))
        for network in networks - {"None"}:
            if network != self.pool_network or not self._pool.ready_count():
                await self._bridges.drop_if_idle(network)

    # -------------------------------------------------------------- sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        self.check_spec(spec)
        spec = self._limited(spec)
        self._image_of(spec)
        await self._connect()
        if spec.image is None:  # info() says which image the session runs
            spec = dataclasses.replace(spec, image=self.default_image)
        pooled = self._pool.take(str(self._network_of(spec))) if self._poolable(spec) else None
        session_id = pooled.session_id if pooled is not None else new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = session_labels(session_id, spec, now, expires, self.own_labels)
        labels[LABEL_AGENT] = "1"
        # a pooled container's user was read from the image when it was started
        user = pooled.user if pooled is not None else await self._session_user(self._image_of(spec))
        if user:
            labels[LABEL_USER] = user
        return self._agent_site.remember(await user_checked(await self._create(spec, session_id, labels, now, expires, pooled)))

    async def _create(self, spec: SessionSpec, session_id: str, labels: dict[str, str], now: float,
                      expires: float, pooled: Ready | None) -> DockerSession:
        """The session's container: ``pooled`` (taken from the warm pool) when its claim works, else a new one."""
        if pooled is not None:
            record = await self._claim_pooled(pooled, labels, spec)
            if record is not None:
                self.log.debug("sandbox-docker: created %s in pooled container %s", session_id, pooled.container_id[:12])
                return self._session(pooled.container_id, session_id, spec, now, expires, record=record, exec_env=spec.env,
                                     user=labels.get(LABEL_USER, ""))
        if spec.durability == "persistent":
            await self._workspace(spec)
        names = (f"tai-{session_id}", labels, {**self.own_labels, LABEL_SESSION: session_id})
        network = self._network_of(spec)
        if network is not None:
            async with self._networks.hold(network):
                await self._bridges.ensure(network, spec.network)
                try:
                    container_id = await self._start_container(spec, *names, network, user=labels.get(LABEL_USER, ""))
                except BaseException:
                    with contextlib.suppress(SandboxError):
                        await self._bridges.drop(network)
                    raise
        else:
            container_id = await self._start_container(spec, *names, user=labels.get(LABEL_USER, ""))
        self.log.debug("sandbox-docker: created %s (%s)", session_id, container_id[:12])
        return self._session(container_id, session_id, spec, now, expires, user=labels.get(LABEL_USER, ""))

    def _session(self, container_id: str, session_id: str, spec: SessionSpec, created: float, expires: float, *,
                 record: str | None = None, exec_env: Mapping[str, str] | None = None,
                 env: Sequence[str] | None = None, user: str = "") -> DockerSession:
        """A session of a container. One made by an older version without the agent is still listed, reaped
        and destroyed; its commands fail with the typed error of an agent that does not answer."""
        known = None if env is None else dict(item.split("=", 1) for item in env if "=" in item)
        return DockerSession(self._agent_site, container_id, session_id, spec, created, expires,
                                  env=known, engine=self._engine, record=record, extra_env=exec_env, user=user)

    def _session_from(
        self,
        container_id: str,
        labels: Mapping[str, str],
        env: Sequence[str] | None,
        *,
        record: str | None = None,
        pooled: bool = False,
    ) -> DockerSession:
        spec = spec_from_labels(labels, env)
        return self._session(
            container_id, labels[LABEL_SESSION], spec, float(labels[LABEL_CREATED]), float(labels[LABEL_EXPIRES]),
            record=record, exec_env=spec.env if pooled else None, env=None if pooled else env,
            user=labels.get(LABEL_USER, ""),
        )

    def _session_from_pooled(self, pooled: PooledSession) -> DockerSession:
        """A session in a pooled container: its spec env (not in the container's) goes to every exec."""
        env = [f"{k}={v}" for k, v in pooled.env.items()]
        return self._session_from(pooled.container_id, pooled.labels, env, record=pooled.record, pooled=True)

    async def _get_pooled(self, session_id: str) -> DockerSession:
        pooled = await self._pool.find(session_id)
        try:
            return self._session_from_pooled(pooled)
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(f"session record {pooled.record} is unreadable: {e}") from None

    async def get(self, session_id: str) -> SandboxSession:
        """The session: the one found here before while its agent connection is open (no engine call; see
        ContainerSite.vouched), else as the engine has it."""
        if not is_session_id(session_id):
            raise session_gone(session_id)
        vouched = self._agent_site.vouched(session_id)
        if vouched is not None:
            return vouched
        await self._connect()
        session, records = await asyncio.gather(self._find(session_id), self._ttls.of(session_id))
        return self._agent_site.remember(retimed(session, expiries(records)))

    async def _current_end(self, session_id: str) -> float | None:
        return expiries(await self._ttls.of(session_id)).get(session_id)

    async def _find(self, session_id: str) -> DockerSession:
        if self._pool.knows(session_id):
            return await self._get_pooled(session_id)
        return await self._find_container(session_id)

    async def _find_container(self, session_id: str) -> DockerSession:
        """The session's container: the one named for it (one engine call), else the one labelled for it (an
        older version's, or a renamed one), else a pooled one's record."""
        try:
            attrs = await self._engine.inspect_container(f"tai-{session_id}", what="find a session")
        except SandboxNotFoundError:
            attrs = {}
        if ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_SESSION) != session_id:
            found = await self._engine.containers(f"{LABEL_SESSION}={session_id}", what="find a session")
            if not found:
                return await self._get_pooled(session_id)
            try:
                attrs = await self._engine.inspect_container(found[0]["Id"], what="inspect a session")
            except SandboxNotFoundError:
                raise session_gone(session_id) from None
        try:
            return self._session_from(attrs["Id"], attrs["Config"].get("Labels") or {}, attrs["Config"].get("Env"))
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(f"container {attrs['Id'][:12]} has unreadable session labels: {e}") from None

    async def list(self) -> list[SessionInfo]:
        await self._connect()
        summaries, records, pooled, ttls = await asyncio.gather(
            self._engine.containers(LABEL_SESSION), self._pool.records(), self._pool.containers(),
            self._ttls.of(),
        )
        ttls = expiries(ttls)
        alive = {c["Id"] for c in pooled}
        infos = []
        for summary in summaries:
            try:
                infos.append(retimed(self._session_from(summary["Id"], summary.get("Labels") or {}, None), ttls)._info())
            except (KeyError, ValueError, SandboxError):
                continue
        for volume in records:
            if (volume.get("Labels") or {}).get(LABEL_RECORD) not in alive:
                continue  # its container is gone: the reap removes the record
            try:
                infos.append(retimed(self._session_from_pooled(self._pool.from_record(volume, {})), ttls)._info())
            except (KeyError, ValueError, SandboxError):
                continue
        return sorted(infos, key=lambda i: i.created_at)

    async def reap(self) -> list[str]:
        await self._connect()
        now = time.time()
        reaped = []
        summaries, records, pooled_records = await asyncio.gather(
            self._engine.containers(LABEL_SESSION), self._ttls.of(), self._pool.records()
        )
        ttls = expiries(records)
        for summary in summaries:
            labels = summary.get("Labels") or {}
            try:
                session = retimed(self._session_from(summary["Id"], labels, None), ttls)
                # expired, or dead: its container stopped (an engine restart stops it) and runs nothing again
                expired = session.expires_at <= now or summary.get("State") in ("exited", "dead")
            except (KeyError, ValueError, SandboxError):
                continue
            if expired:
                try:
                    await session.destroy(remove_workspace=False)
                except SandboxNotFoundError:
                    continue  # reaped meanwhile by someone else
                reaped.append(session.id)
        reaped += await self._pool.reap(now, self._abandon, ttls)
        await self._drop_pooled_networks(pooled_records)
        live = {
            str((found.get("Labels") or {}).get(LABEL_SESSION)) for found in [*summaries, *pooled_records]
        } - set(reaped)
        await self._ttls.drop_strays(records, live, now)
        await self._bridges.reclaim(summaries, now)
        await self._agent_volumes.reap()
        if reaped:
            self.log.info("sandbox-docker: reaped %s", ", ".join(reaped))
        return reaped

    # ------------------------------------------------------------------ TTL

    async def _retime(self, session: DockerSession, expires_at: float) -> None:
        await self._ttls.move(session.id, expires_at)

    def _abandon(self, session_id: str) -> None:
        self._agent_site.commands.abandon(session_id)

    async def _teardown(self, session: DockerSession, remove_workspace: bool) -> None:
        """Remove a session's container (and record), its owner's idle network, and on request
        its persistent workspace."""
        self._abandon(session.id)
        self._pool.forget(session.id)
        spec = session.spec
        await self._engine.remove_container(session.container_id, volume=session.record)
        await self._ttls.drop(session.id)
        network = self._network_of(spec)
        if network is not None and not self._pool.wants(network):  # else the owner's spare waits on it
            async with self._networks.hold(network):
                await self._bridges.drop(network, leaving=(session.container_id,))
        if remove_workspace and spec.durability == "persistent":
            volume = self.scope.workspace_volume(str(spec.workspace_key))
            try:
                await self._engine.remove_volume(volume)
            except EngineRefusedError as e:
                if e.status == 409:
                    raise SandboxConflictError(
                        f"workspace {spec.workspace_key!r} is in use by another session: destroy that one first"
                    ) from None
                raise
        self.log.debug("sandbox-docker: destroyed %s", session.id)

    async def close(self) -> None:
        await asyncio.gather(*(c.kill() for c in self._agent_site.commands.all()), return_exceptions=True)
        channels = [known.channel for known in self._agent_site.containers.values()]
        self._agent_site.containers.clear()
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        await self._pool.close()
        if self._engine.connected:  # the networks the pool waited on, when idle (another provider's may use them)
            for network in {self.pool_network, *self._pool.kept_networks}:
                await self._bridges.drop_if_idle(network)
        await self._engine.close()
