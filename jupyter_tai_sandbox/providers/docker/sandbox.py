"""sandbox-docker: each session is one container on a Docker engine (the modules it is made of: the
provider package's docstring)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from traitlets import Float

from ...contract import (
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxUnsupportedError,
    SessionInfo,
    SessionSpec,
    session_gone,
)
from ...images import PYTHON_IMAGE
from ...policy import within_limits
from .._common import new_session_id
from .._docker_agent import (
    agent_site,
    checked_agent_binary,
)
from .._docker_networks import SessionBridges, containers_on_subnet, full_network_error
from .._docker_sandbox import (
    ContainerSandbox,
    user_checked,
)
from .._docker_session import DockerSession, find_container, session_of
from .._provider_settings import BridgeSettings
from ..container import KILL_LIMIT_SECONDS, CommandRegistry
from ..docker_engine import (
    DockerEngine,
)
from ..docker_engine.names import (
    LABEL,
    LABEL_CONSUMER,
    LABEL_DEPLOYMENT,
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
)
from .containers import ContainerStarts
from .forks import ForkImages
from .gateway import EgressGateways, GatewaySettings
from .pool import PooledSession, PoolSettings, Ready, WarmPool
from .pool_networks import PoolNetworks
from .ttl import TtlRecords, expiries, retimed
from .watch import ContainerWatch

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


class DockerSandbox(GatewaySettings, PoolSettings, BridgeSettings, ContainerSandbox):
    """sandbox-docker: each session is one container on a Docker engine, running the session agent as PID 1.

    Everything the provider makes carries its deployment's label, and every engine query asks for it
    (``docker_engine``), so it sees, gets, lists, reaps, pools and counts only its deployment's sessions:
    servers that name one deployment share its sessions, others on the engine never see them. A session's
    labels (session, deployment, consumer, owner, created, expires, spec with env *names* only) let any
    server of the deployment find, list and reap it; the env values live only in the container. The docs'
    page operators/providers/docker.md states the whole behaviour; the provider package's docstring says where each part lives.
    """

    kind = "docker"
    max_isolation = "container"
    networks = frozenset({"egress", "internal", "none"})
    supports_limits = True
    pausable = True
    forkable = True
    egress_policy = True
    _pool_started = False

    idle_network_seconds = Float(
        60.0,
        help="""How long an owner's egress or internal network stays after its last session ends, so that the
        owner's next session joins it instead of making a bridge and its firewall rules again (about 60 ms, a
        fifth of a cold create). It is removed when this time passes with no session on it, when the server
        stops, or by the reap of any server of the deployment. 0 removes it with its last session.""",
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
            self._engine,
            locks=self._networks,
            labels=self.own_labels,
            pick_subnet=self._pick_subnet,
            pick_wide_subnet=self._pick_filtered_subnet,
            firewall=self._host_firewall(self.base_url),
            idle_seconds=self.idle_network_seconds,
        )
        self._ttls = TtlRecords(self._engine, self.own_labels)
        self._watch = ContainerWatch(self._engine)
        self._agent_site = agent_site(
            self,
            self._engine,
            CommandRegistry(),
            answer_within=self.engine_timeout_seconds,
            current_end=self._current_end,
            set_paused=self._set_paused,
            fork=self._fork,
        )
        self._forks = ForkImages(self._engine, self.own_labels, self._agent_site.paused)
        self._starts = ContainerStarts(self, self._engine)
        self._gateways = EgressGateways(
            self._engine,
            self._starts,
            self._bridges,
            self._networks,
            self.scope,
            self,
            self.log,
            labels=self.own_labels,
            egress_network=lambda owner: self.scope.owner_network(self.egress_network, owner),
            filtered_base=lambda: f"{self.egress_network}-gw",
            image=lambda: self.default_image,
            hooks=lambda: self.egress_hooks,
        )
        self._pool = WarmPool(
            self._engine,
            self._start_pooled,
            size=self._pool_size_held(),
            idle_seconds=self.pool_idle_seconds,
            labels=self.own_labels,
            log=self.log,
        )
        self._pool_networks = PoolNetworks(
            self._engine,
            self._pool,
            self._bridges,
            self._networks,
            holding=self.pool_network,
            log=self.log,
            full_error=lambda e, network: full_network_error(
                e, type(self).__name__, self.network_prefix, network
            ),
        )

    def _pool_size_held(self) -> int:
        """``pool_size``, at most what the pool's holding network holds (a subnet 2 bits wider than
        ``network_prefix``); past it a warning says so."""
        holds = containers_on_subnet(max(self.network_prefix - 2, 0))
        if self.pool_size <= holds:
            return self.pool_size
        self.log.warning(
            "sandbox-docker: %s.pool_size=%d is more than the warm pool's holding network holds (%d pooled "
            "containers at network_prefix /%d): the pool keeps %d; a shorter network_prefix holds more",
            type(self).__name__,
            self.pool_size,
            holds,
            self.network_prefix,
            holds,
        )
        return holds

    @property
    def engine(self) -> DockerEngine:
        return self._engine

    async def check_available(self) -> None:
        """The engine answers, and a session could start on it: the session agent's binary for the engine's
        architecture is there and so is the default image; else SandboxUnavailableError saying what to do
        (the status route and the server's start say it, before a create fails on it)."""
        await super().check_available()
        checked_agent_binary(await self._starts.engine_arch())
        image = self.default_image
        if not (self.image or self._image_chosen) and await self._engine.has_image(PYTHON_IMAGE):
            return  # an empty image setting takes the Python image when the engine has it
        if not await self._engine.has_image(image):
            raise self._starts.missing_image(image)

    async def _connect(self) -> None:
        if not self._engine.connected:
            await self._engine.connect()
        if not self._image_chosen:
            await self._choose_default_image()
        if not self._pool_started:  # once, even when a status ping connected the engine first
            self._pool_started = True
            self._pool.fill_soon()

    # ------------------------------------------------------------ containers

    async def _start_pooled(
        self, name: str, labels: dict[str, str], volume_labels: dict[str, str], network: str
    ) -> tuple[str, str]:
        """A pooled container for the default spec (see PoolNetworks.start_on for where it waits); its id and
        session user."""
        spec = within_limits(SessionSpec(), self.session_limits())
        user = await self._starts.session_user(self._image_of(spec))
        container_id = await self._pool_networks.start_on(
            network, lambda on: self._starts.start(spec, name, labels, volume_labels, on, user=user)
        )
        # its agent connection and environment are ready before a claim: the first command goes at once
        with contextlib.suppress(SandboxError):
            await self._agent_site.warm(container_id)
        return container_id, user

    def _poolable(self, spec: SessionSpec) -> bool:
        """A spec a pooled container can serve: the default one (its limits in force), env aside."""
        default = within_limits(SessionSpec(), self.session_limits())
        return (
            self.pool_size > 0
            and spec.image in (None, self.default_image)
            and spec.durability == "ephemeral"
            and spec.network == "egress"
            and spec.egress is None  # a session with a policy starts on its owner's filtered network
            and (spec.cpu, spec.memory_mb) == (default.cpu, default.memory_mb)
        )

    @property
    def pool_network(self) -> str:
        """The network pooled containers wait on: internal, no host address, reaching nothing."""
        return f"{self.egress_network}-pool-{self.scope.tag}"

    def _pooled_owner_networks(self, records: Sequence[Mapping[str, Any]]) -> set[str]:
        networks = set()
        for volume in records:
            with contextlib.suppress(KeyError, ValueError, SandboxError):
                networks.add(
                    str(self._network_of(self._session_from_pooled(self._pool.from_record(volume, {})).spec))
                )
        return networks - {"None"}

    # -------------------------------------------------------------- sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        spec = await self._prepared(spec)
        pooled = self._pool.take(str(self._network_of(spec))) if self._poolable(spec) else None
        session_id = pooled.session_id if pooled is not None else new_session_id()
        # a pooled container's user was read from the image when it was started
        user = pooled.user if pooled is not None else await self._starts.session_user(self._image_of(spec))
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = self._new_labels(session_id, spec, now, expires, user)
        return self._agent_site.remember(
            await user_checked(await self._create(spec, session_id, labels, now, expires, pooled))
        )

    async def _create(
        self,
        spec: SessionSpec,
        session_id: str,
        labels: dict[str, str],
        now: float,
        expires: float,
        pooled: Ready | None,
        image: str | None = None,
        own_image: bool = False,
    ) -> DockerSession:
        """The session's container: ``pooled`` (taken from the warm pool) when its claim works, else a new one
        (of ``image``: a fork's, committed for it when ``own_image``; else the spec's)."""
        if pooled is not None:
            record = await self._pool_networks.claim(pooled, labels, spec.env, str(self._network_of(spec)))
            if record is not None:
                self.log.debug(
                    "sandbox-docker: created %s in pooled container %s", session_id, pooled.container_id[:12]
                )
                return self._own(
                    DockerSession(
                        self._agent_site,
                        pooled.container_id,
                        session_id,
                        spec,
                        now,
                        expires,
                        engine=self._engine,
                        record=record,
                        extra_env=spec.env,
                        user=labels.get(LABEL_USER, ""),
                    )
                )
        workspace = await self._workspace(spec) if spec.durability == "persistent" else None
        names = (f"tai-{session_id}", labels, {**self.own_labels, LABEL_SESSION: session_id})
        network = self._network_of(spec)
        if spec.egress is not None:
            return await self._create_filtered(
                spec, session_id, names, now, expires, labels.get(LABEL_USER, ""), image, workspace, own_image
            )
        if network is not None:
            async with self._networks.hold(network):
                for attempt in range(2):
                    await self._bridges.ensure(network, spec.network)
                    try:
                        container_id = await self._starts.start(
                            spec,
                            *names,
                            network,
                            user=labels.get(LABEL_USER, ""),
                            image=image,
                            workspace=workspace,
                        )
                        break
                    except SandboxNotFoundError as e:
                        # another server removed the network, idle, after it was found here: make it again
                        if attempt or "network" not in str(e).lower():
                            raise
                    except BaseException:
                        with contextlib.suppress(SandboxError):
                            await self._bridges.drop(network)
                        raise
        else:
            container_id = await self._starts.start(
                spec, *names, user=labels.get(LABEL_USER, ""), image=image, workspace=workspace
            )
        self.log.debug("sandbox-docker: created %s (%s)", session_id, container_id[:12])
        return self._own(
            DockerSession(
                self._agent_site,
                container_id,
                session_id,
                spec,
                now,
                expires,
                engine=self._engine,
                user=labels.get(LABEL_USER, ""),
                own_image=own_image,
            )
        )

    async def _create_filtered(
        self,
        spec: SessionSpec,
        session_id: str,
        names: tuple[str, dict[str, str], dict[str, str]],
        now: float,
        expires: float,
        user: str,
        image: str | None,
        workspace: str | None,
        own_image: bool,
    ) -> DockerSession:
        """A session with an egress policy: on its owner's filtered network only, with the owner's gateway
        (made for its first such session) as its DNS and way out, its policy in force there and the
        gateway's CA in the session before the create returns (docker/gateway.py)."""
        filtered = self._gateways.filtered_network(spec.owner)
        policy = spec.egress
        assert policy is not None
        async with self._networks.hold(filtered):
            gateway, _ip, written, container_id = await self._gateways.place(
                spec.owner,
                session_id,
                policy,
                lambda gateway, ip: self._starts.start(
                    spec,
                    *names,
                    filtered,
                    user=user,
                    image=image,
                    workspace=workspace,
                    extra=self._gateways.session_options(gateway, ip),
                ),
            )
        session = self._own(
            DockerSession(
                self._agent_site,
                container_id,
                session_id,
                spec,
                now,
                expires,
                engine=self._engine,
                user=user,
                own_image=own_image,
            )
        )
        try:
            await self._gateways.attach(session, gateway, written)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._teardown(session, False)
            raise
        self.log.debug(
            "sandbox-docker: created %s (%s) behind egress gateway %s",
            session_id,
            container_id[:12],
            gateway.container_id[:12],
        )
        return session

    def _own(self, session: DockerSession) -> DockerSession:
        """``session`` with this provider's egress gateways (its set_egress goes to them)."""
        session.gateways = self._gateways
        return session

    async def _fork(self, source: DockerSession) -> DockerSession:
        """A new session of the source's owner and spec holding its files now (see forks: the workspace,
        and the root filesystem's changes where it is writable; not /tmp, memory or processes)."""
        spec = source.spec
        if spec.egress is not None:  # the policy in force now (another server may have changed it)
            spec = spec.replace(egress=await self._gateways.current(source))
        if spec.durability == "persistent":
            raise SandboxUnsupportedError(
                "a persistent workspace has one live session at a time: fork an ephemeral session",
                operation="fork",
            )
        session_id = new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = self._new_labels(session_id, spec, now, expires, source.user)
        async with self._forks.frozen(source.container_id, session_id) as (image, committed):
            session = await self._create(
                spec, session_id, labels, now, expires, None, image=image, own_image=committed
            )
            try:
                await self._engine.copy_folder(source.container_id, session.container_id, WORKSPACE)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._teardown(session, False)
                raise
        self.log.debug("sandbox-docker: forked %s from %s", session_id, source.id)
        return self._agent_site.remember(await user_checked(session))

    def _session_from(
        self,
        container_id: str,
        labels: Mapping[str, str],
        env: Sequence[str] | None,
        *,
        record: str | None = None,
        pooled: bool = False,
    ) -> DockerSession:
        return self._own(
            session_of(
                self._agent_site, self._engine, container_id, labels, env, record=record, pooled=pooled
            )
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
        # its policy as the gateway has it (a live change is recorded there)
        if session.spec.egress is not None:
            session.spec = session.spec.replace(egress=await self._gateways.current(session))
        return self._agent_site.remember(retimed(session, expiries(records)))

    async def _current_end(self, session_id: str) -> float | None:
        return expiries(await self._ttls.of(session_id)).get(session_id)

    async def _find(self, session_id: str) -> DockerSession:
        if self._pool.knows(session_id):
            return await self._get_pooled(session_id)
        return await self._find_container(session_id)

    async def _find_container(self, session_id: str) -> DockerSession:
        """The session's container (see find_container), else a pooled one's record."""
        attrs = await find_container(self._engine, session_id)
        if attrs is None:
            return await self._get_pooled(session_id)
        self._agent_site.note_state(attrs["Id"], attrs)
        try:
            return self._session_from(
                attrs["Id"], attrs["Config"].get("Labels") or {}, attrs["Config"].get("Env")
            )
        except (KeyError, ValueError, SandboxError) as e:
            raise SandboxNotFoundError(
                f"container {attrs['Id'][:12]} has unreadable session labels: {e}"
            ) from None

    async def list(self) -> list[SessionInfo]:
        await self._connect()
        # the containers from memory kept current by the engine's events (docker/watch.py: a full listing of
        # 1,000 costs the engine alone ~50 ms), the records in the same round
        containers, records, ttl_records = await asyncio.gather(
            self._watch.summaries(), self._pool.records(), self._ttls.of()
        )
        ttls = expiries(ttl_records)
        alive = {c["Id"] for c in containers if LABEL_SESSION not in c["Labels"]}
        sessions = []
        for summary in containers:
            if LABEL_SESSION not in summary["Labels"]:
                continue  # a pooled container (claimed or not): its sessions are in the records
            self._agent_site.note_state(
                summary["Id"], {"State": {"Paused": summary.get("State") == "paused"}}
            )
            try:
                sessions.append(
                    retimed(self._session_from(summary["Id"], summary.get("Labels") or {}, None), ttls)
                )
            except (KeyError, ValueError, SandboxError):
                continue
        # the policies in force of sessions with one (a live change is recorded at their gateway)
        await self._gateways.live_policies([s for s in sessions if s.spec.egress is not None])
        infos = [session._info() for session in sessions]
        for volume in records:
            if (volume.get("Labels") or {}).get(LABEL_RECORD) not in alive:
                continue  # its container is gone: the reap removes the record
            try:
                infos.append(
                    retimed(self._session_from_pooled(self._pool.from_record(volume, {})), ttls)._info()
                )
            except (KeyError, ValueError, SandboxError):
                continue
        return sorted(infos, key=lambda i: i.created_at)

    async def reap(self) -> builtins.list[str]:
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
        await self._pool_networks.drop_idle(self._pooled_owner_networks(pooled_records))
        live = {
            str((found.get("Labels") or {}).get(LABEL_SESSION)) for found in [*summaries, *pooled_records]
        } - set(reaped)
        await self._ttls.drop_strays(records, live, now)
        await self._forks.reap(live, now)
        await self._gateways.reap(summaries, now)
        await self._bridges.reclaim(summaries, now)
        await self._starts.agent_volumes.reap()
        if reaped:
            self.log.info("sandbox-docker: reaped %s", ", ".join(reaped))
        return reaped

    # ------------------------------------------------------------------ TTL

    async def _retime(self, session: DockerSession, expires_at: float) -> None:
        await self._ttls.move(session.id, expires_at)

    async def _set_paused(self, session: DockerSession, paused: bool) -> None:
        """The engine's freeze (the cgroup freezer) or thaw of the session's container (one a fork holds frozen:
        at the fork's end)."""
        if not self._forks.defer(session.container_id, paused):
            await self._engine.set_paused(session.container_id, paused)

    def _abandon(self, session_id: str) -> None:
        self._agent_site.commands.abandon(session_id)

    async def _teardown(self, session: DockerSession, remove_workspace: bool) -> None:
        """Remove a session's container (and record), its owner's idle network, and on request
        its persistent workspace."""
        self._abandon(session.id)
        self._pool.forget(session.id)
        spec = session.spec
        if spec.egress is not None:  # its file at the gateway names its address: out before the address goes
            await self._gateways.detach(session)
        await self._engine.remove_container(session.container_id, volume=session.record)
        if session.own_image:
            await self._forks.drop(session.id)
        await self._ttls.drop(session.id)
        network = self._network_of(spec)
        if spec.egress is not None:
            await self._release_gateway(spec.owner, session.container_id)
        elif network is not None and not self._pool.wants(network):  # else the owner's spare waits on it
            async with self._networks.hold(network):
                await self._bridges.release(network, leaving=(session.container_id,))
        if remove_workspace and spec.durability == "persistent":
            await self._remove_workspace(self._engine, spec)
        self.log.debug("sandbox-docker: destroyed %s", session.id)

    async def _release_gateway(self, owner: str | None, container_id: str) -> None:
        """The owner's gateway and filtered network go with its last session with a policy (a failure is
        the reap's to mend)."""
        async with self._networks.hold(self._gateways.filtered_network(owner)):
            try:
                await self._gateways.release(owner, leaving=(container_id,))
            except SandboxError as e:
                self.log.warning("sandbox-docker: the egress gateway stays for the reap: %s", e)

    async def close(self) -> None:
        await self._gateways.close()
        await self._agent_site.close()
        await self._pool.close()
        if self._engine.connected:
            await self._pool_networks.close()
            await self._bridges.close()
        await self._engine.close()
