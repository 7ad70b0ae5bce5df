"""The docker provider's egress gateways: one per owner, the only way out of that owner's sessions with an
egress policy (``SessionSpec.egress``; issue 52).

A session with a policy joins only its owner's **filtered network** (``<egress_network>-gw-<hash>``): a
bridge with no route out (``internal``), no host address, and traffic between its containers on. The owner's
**gateway container** is on it and on the owner's ordinary egress network (its way out, behind the host
firewall like any egress bridge). The gateway runs the session agent as PID 1 and, as a command of it,
``tai-agent gateway``: a DNS server that answers allowed names with its own address (NXDOMAIN for the rest,
never asked upstream) and proxies on ports 80/443 (and the raw ports a policy names) that check each
connection's Host or SNI against the policy of the session its source address belongs to, resolve the name
themselves and dial what they resolved. The session's DNS is the gateway (the container's ``dns`` option:
docker 20.10's embedded resolver, 127.0.0.11, forwards an internal network's queries to it from the
session's own address; checked on the engine, so /etc/resolv.conf is left as the engine writes it). Any
other address fails at once (no route: the session's neighbour discovery is bounded, SESSION_SYSCTLS), and
the gateway never routes between its two networks (``net.ipv4.ip_forward=0``).

The server speaks to the gateway through files in its tmpfs ``/run/tai-gateway``, written as root through
its agent, each atomically (a temp file renamed over the target): ``gateway.json`` (its address, resolver,
upstream roots), ``sessions/<session ip>.json`` (each session's allow and deny lists and the placeholders of
its secrets: the record of a live change, which any server of the deployment reads back), ``secrets/<name>.json``
(a secret's real value and hosts; rewritten when the value changes: rotation), and ``audit/*.jsonl`` (the
gateway's decisions, which the server moves to the server's audit sink every second). A new session's
address is picked, and its file written, before its container starts, so its policy is in force when the
create returns; the pick is claimed first by making the folder ``claims/<session ip>`` (a mkdir either makes
it or fails: of two servers picking one address at once, one gets it, and the other's withdrawal never takes
the winner's file away). The deployment's CA
(for the secrets' hosts, whose TLS the gateway terminates) lives in a volume the gateways share, and each
session gets it in ``/tmp/tai-sandbox-ca`` with the environment that makes Python, pip, curl, git and Node
trust it.

A gateway goes with its owner's last session with a policy (and in a reap, after a grace), and the CA volume
with the deployment's last gateway. A server that starts finds running gateways by their labels (at a create,
a get or a reap) and watches them: it restarts the gateway command if it died.

What the gateway cannot stop: data the session encodes in requests it is allowed to make to hosts it is
allowed to reach (docs/operators/providers/docker.md says more).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import json
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from traitlets import Unicode
from traitlets.config import LoggingConfigurable

from ...agent import AgentClient, AgentCommand, AgentError
from ...agent.client import AGENT_PATH
from ...contract import (
    SandboxCapacityError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionInfo,
)
from ...contract.egress import EgressHooks, EgressPolicy, SecretGrant
from .._docker_agent import with_agent
from .._docker_networks import REAP_GRACE_SECONDS, NetworkLocks, SessionBridges
from ..container.session import DEFAULT_PATH, ContainerSession
from ..docker_engine import DockerEngine, EngineRefusedError, docker_sdk
from ..docker_engine.names import (
    LABEL,
    LABEL_AGENT,
    LABEL_CREATED,
    LABEL_OWNER,
    VOLUME_PREFIX,
    Deployment,
)

if TYPE_CHECKING:
    from .._docker_agent import AgentVolumes
    from ..container.session import ContainerSession

#: on a gateway container: "gateway"; on the deployment's CA volume: "gateway-ca"
LABEL_ROLE = f"{LABEL}.role"
#: on a gateway container: the filtered network it serves
LABEL_GATEWAY_NETWORK = f"{LABEL}.gateway-network"
#: the gateway's files (a tmpfs of the gateway container, root's alone)
GATEWAY_DIR = "/run/tai-gateway"
#: where the deployment's CA volume is mounted in a gateway
CA_DIR = "/var/lib/tai-gateway/ca"
#: the label of the gateway command among the gateway agent's commands (how a restarted server finds it)
COMMAND_LABEL = "egress-gateway"
#: where a session finds the CA: ``ca.pem`` alone, and ``bundle.pem`` (the image's roots and the CA)
SESSION_CA_DIR = "tmp/tai-sandbox-ca"
#: the image's CA bundle (Debian's path), the start of a session's bundle.pem when it has one
IMAGE_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
#: the environment a session with a policy gets, so its TLS clients trust the gateway's CA
CA_ENV = {
    "SSL_CERT_FILE": f"/{SESSION_CA_DIR}/bundle.pem",
    "REQUESTS_CA_BUNDLE": f"/{SESSION_CA_DIR}/bundle.pem",
    "CURL_CA_BUNDLE": f"/{SESSION_CA_DIR}/bundle.pem",
    "PIP_CERT": f"/{SESSION_CA_DIR}/bundle.pem",
    "GIT_SSL_CAINFO": f"/{SESSION_CA_DIR}/bundle.pem",
    "NODE_EXTRA_CA_CERTS": f"/{SESSION_CA_DIR}/ca.pem",
}
#: a session's neighbour discovery on its filtered network: three probes 50 ms apart, so a connection to any
#: address off the network (the outside, the host, 169.254.169.254: the default route's gateway address has no
#: owner there) fails with EHOSTUNREACH within 0.15 s instead of the kernel's 3 s; the gateway, a neighbour on the
#: same bridge, answers within microseconds
SESSION_SYSCTLS = {
    "net.ipv4.neigh.eth0.mcast_solicit": "3",
    "net.ipv4.neigh.eth0.retrans_time_ms": "50",
}
#: the gateway container's bounds
GATEWAY_MEMORY = "256m"
GATEWAY_PIDS = 256
#: the gateway's tmpfs: 64 MiB of sealed audit files at most (the gateway's own bound) and the small rest
GATEWAY_TMPFS = "mode=0700,size=80m"
#: the largest request body the gateway substitutes placeholders in
BODY_LIMIT = 1 << 20
#: how long after a file's write the gateway has it in force (it polls its directory every 250 ms)
APPLY_SECONDS = 0.6
#: how long a call on a gateway (its files, through its agent) may take before it fails (SandboxUnavailableError)
CALL_SECONDS = 20.0
#: how long a gateway command may take to say it is ready
READY_SECONDS = 15.0
#: the watch's beats: audit files moved every AUDIT_SECONDS, the command and secrets checked every CHECK_SECONDS
AUDIT_SECONDS = 1.0
CHECK_SECONDS = 2.0
#: a claimed audit file (renamed by a server about to read it) older than this was left by a server that died
CLAIMED_STALE_SECONDS = 30.0
#: how many addresses a create tries to claim before it gives up (each taken by another create meanwhile)
CLAIM_TRIES = 8


class AgentStarts(Protocol):
    """What a gateway's start needs of its provider's container starts: the engine's architecture and the
    agent volumes (docker's ContainerStarts; the vm provider's own)."""

    agent_volumes: AgentVolumes

    async def engine_arch(self) -> str: ...


class AgentHolder(Protocol):
    """A session whose agent connection :meth:`EgressGateways.attach` writes the CA through (as root)."""

    async def agent(self) -> AgentClient: ...


class GatewaySettings(LoggingConfigurable):
    """A provider's settings of its egress gateways (docker's and vm's)."""

    egress_resolver = Unicode(
        "",
        help="""DNS server ('host:port' or 'host') the egress gateway asks for the addresses of the names a
        session's policy allows (sessions with an egress policy never ask one themselves: their DNS is the
        gateway, which answers only allowed names). Empty: the resolver the gateway container has, the
        engine's (which asks the engine host's resolvers).""",
    ).tag(config=True)

    egress_upstream_ca = Unicode(
        "",
        help="""Path (on the server) of a PEM file of CA certificates the egress gateway trusts, besides the
        system's, when it connects upstream with TLS on a session's behalf (the hosts of granted secrets,
        whose TLS it terminates to swap the placeholder for the secret). Empty: the system's roots only.""",
    ).tag(config=True)


@dataclass(frozen=True)
class Gateway:
    """An owner's gateway: its container, its address on the filtered ``network``."""

    container_id: str
    ip: str
    network: str
    owner: str | None


@dataclass
class _Watched:
    """What this server keeps of a gateway it watches: its agent connection, the command's output reader,
    the digests of the secret values it last wrote."""

    gateway: Gateway
    task: asyncio.Task[None] | None = None
    client: AgentClient | None = None
    command: AgentCommand | None = None
    drain: asyncio.Task[None] | None = None
    secrets: dict[str, str] = field(default_factory=dict)
    stderr_tail: bytearray = field(default_factory=bytearray)
    #: held while its command is checked or started (a create's ensure and the watch's beat)
    checking: asyncio.Lock = field(default_factory=asyncio.Lock)


def session_file(session_id: str, policy: EgressPolicy) -> dict[str, Any]:
    """A session's file in its gateway: its lists and its placeholders' secret names."""
    return {
        "session": session_id,
        "allow": None if policy.allow is None else list(policy.allow),
        "deny": list(policy.deny),
        "secrets": {grant.placeholder: grant.name for grant in policy.secrets},
    }


P = ParamSpec("P")
T = TypeVar("T")


def _bounded(within: float) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """A gateway call that takes longer than ``within`` seconds (a gateway whose agent does not answer) fails
    with SandboxUnavailableError instead of holding its caller."""

    def wrap(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(fn)
        async def bounded(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                async with asyncio.timeout(within):
                    return await fn(*args, **kwargs)
            except TimeoutError:
                raise SandboxUnavailableError(
                    f"the egress gateway did not answer within {within:g} s ({fn.__name__.strip('_')})"
                ) from None

        return bounded

    return wrap


async def _applied(written: float) -> None:
    """Wait until the gateway has read a file written at ``written`` (it polls every 250 ms)."""
    await asyncio.sleep(max(0.0, written + APPLY_SECONDS - time.monotonic()))


async def _session_files(client: AgentClient) -> list[dict[str, Any]]:
    """Every session file of a gateway, read at once (the agent answers requests in parallel); unreadable
    ones left out."""

    async def read(name: str) -> dict[str, Any] | None:
        try:
            data = json.loads(await client.read_file(GATEWAY_DIR, f"sessions/{name}"))
        except (AgentError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    entries = await client.listdir(GATEWAY_DIR, "sessions")
    found = await asyncio.gather(*(read(str(e["name"])) for e in entries))
    return [data for data in found if data is not None]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


class EgressGateways:
    """The egress gateways of a docker provider's deployment on its engine (see the module's docstring).

    ``egress_network(owner)`` names the owner's ordinary egress network; ``image()`` the image gateways run
    (the provider's default); ``hooks()`` the server's egress hooks (None until the gate sets them);
    ``address_of(session)`` the container whose address on the filtered network is the session's (a docker
    session's own; a vm session's seat), by which its gateway knows it. A vm provider of the deployment makes
    and finds the same gateways (names, labels): its sessions' seats sit on the same filtered networks."""

    def __init__(
        self,
        engine: DockerEngine,
        starts: AgentStarts,
        bridges: SessionBridges,
        locks: NetworkLocks,
        scope: Deployment,
        settings: GatewaySettings,
        log: Any,
        *,
        labels: Mapping[str, str],
        egress_network: Callable[[str | None], str],
        filtered_base: Callable[[], str],
        image: Callable[[], str],
        hooks: Callable[[], EgressHooks | None],
        address_of: Callable[[ContainerSession], str] = lambda session: session.container_id,
    ) -> None:
        self._engine = engine
        self._starts = starts
        self._bridges = bridges
        self._locks = locks
        self._scope = scope
        self._settings = settings
        self._log = log
        self._labels = dict(labels)
        self._egress_network = egress_network
        self._filtered_base = filtered_base
        self._image = image
        self._hooks = hooks
        self._address_of = address_of
        self._watched: dict[str, _Watched] = {}  # by container id
        #: this object's mark on the audit files it claims
        self._token = secrets.token_hex(6)
        self._closed = False

    # ------------------------------------------------------------------ names

    def filtered_network(self, owner: str | None) -> str:
        """The owner's filtered network: the only network of its sessions with a policy."""
        return self._scope.owner_network(self._filtered_base(), owner)

    def container_name(self, owner: str | None) -> str:
        return "tai-gw-" + hashlib.sha256(self.filtered_network(owner).encode()).hexdigest()[:16]

    @property
    def ca_volume(self) -> str:
        """The deployment's CA volume (``tai-sbx-gateway-ca-<tag>``: no workspace volume's name, which has the
        hex tag right after ``tai-sbx-``, can be it)."""
        return f"{VOLUME_PREFIX}gateway-ca-{self._scope.tag}"

    def session_options(self, gateway: Gateway, ip: str) -> dict[str, Any]:
        """What a session's container gets beyond a spec's options: its address ``ip`` on the filtered network
        (picked by :meth:`admit`), the gateway as its DNS, the CA's environment, its neighbour discovery
        bounds (SESSION_SYSCTLS)."""
        endpoint = self._engine.api.create_endpoint_config(ipv4_address=ip)
        return {
            "networking_config": {gateway.network: endpoint},
            "dns": [gateway.ip],
            "sysctls": dict(SESSION_SYSCTLS),
            "environment": dict(CA_ENV),
        }

    # ------------------------------------------------------------- gateways

    async def find(self, owner: str | None) -> Gateway | None:
        """The owner's gateway as the engine has it (running), else None."""
        try:
            attrs = await self._engine.inspect_container(self.container_name(owner), what="find a gateway")
        except SandboxNotFoundError:
            return None
        if not self._engine.in_scope((attrs.get("Config") or {}).get("Labels")):
            raise SandboxUnavailableError(
                f"container {self.container_name(owner)} belongs to another deployment on this engine"
            )
        if not (attrs.get("State") or {}).get("Running"):
            return None
        network = self.filtered_network(owner)
        ip = ((attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network, {}).get("IPAddress")
        if not ip:
            return None
        return Gateway(str(attrs["Id"]), str(ip), network, owner)

    @_bounded(CALL_SECONDS + READY_SECONDS)
    async def ensure(self, owner: str | None) -> Gateway:
        """The owner's running gateway with its command ready, made (with its networks and the CA volume)
        when there is none. The caller holds the filtered network's lock."""
        gateway = await self.find(owner)
        if gateway is None:
            gateway = await self._make(owner)
        watched = self._watch(gateway)
        await self._keep_running(watched)
        return gateway

    async def _make(self, owner: str | None) -> Gateway:
        name = self.container_name(owner)
        filtered = self.filtered_network(owner)
        egress = self._egress_network(owner)
        # a stopped one (an engine restart stops it) is made again; a running one (another server of the
        # deployment made it since this one looked) is never touched
        try:
            found = await self._engine.inspect_container(name, what="find a gateway")
        except SandboxNotFoundError:
            found = None
        if found is not None and (found.get("State") or {}).get("Status") in ("exited", "dead"):
            with contextlib.suppress(SandboxError):
                await self._engine.remove_container(str(found["Id"]))
        async with self._locks.hold(egress):
            await self._bridges.ensure(egress, "egress")
            await self._bridges.ensure(filtered, "filtered")
            await self._engine.create_volume(self.ca_volume, {**self._labels, LABEL_ROLE: "gateway-ca"})
            image = self._image()
            arch = await self._starts.engine_arch()
            agent_volume = await self._starts.agent_volumes.volume_for(arch, image)
            labels = {
                **self._labels,
                LABEL_ROLE: "gateway",
                LABEL_GATEWAY_NETWORK: filtered,
                LABEL_CREATED: repr(time.time()),
                LABEL_AGENT: "1",
            }
            if owner is not None:
                labels[LABEL_OWNER] = owner
            types = docker_sdk().types
            options: dict[str, Any] = {
                "name": name,
                "labels": labels,
                "network": filtered,
                "environment": {"PATH": DEFAULT_PATH},
                "cap_drop": ["ALL"],
                "security_opt": ["no-new-privileges"],
                "privileged": False,
                # it binds 53/80/443 with no capability; it never routes (a session given NET_ADMIN by
                # cap_add could route through it to the egress bridge otherwise: the engine turns it on)
                "sysctls": {"net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.ip_forward": "0"},
                "tmpfs": {GATEWAY_DIR: GATEWAY_TMPFS, "/tmp": "mode=1777,size=16m"},
                "mounts": [types.Mount(CA_DIR, self.ca_volume, type="volume")],
                "mem_limit": GATEWAY_MEMORY,
                "memswap_limit": GATEWAY_MEMORY,
                "pids_limit": GATEWAY_PIDS,
                "read_only": True,
                "user": "0:0",
                "detach": True,
                "working_dir": "/",
            }
            try:
                container_id = await self._engine.create_container(
                    image, with_agent(options, agent_volume), what="create an egress gateway"
                )
            except EngineRefusedError as e:
                if e.status != 409:  # 409: the name is taken, by a gateway another server is making
                    raise
                deadline = time.monotonic() + READY_SECONDS
                while (made := await self.find(owner)) is None:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
                return made
            try:
                # its way out: the owner's egress network (the engine routes out through the one not internal)
                await self._engine.network_connect(container_id, egress)
            except BaseException:
                with contextlib.suppress(SandboxError):
                    await self._engine.remove_container(container_id)
                raise
        self._log.info("sandbox-docker: made egress gateway %s on %s", name, filtered)
        gateway = await self.find(owner)
        if gateway is None:
            raise SandboxUnavailableError(f"the egress gateway {name} stopped as it started")
        return gateway

    def _watch(self, gateway: Gateway) -> _Watched:
        """Watch ``gateway`` (move its audit, keep its command running, refresh secrets) unless this server
        does already."""
        watched = self._watched.get(gateway.container_id)
        if watched is None:
            watched = self._watched[gateway.container_id] = _Watched(gateway)
        if (watched.task is None or watched.task.done()) and not self._closed:
            watched.task = asyncio.ensure_future(self._beat(watched))
        return watched

    async def _client(self, watched: _Watched) -> AgentClient:
        client = watched.client
        if client is None or client.lost:
            client = watched.client = await self._engine.open_agent(watched.gateway.container_id)
        return client

    async def _write(self, client: AgentClient, path: str, data: Any) -> None:
        """Write one of the gateway's files, atomically (the agent writes a temp file and renames it)."""
        await client.write_file(GATEWAY_DIR, path, _json(data), mode=0o600, parents=True)

    async def _keep_running(self, watched: _Watched) -> None:
        """Make sure the gateway command runs (found by its label among the agent's commands, else started)
        and this server reads its output."""
        async with watched.checking:
            await self._check_command(watched)

    async def _check_command(self, watched: _Watched) -> None:
        client = await self._client(watched)
        listed = [c for c in await client.list() if c.get("label") == COMMAND_LABEL]
        running = [c for c in listed if c.get("running")]
        for entry in listed:
            if entry.get("running") and entry is running[0]:
                reading = (
                    watched.command is not None
                    and watched.command.id == entry["id"]
                    and watched.drain is not None
                    and not watched.drain.done()
                )
                # its output is read by one server at a time: this one, or another of the deployment until its
                # connection ends (an attach would take it over, and the other would take it back)
                if not reading and not entry.get("attached"):
                    watched.command = await client.attach(
                        entry["id"],
                        stdout=entry.get("output", {}).get("stdout", [0, 0])[1],
                        stderr=entry.get("output", {}).get("stderr", [0, 0])[1],
                    )
                    self._drain(watched)
                continue
            with contextlib.suppress(AgentError):  # an ended one (or a second, which exits): let it go
                old = await client.attach(entry["id"])
                if entry.get("running"):
                    await old.kill()
                else:
                    self._log.warning(
                        "sandbox-docker: the egress gateway command of %s ended (%s): starting it again",
                        watched.gateway.network,
                        entry.get("exit"),
                    )
                await old.release()
        if not running:
            await self._start_command(watched, client)

    async def _start_command(self, watched: _Watched, client: AgentClient) -> None:
        gateway = watched.gateway
        config: dict[str, Any] = {
            "deployment": self._scope.name,
            "owner": gateway.owner or "",
            "listen": gateway.ip,
            "resolver": self._settings.egress_resolver,
            "upstream_roots_pem": await self._upstream_roots(),
            "body_limit": BODY_LIMIT,
        }
        await self._write(client, "gateway.json", config)
        for folder in ("sessions", "secrets", "audit", "claims"):
            await client.mkdir(GATEWAY_DIR, folder, parents=True)
        watched.stderr_tail.clear()
        command = await client.start(
            [AGENT_PATH, "gateway", "--dir", GATEWAY_DIR, "--ca", CA_DIR],
            env={"PATH": DEFAULT_PATH},
            cwd="/",
            label=COMMAND_LABEL,
        )
        watched.command = command
        self._drain(watched)
        # ready: the file `ready` names its pid (an older one's may be there still). Should another server
        # of the deployment have started one at the same moment, one of the two cannot listen and exits:
        # the other, once ready, serves
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                ready = (await client.read_file(GATEWAY_DIR, "ready")).decode(errors="replace").strip()
            except AgentError as e:
                if e.code != "ENOENT":
                    raise SandboxUnavailableError(f"the egress gateway's ready file: {e}") from None
                ready = ""
            if ready and ready == str(command.pid):
                return
            if command.exit.done():
                others = [
                    c
                    for c in await client.list()
                    if c.get("label") == COMMAND_LABEL and c.get("running") and c.get("id") != command.id
                ]
                if others and ready == str(others[0].get("pid")):
                    with contextlib.suppress(AgentError):
                        await command.release()
                    watched.command = None
                    return
                if not others or time.monotonic() > deadline:
                    break
            elif time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        tail = watched.stderr_tail.decode(errors="replace").strip()[-600:]
        status = f"exited ({command.exit.result()})" if command.exit.done() else "did not get ready"
        raise SandboxUnavailableError(
            f"the egress gateway of {gateway.network} {status} within {READY_SECONDS:g} s: "
            f"{tail or 'no output'} (does the session agent binary have the gateway mode?)"
        )

    def _drain(self, watched: _Watched) -> None:
        """Read the gateway command's output (its log; unread, it would stall the command) into the server's
        log, keeping its end for an error message."""
        command = watched.command
        if watched.drain is not None and not watched.drain.done():
            watched.drain.cancel()
        if command is None:
            return

        async def drain() -> None:
            with contextlib.suppress(AgentError, asyncio.CancelledError):
                while (item := await command.read()) is not None:
                    _, data = item
                    watched.stderr_tail += data
                    del watched.stderr_tail[:-4096]
                    for line in data.decode(errors="replace").splitlines():
                        if line.strip():
                            self._log.debug("sandbox-docker: gateway %s: %s", watched.gateway.network, line)

        watched.drain = asyncio.ensure_future(drain())

    async def _upstream_roots(self) -> str:
        path = self._settings.egress_upstream_ca
        if not path:
            return ""
        try:
            return await asyncio.to_thread(Path(path).read_text)
        except (OSError, UnicodeDecodeError) as e:
            raise SandboxUnavailableError(
                f"{type(self._settings).__name__}.egress_upstream_ca: cannot read {path}: {e}"
            ) from None

    async def ca_pem(self, gateway: Gateway) -> bytes:
        """The deployment's CA certificate (PEM), as the gateway made it."""
        client = await self._client(self._watch(gateway))
        try:
            return await client.read_file(CA_DIR, "ca.pem")
        except AgentError as e:
            raise SandboxUnavailableError(f"the egress gateway's CA certificate: {e}") from None

    # -------------------------------------------------------------- sessions

    async def session_ip(self, container_id: str, network: str) -> str:
        attrs = await self._engine.inspect_container(container_id, what="find a session's address")
        ip = ((attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network, {}).get("IPAddress")
        if not ip:
            raise SandboxError(f"container {container_id[:12]} has no address on {network}")
        return str(ip)

    async def free_address(self, gateway: Gateway, claimed: Collection[str] = ()) -> str:
        """An address of the filtered network no container holds (nor its network, broadcast or first
        address, the engine's gateway address there) and no create has ``claimed``, picked at random."""
        found = await self._engine.inspect_network(gateway.network)
        configs = (found.get("IPAM") or {}).get("Config") or []
        subnet = ipaddress.IPv4Network(str(configs[0]["Subnet"]), strict=False)
        taken = {str(configs[0].get("Gateway") or ""), *claimed}
        for endpoint in (found.get("Containers") or {}).values():
            taken.add(str(endpoint.get("IPv4Address") or "").split("/")[0])
        hosts = list(subnet.hosts())[1:]  # the first is the engine's gateway address
        free = [str(a) for a in hosts if str(a) not in taken]
        if not free:
            raise SandboxCapacityError(
                f"the filtered network {gateway.network} is full ({len(hosts) - 1} sessions of one owner with "
                "an egress policy): configure a shorter (smaller) network_prefix"
            )
        return random.choice(free)

    async def _claim(self, client: AgentClient, gateway: Gateway) -> str:
        """A free address, claimed for one create of any server of the deployment (``claims/<ip>``, made by
        a mkdir that fails when another made it first)."""
        for _ in range(CLAIM_TRIES):
            try:
                claimed = {str(e["name"]) for e in await client.listdir(GATEWAY_DIR, "claims")}
            except AgentError as e:
                if e.code != "ENOENT":
                    raise
                # a gateway whose command an older server started has no claims folder yet
                await client.mkdir(GATEWAY_DIR, "claims", parents=True)
                claimed = set()
            ip = await self.free_address(gateway, claimed)
            try:
                await client.mkdir(GATEWAY_DIR, f"claims/{ip}")
                return ip
            except AgentError as e:
                if e.code != "EEXIST":
                    raise
        raise SandboxUnavailableError(
            f"no address of {gateway.network} could be claimed in {CLAIM_TRIES} tries (other creates took each)"
        )

    @_bounded(CALL_SECONDS)
    async def admit(self, gateway: Gateway, session_id: str, policy: EgressPolicy) -> tuple[str, float]:
        """Put a new session's policy in force at its gateway before its container starts: an address for
        it (claimed), its file there (for that address), its secrets' files. The address, and when the file
        was written (time.monotonic()). The caller holds the filtered network's lock."""
        watched = self._watch(gateway)
        client = await self._client(watched)
        ip = await self._claim(client, gateway)
        try:
            await self._write_secrets(watched, client, policy.secrets)
            await self._write(client, f"sessions/{ip}.json", session_file(session_id, policy))
        except BaseException:
            await self.withdraw(gateway, ip)
            raise
        return ip, time.monotonic()

    async def place(
        self,
        owner: str | None,
        session_id: str,
        policy: EgressPolicy,
        start: Callable[[Gateway, str], Awaitable[T]],
    ) -> tuple[Gateway, str, float, T]:
        """Admit a new session at its owner's gateway (made for the owner's first) and ``start`` it at the
        address picked: ``(gateway, address, when its file was written, what start returned)``. An address
        another server's session took meanwhile is retried (three tries); on any failure what was written is
        taken back, and a gateway made for this session goes with it. The caller holds the filtered
        network's lock."""
        ip = ""
        gateway: Gateway | None = None
        try:
            gateway = await self.ensure(owner)
            for attempt in (1, 2, 3):
                ip, written = await self.admit(gateway, session_id, policy)
                try:
                    return gateway, ip, written, await start(gateway, ip)
                except SandboxError as e:  # another server's session took the address meanwhile
                    await self.withdraw(gateway, ip)
                    ip = ""
                    if attempt == 3 or "already in use" not in str(e).lower():
                        raise
            raise AssertionError("unreachable")
        except BaseException:
            if ip and gateway is not None:
                await self.withdraw(gateway, ip)
            # a gateway made for this session (or one whose command would not start) goes with it
            with contextlib.suppress(SandboxError):
                await self.release(owner)
            raise

    async def withdraw(self, gateway: Gateway, ip: str) -> None:
        """Take back what :meth:`admit` wrote for a session whose container did not start (its file, then its
        claim: the address is free again only once its file is gone)."""
        with contextlib.suppress(AgentError, SandboxError, TimeoutError):
            async with asyncio.timeout(CALL_SECONDS):
                client = await self._client(self._watch(gateway))
                await self._forget(client, ip)

    async def _forget(self, client: AgentClient, ip: str) -> None:
        """Delete an address's session file and its claim (each may be gone already)."""
        with contextlib.suppress(AgentError):
            await client.delete(GATEWAY_DIR, f"sessions/{ip}.json")
        with contextlib.suppress(AgentError):
            await client.delete(GATEWAY_DIR, f"claims/{ip}")

    @_bounded(CALL_SECONDS)
    async def attach(
        self, session: AgentHolder, gateway: Gateway, written: float, *, root: str = "/"
    ) -> None:
        """Finish a new session admitted at ``written``: the CA in the session (``/tmp/tai-sandbox-ca``,
        written as root, so a session user cannot replace it; under ``root``, the folder of the agent's its
        commands are chrooted into), and its policy in force at the gateway (which reads its files every
        250 ms) by the time it returns."""
        ca = await self.ca_pem(gateway)
        inside = await session.agent()
        try:
            bundle = await inside.read_file(root, IMAGE_BUNDLE)
        except AgentError:
            bundle = b""
        if bundle and not bundle.endswith(b"\n"):
            bundle += b"\n"
        await inside.mkdir(root, SESSION_CA_DIR, parents=True)
        await inside.write_file(root, f"{SESSION_CA_DIR}/ca.pem", ca, mode=0o644)
        await inside.write_file(root, f"{SESSION_CA_DIR}/bundle.pem", bundle + ca, mode=0o644)
        await _applied(written)

    async def _write_secrets(
        self, watched: _Watched, client: AgentClient, grants: Sequence[SecretGrant]
    ) -> None:
        hooks = self._hooks()
        for grant in grants:
            # the gateway serves one owner: a secret of the owner's own (a hub user's auth_state) is theirs
            value = None if hooks is None else hooks.secret_value(grant.name, watched.gateway.owner)
            if value is None:
                raise SandboxUnavailableError(
                    f"secret {grant.name!r} has no value on this server (SandboxPolicy.secrets: its source is "
                    "missing)"
                )
            await self._write(
                client,
                f"secrets/{grant.name}.json",
                {"value": value, "hosts": list(grant.hosts), "query": grant.query, "body": grant.body},
            )
            watched.secrets[grant.name] = _digest(value)

    async def set_policy(self, session: ContainerSession, policy: EgressPolicy) -> None:
        """Put ``policy`` in force for ``session`` (the gateway applies it to new connections within a
        second): its file in the gateway, rewritten."""
        owner = session.spec.owner
        async with self._locks.hold(self.filtered_network(owner)):
            gateway = await self.find(owner)
            if gateway is None:
                raise SandboxUnavailableError(
                    f"session {session.id}'s egress gateway is not running: destroy the session and create "
                    "another"
                )
            await self._rewrite(gateway, session, policy)
            await _applied(time.monotonic())

    @_bounded(CALL_SECONDS)
    async def _rewrite(self, gateway: Gateway, session: ContainerSession, policy: EgressPolicy) -> None:
        watched = self._watch(gateway)
        client = await self._client(watched)
        ip = await self.session_ip(self._address_of(session), gateway.network)
        await self._write_secrets(watched, client, policy.secrets)
        await self._write(client, f"sessions/{ip}.json", session_file(session.id, policy))

    async def current(self, session: ContainerSession) -> EgressPolicy | None:
        """The session's policy in force: its file in the gateway (any server of the deployment may have
        changed it), with the secrets its spec was granted; the spec's own when the gateway has none."""
        policy = session.spec.egress
        if policy is None:
            return None
        gateway = await self.find(session.spec.owner)
        if gateway is None:
            return policy
        try:
            async with asyncio.timeout(CALL_SECONDS):
                client = await self._client(self._watch(gateway))
                ip = await self.session_ip(self._address_of(session), gateway.network)
                data = json.loads(await client.read_file(GATEWAY_DIR, f"sessions/{ip}.json"))
        except (AgentError, SandboxError, ValueError, TimeoutError):
            return policy
        if not isinstance(data, dict) or data.get("session") != session.id:
            return policy
        try:
            return EgressPolicy(allow=data.get("allow"), deny=data.get("deny") or (), secrets=policy.secrets)
        except SandboxSpecRejectedError:
            return policy

    async def live_policies(self, sessions: Sequence[ContainerSession]) -> None:
        """Give each of ``sessions`` (with a policy each) its policy in force: the files of each owner's
        gateway, read once per gateway (a listing's way; :meth:`current` is one session's)."""
        by_owner: dict[str | None, list[ContainerSession]] = {}
        for session in sessions:
            by_owner.setdefault(session.spec.owner, []).append(session)
        for owner, owned in by_owner.items():
            files: dict[str, Any] = {}
            try:
                gateway = await self.find(owner)
                if gateway is None:
                    continue
                async with asyncio.timeout(CALL_SECONDS):
                    client = await self._client(self._watch(gateway))
                    for found in await _session_files(client):
                        files[str(found.get("session"))] = found
            except (AgentError, SandboxError, TimeoutError) as e:
                self._log.debug("sandbox-docker: the egress gateway of %s: %s", owner, e)
                continue
            for session in owned:
                policy, data = session.spec.egress, files.get(session.id)
                if policy is None or data is None:
                    continue
                with contextlib.suppress(SandboxSpecRejectedError):
                    live = EgressPolicy(
                        allow=data.get("allow"), deny=data.get("deny") or (), secrets=policy.secrets
                    )
                    session.spec = session.spec.replace(egress=live)

    async def detach(self, session: ContainerSession) -> None:
        """Take a session's file out of its gateway (before its container goes: its address names the file),
        and the files of secrets no session there holds any more. Errors are the reap's to mend."""
        owner = session.spec.owner
        gateway = await self.find(owner)
        if gateway is None:
            return
        watched = self._watch(gateway)
        try:
            async with asyncio.timeout(CALL_SECONDS):
                client = await self._client(watched)
                ip = await self.session_ip(self._address_of(session), gateway.network)
                await self._forget(client, ip)
                await self._prune_secrets(watched, client)
        except (AgentError, SandboxError, TimeoutError) as e:
            self._log.debug("sandbox-docker: detaching %s from its gateway: %s", session.id, e)

    async def _prune_secrets(self, watched: _Watched, client: AgentClient) -> None:
        held: set[str] = set()
        for data in await _session_files(client):
            secrets_held = data.get("secrets")
            if isinstance(secrets_held, dict):
                held.update(str(name) for name in secrets_held.values())
        for entry in await client.listdir(GATEWAY_DIR, "secrets"):
            name = str(entry["name"]).removesuffix(".json")
            if name not in held:
                with contextlib.suppress(AgentError):
                    await client.delete(GATEWAY_DIR, f"secrets/{entry['name']}")
                watched.secrets.pop(name, None)

    async def release(self, owner: str | None, *, leaving: Sequence[str] = ()) -> bool:
        """Remove the owner's gateway, its filtered network and (when idle) its egress network once no
        session is on the filtered network but those ``leaving`` (just removed); the CA volume with the
        deployment's last gateway. The caller holds the filtered network's lock. True when it went."""
        filtered = self.filtered_network(owner)
        name = self.container_name(owner)
        try:
            attrs = await self._engine.inspect_container(name, what="find a gateway")
        except SandboxNotFoundError:
            attrs = None
        gateway_id = None if attrs is None else str(attrs["Id"])
        for member in await self.members(filtered):
            if member == gateway_id or member in leaving or any(member.startswith(x) for x in leaving):
                continue
            return False  # a session's container (or a vm session's seat) is on it
        running = attrs is not None and bool((attrs.get("State") or {}).get("Running"))
        if gateway_id is not None and running and await self._admitting(gateway_id, time.time()):
            return False
        await self._remove(gateway_id, filtered, owner)
        return True

    async def members(self, filtered: str) -> dict[str, str]:
        """The containers on the filtered network (the gateway, docker sessions, vm sessions' seats, of any
        provider of the deployment) and their addresses there; none when it is gone."""
        try:
            found = await self._engine.inspect_network(filtered)
        except SandboxNotFoundError:
            return {}
        return {
            str(container_id): str(endpoint.get("IPv4Address") or "").split("/")[0]
            for container_id, endpoint in (found.get("Containers") or {}).items()
        }

    async def _remove(self, gateway_id: str | None, filtered: str, owner: str | None) -> None:
        if gateway_id is not None:
            watched = self._watched.pop(gateway_id, None)
            if watched is not None:
                await self._unwatch(watched)
            await self._engine.remove_container(gateway_id)
            self._log.info("sandbox-docker: removed the egress gateway of %s", filtered)
        leaving = (gateway_id,) if gateway_id else ()
        await self._bridges.drop(filtered, leaving=leaving)
        egress = self._egress_network(owner)
        async with self._locks.hold(egress):
            with contextlib.suppress(SandboxError):
                await self._bridges.drop(egress, leaving=leaving)
        if not await self._engine.containers([f"{LABEL_ROLE}=gateway"], what="list gateways"):
            with contextlib.suppress(SandboxError):
                await self._engine.remove_volume(self.ca_volume)

    async def reap(self, summaries: Sequence[Mapping[str, Any]], now: float) -> None:
        """Remove gateways no session is on (older than a grace: a create may be about to use one), and watch
        the others (a server that started since finds them here). ``summaries``: the provider's session
        containers (a docker provider's; a vm provider's seats); the filtered network's own members count
        too, whichever provider of the deployment made them."""
        used = {
            name
            for summary in summaries
            for name in ((summary.get("NetworkSettings") or {}).get("Networks") or {})
        }
        for found in await self._engine.containers([f"{LABEL_ROLE}=gateway"], what="list gateways"):
            labels = found.get("Labels") or {}
            filtered = labels.get(LABEL_GATEWAY_NETWORK, "")
            owner = labels.get(LABEL_OWNER)
            try:
                made = float(labels.get(LABEL_CREATED, "0"))
            except ValueError:
                made = 0.0
            members = await self.members(filtered)
            members.pop(str(found["Id"]), None)
            if filtered in used or members:
                if found.get("State") == "running":
                    gateway = await self.find(owner)
                    if gateway is not None:
                        with contextlib.suppress(AgentError, SandboxError):
                            await self._drop_strays(self._watch(gateway), set(members.values()), now)
                continue
            if now - made < REAP_GRACE_SECONDS:
                continue
            async with self._locks.hold(filtered):
                with contextlib.suppress(SandboxError):
                    await self.release(owner)

    async def _admitting(self, gateway_id: str, now: float) -> bool:
        """Whether a running gateway with no session on its network admitted one within the grace (a create,
        maybe another server's, writes the session's file before its container starts: the gateway stays
        for it; a reap removes it once the file is older)."""
        try:
            async with asyncio.timeout(CALL_SECONDS):
                client = await self._engine.open_agent(gateway_id)
                try:
                    entries = await client.listdir(GATEWAY_DIR, "sessions")
                finally:
                    await client.close()
        except (AgentError, SandboxError, TimeoutError):
            return False
        return any(now - float(e.get("mtime") or 0) < REAP_GRACE_SECONDS for e in entries)

    async def _drop_strays(self, watched: _Watched, addresses: set[str], now: float) -> None:
        """Remove session files and claims of addresses no session holds (a server that died between a
        container's removal and its file's) older than a grace (a create writes its file before its container
        starts), then the secrets no session there holds."""
        client = await self._client(watched)
        dropped = False
        for folder, suffix in (("sessions", ".json"), ("claims", "")):
            try:
                entries = await client.listdir(GATEWAY_DIR, folder)
            except AgentError:
                continue
            for entry in entries:
                name = str(entry["name"])
                if name.removesuffix(suffix) in addresses:
                    continue
                if now - float(entry.get("mtime") or now) < REAP_GRACE_SECONDS:
                    continue
                with contextlib.suppress(AgentError):
                    await client.delete(GATEWAY_DIR, f"{folder}/{name}")
                    dropped = dropped or folder == "sessions"
        if dropped:
            await self._prune_secrets(watched, client)

    # ------------------------------------------------------------ the watch

    async def _beat(self, watched: _Watched) -> None:
        """Every AUDIT_SECONDS move the gateway's sealed audit files to the server's audit; every
        CHECK_SECONDS make sure its command runs and its secrets' values are current."""
        beats = 0
        checks = max(1, round(CHECK_SECONDS / AUDIT_SECONDS))
        while True:
            await asyncio.sleep(AUDIT_SECONDS)
            beats += 1
            try:
                async with asyncio.timeout(CALL_SECONDS + READY_SECONDS):
                    client = await self._client(watched)
                    if self._hooks() is not None:  # else left for a server that has an audit sink
                        await self._pump_audit(client)
                    if beats % checks == 0:
                        await self._keep_running(watched)
                        await self._refresh_secrets(watched, client)
            except asyncio.CancelledError:
                raise
            except SandboxNotFoundError:
                self._watched.pop(watched.gateway.container_id, None)
                return  # the gateway is gone
            except Exception as e:
                if not await self._still_there(watched):
                    self._watched.pop(watched.gateway.container_id, None)
                    return
                self._log.warning("sandbox-docker: egress gateway of %s: %s", watched.gateway.network, e)
                if watched.client is not None and watched.client.lost:
                    watched.client = None

    async def _still_there(self, watched: _Watched) -> bool:
        try:
            attrs = await self._engine.inspect_container(watched.gateway.container_id, what="find a gateway")
        except SandboxNotFoundError:
            return False
        except SandboxError:
            return True
        return bool((attrs.get("State") or {}).get("Running"))

    async def _pump_audit(self, client: AgentClient) -> None:
        """Sealed audit files (``<nanoseconds>.jsonl``): claimed by a rename (one server of the deployment
        takes each), read, removed, each line given to the server's audit."""
        entries = await client.listdir(GATEWAY_DIR, "audit")
        now = time.time()
        claim = f".{self._token}.taking"
        for entry in sorted(entries, key=lambda e: str(e["name"])):
            name = str(entry["name"])
            if name.endswith(".jsonl"):
                taken = name + claim
                try:
                    await client.rename(GATEWAY_DIR, f"audit/{name}", f"audit/{taken}")
                except AgentError:
                    continue  # another server took it
            elif ".jsonl." in name and name.endswith(".taking"):
                if now - float(entry.get("mtime") or now) < CLAIMED_STALE_SECONDS:
                    continue
                taken = name
            else:
                continue
            try:
                data = await client.read_file(GATEWAY_DIR, f"audit/{taken}")
            except AgentError:
                continue
            with contextlib.suppress(AgentError):
                await client.delete(GATEWAY_DIR, f"audit/{taken}")
            self._audit_lines(data)

    def _audit_lines(self, data: bytes) -> None:
        hooks = self._hooks()
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and hooks is not None:
                try:
                    hooks.audit(record)
                except Exception as e:  # the sink's failure must not stop the pump
                    self._log.warning("sandbox-docker: the egress audit refused a line: %s", e)

    async def _refresh_secrets(self, watched: _Watched, client: AgentClient) -> None:
        """Rewrite the secret files whose value changed on the server (a rotated secret file)."""
        hooks = self._hooks()
        if hooks is None:
            return
        for entry in await client.listdir(GATEWAY_DIR, "secrets"):
            name = str(entry["name"])
            if not name.endswith(".json"):
                continue
            secret = name.removesuffix(".json")
            value = hooks.secret_value(secret, watched.gateway.owner)
            if value is None:
                continue
            digest = _digest(value)
            if watched.secrets.get(secret) == digest:
                continue
            try:
                data = json.loads(await client.read_file(GATEWAY_DIR, f"secrets/{name}"))
            except (AgentError, ValueError):
                continue
            if isinstance(data, dict) and data.get("value") != value:
                await self._write(client, f"secrets/{name}", {**data, "value": value})
                self._log.info(
                    "sandbox-docker: secret %s rotated at the gateway of %s", secret, watched.gateway.network
                )
            watched.secrets[secret] = digest

    async def _unwatch(self, watched: _Watched) -> None:
        for task in (watched.task, watched.drain):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if watched.client is not None:
            await watched.client.close()

    async def close(self) -> None:
        """Stop watching (the gateways keep running: another server, or this one restarted, takes them)."""
        self._closed = True
        watched, self._watched = list(self._watched.values()), {}
        await asyncio.gather(*(self._unwatch(w) for w in watched), return_exceptions=True)


class GatewaySession(ContainerSession):
    """A session of the container base whose provider has egress gateways (docker's, vm's): its agent
    connection, its egress policy read back from its gateway, and a live change of that policy."""

    #: the provider's egress gateways when it has them (docker, vm; not swarm)
    gateways: EgressGateways | None = None

    async def agent(self) -> AgentClient:
        """The session's agent connection (its file operations without a user run as the agent: root)."""
        return await self._client()

    async def info(self) -> SessionInfo:
        """The container base's, with a policy session's egress policy as its gateway has it now (another
        server of the deployment may have changed it)."""
        info = await super().info()
        if self.gateways is not None and self.spec.egress is not None:
            try:
                self.spec = self.spec.replace(egress=await self.gateways.current(self))
            except SandboxError:
                return info
            info = self._info()
        return info

    async def set_egress(self, policy: EgressPolicy) -> None:
        """Put ``policy`` in force at the session's egress gateway (its file there: new connections and DNS
        queries follow it within a second, and any server of the deployment reads it back). A session made
        without a policy is on its owner's plain egress network, which no policy can narrow: refused."""
        if self.gateways is None:
            await super().set_egress(policy)
            return
        self._check_live()
        if self.spec.egress is None:
            raise SandboxSpecRejectedError(
                f"session {self.id} was created without an egress policy: its network cannot take one while it "
                "runs; create a session with an egress policy (allow/deny lists) instead"
            )
        await self.gateways.set_policy(self, policy)
        self.spec = self.spec.replace(egress=policy)
