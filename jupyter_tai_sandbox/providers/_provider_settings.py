"""Settings every provider that runs sessions apart from the server shares: its deployment scope, its
cpu and memory limits (docker and swarm through the container base, and vm), and the session networks'
(docker, swarm and vm: their owners' networks are the engine's)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from traitlets import Dict, Enum, Float, Integer, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..contract import SandboxSpecRejectedError, SessionSpec
from ._docker_networks import (
    DEFAULT_NETWORK_POOL,
    DEFAULT_NETWORK_PREFIX,
    HostFirewall,
    NetworkLocks,
    capacity_error,
    check_pool,
    free_subnet,
    taken_subnets,
)
from ._workspaces import server_account
from .docker_engine.names import DEPLOYMENT_ENV, Deployment, check_deployment, default_deployment


def rejected(message: str) -> SandboxSpecRejectedError:
    return SandboxSpecRejectedError(message)


class DeploymentSettings(LoggingConfigurable):
    """The deployment a provider works in, and the labels on everything it makes."""

    extra_labels = Dict(
        value_trait=Unicode(),
        help="""Extra labels put on every session this provider makes, and on its workspaces (decoration:
        what a provider sees is set by `deployment`, not by these).""",
    ).tag(config=True)

    deployment = Unicode(
        help=f"""The deployment this provider works in (${DEPLOYMENT_ENV}): a label on every session,
        workspace, network and record it makes, and a filter on every query, so two deployments on one
        engine or host never see, reap or touch each other's sessions, workspaces or networks, and admin
        rights stop at the deployment. Default: 'user@host:config dir' of the server (the JupyterHub user when
        JUPYTERHUB_USER is set, else the OS user; Jupyter's config dir), which a restarted server finds
        again. Servers that should share sessions (several processes of one service) name the same
        deployment explicitly.""",
    ).tag(config=True)

    home_owner = Unicode(
        help="""The principal whose persistent workspace of a key is the key's unscoped one (the volume or
        image a spec without an owner uses) when no other owner is recorded for it; every other owner's is
        their own (workspace keys are a namespace per owner). Default: the account running the server (the
        one principal of a server that authenticates by token or password).""",
    )

    @default("home_owner")
    def _home_owner_default(self) -> str:
        return server_account()

    @default("deployment")
    def _deployment_default(self) -> str:
        return os.environ.get(DEPLOYMENT_ENV, "").strip() or default_deployment()

    @validate("deployment")
    def _check_deployment(self, proposal: Any) -> str:
        try:
            return check_deployment(proposal["value"])
        except ValueError as e:
            raise TraitError(f"{type(self).__name__}.deployment: {e}") from None

    @property
    def scope(self) -> Deployment:
        """The deployment this provider works in."""
        return Deployment(self.deployment)

    @property
    def own_labels(self) -> dict[str, str]:
        """The labels on everything this provider makes: ``extra_labels`` and the deployment's."""
        return {**self.extra_labels, **self.scope.labels}


class LimitSettings(LoggingConfigurable):
    """A session's cpu and memory: the defaults a spec without them gets, and the most a spec may ask for."""

    #: the least a spec may ask for, and who sets that floor (a provider's own)
    min_cpu = 0.01
    min_memory_mb = 6
    limits_floor = "the Docker engine"

    default_cpu = Float(1.0, help="CPUs a session gets when its spec names none (0: no limit).").tag(
        config=True
    )

    max_cpu = Float(
        2.0, help="Most CPUs a spec may ask for; more is rejected (0: no maximum but the engine's)."
    ).tag(config=True)

    default_memory_mb = Integer(
        1024, help="Memory (MiB) a session gets when its spec names none (0: no limit)."
    ).tag(config=True)

    max_memory_mb = Integer(
        4096, help="Most memory (MiB) a spec may ask for; more is rejected (0: no maximum)."
    ).tag(config=True)

    def limit_fields(self) -> dict[str, Any]:
        """These settings as :class:`SessionLimits` fields (the provider's ``session_limits`` adds its own)."""
        return {
            "supports_limits": True,
            "min_cpu": self.min_cpu,
            "min_memory_mb": self.min_memory_mb,
            "floor_owner": self.limits_floor,
            "max_cpu": self.max_cpu,
            "max_memory_mb": self.max_memory_mb,
            "default_cpu": self.default_cpu,
            "default_memory_mb": self.default_memory_mb,
        }


class NetworkSettings(LoggingConfigurable):
    """Where the owners' session networks come from: their names and the range of their subnets; the locks
    that keep one network's making and removal apart."""

    internal_network = Unicode(
        "tai-sbx-internal",
        help="""Base name of the Docker networks (internal: no route out) that network='internal'
        sessions join: one per owner (this name, '-', a short hash of the owner), made on demand and
        removed with its last session; sessions without an owner join this name itself.""",
    ).tag(config=True)

    network_pool = Unicode(
        DEFAULT_NETWORK_POOL,
        help="""IPv4 range the subnets of session networks (each owner's egress and internal network, and
        the warm pool's) are taken from; the provider picks free ones itself (never from the engine's
        default pools), avoiding every subnet already on the engine. It holds
        2^(network_prefix - its prefix length) networks (1024 by default: up to 512 owners with both
        egress and internal sessions); when they are all in use a session create answers 503
        SandboxCapacityError. Choose a range that no network of the engine's host routes to.""",
    ).tag(config=True)

    network_prefix = Integer(
        DEFAULT_NETWORK_PREFIX,
        help="""Prefix length of one session network's subnet (/26: 64 addresses, room for 61 sessions of one
        owner on one network mode; the owner's next create there answers 503 SandboxCapacityError). Between network_pool's prefix length and 29. An owner's filtered network
        (their sessions with an egress policy and their egress gateway, docker) takes one 4 times larger
        (2 bits shorter: /24 by default, 252 sessions), within network_pool; so does the docker warm pool's
        holding network (253 pooled containers waiting; a larger pool_size keeps 253, with a warning).""",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._networks = NetworkLocks()
        try:
            check_pool(self.network_pool, self.network_prefix)
        except ValueError as e:
            raise TraitError(f"{type(self).__name__}.network_pool/network_prefix: {e}") from None

    def _pick_filtered_subnet(self, networks: list[dict[str, Any]]) -> str:
        """A free subnet of network_pool for a filtered network: 2 bits shorter than network_prefix (all of an
        owner's sessions with an egress policy share it), within the pool; SandboxCapacityError when none."""
        prefix = max(check_pool(self.network_pool, self.network_prefix).prefixlen, self.network_prefix - 2)
        found = free_subnet(self.network_pool, prefix, taken_subnets(networks))
        if found is None:
            raise capacity_error(type(self).__name__, self.network_pool, prefix)
        return found

    def _pick_subnet(self, networks: list[dict[str, Any]]) -> str:
        """A free subnet of network_pool, given every network on the engine; SandboxCapacityError when none."""
        found = free_subnet(self.network_pool, self.network_prefix, taken_subnets(networks))
        if found is None:
            raise capacity_error(type(self).__name__, self.network_pool, self.network_prefix)
        return found


class BridgeSettings(NetworkSettings):
    """Session networks that are bridges of a Docker engine on the server's host (docker, vm): the owners'
    egress bridges, and the host firewall that keeps their sessions from the host."""

    if TYPE_CHECKING:
        # DeploymentSettings', the other base of every provider with bridges

        @property
        def scope(self) -> Deployment: ...

    egress_network = Unicode(
        "tai-sbx-egress",
        help="""Base name of the Docker networks that network='egress' sessions join: one bridge per owner
        (this name, '-', a short hash of deployment and owner) with a route out and inter-container
        traffic off, made on demand and removed after its last session (docker: after
        DockerSandbox.idle_network_seconds). The warm pool's containers wait
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

    def _network_of(self, spec: SessionSpec) -> str | None:
        """The owner bridge a session of ``spec`` joins (None: network ``none``)."""
        if spec.network == "none":
            return None
        base = self.internal_network if spec.network == "internal" else self.egress_network
        return self.scope.owner_network(base, spec.owner)

    def _host_firewall(self, engine_url: str) -> HostFirewall:
        """The host firewall of the owners' bridges on the engine at ``engine_url``."""
        return HostFirewall(
            self.egress_firewall,
            engine_url,
            self.scope.tag,
            self.log,
            setting=f"{type(self).__name__}.egress_firewall",
        )
