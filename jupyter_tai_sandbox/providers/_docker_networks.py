"""Session networks of the docker (and swarm) provider: their subnets, locks and host firewall.

Every session on a network (``egress`` or ``internal``) joins a bridge of its
owner's (``Deployment.owner_network``), a docker session with an egress policy its
owner's *filtered* bridge (internal, its egress gateway on it: docker/gateway.py);
the warm pool's containers wait on a holding bridge of the deployment that reaches nothing. Each of these networks
gets a small subnet (``network_prefix``, /26 by default) that the provider
picks itself from the operator's range (``network_pool``), never from the
engine's default pools: :func:`free_subnet` looks at the subnets of every
network on the engine (any deployment's, any other program's) and picks a free
one at random, and the engine object retries with another when a concurrent
creator took it meanwhile. A range with no free subnet left is a
:class:`SandboxCapacityError` (503) naming the traits to configure.

What the engine alone cannot block on a bridge with a route out -- the host
itself (the bridge's gateway address and every other address of the host) and
the link-local range with the cloud metadata service (169.254.0.0/16) -- the
:class:`HostFirewall` blocks with iptables rules when the server can set them
on the engine's own host (root, iptables, a ``unix://`` engine whose bridges
this process sees): rules matching only the provider's own bridge interfaces
(named by ``com.docker.network.bridge.name``), added before any session joins
and removed with the network; a reap removes rules whose bridge is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import random
import shlex
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..contract import SandboxCapacityError, SandboxError, SandboxUnavailableError
from .docker_engine.names import LABEL_CREATED, LABEL_NETWORK

if TYPE_CHECKING:
    from .docker_engine import DockerEngine

#: the default range session subnets come from (outside Docker's default pools 172.17-31.0.0/16 and 192.168.0.0/16)
DEFAULT_NETWORK_POOL = "10.201.0.0/16"
#: the default prefix length of one session network's subnet: 64 addresses, 61 sessions
DEFAULT_NETWORK_PREFIX = 26
#: an idle network younger than this is left to the creator that may be about to use it (another server)
REAP_GRACE_SECONDS = 60.0
#: the link-local range, the cloud metadata service (169.254.169.254) among it
LINK_LOCAL = "169.254.0.0/16"
#: prefix of the Linux bridge interfaces the provider names (15 characters at most)
BRIDGE_PREFIX = "tai"
#: the bridge interfaces a session bridge never forwards to: the engine's default and unnamed ones, and the
#: provider's (any deployment's; the bridge's own traffic is returned to the engine's rules before these)
OTHER_BRIDGES = ("docker0", "br-+", f"{BRIDGE_PREFIX}+")
#: prefix of the iptables chain of one session bridge's forwarded traffic
CHAIN_PREFIX = "TAI-SBX-"

#: bridge driver options, by the network's kind (egress, internal, filtered, pool)
NO_ICC = {"com.docker.network.bridge.enable_icc": "false"}
NO_HOST_ADDRESS = {"com.docker.network.bridge.inhibit_ipv4": "true"}


def bridge_name(network: str) -> str:
    """The Linux interface of the bridge of network ``network``: ``tai`` and 12 hex digits."""
    return BRIDGE_PREFIX + hashlib.sha256(network.encode()).hexdigest()[:12]


def chain_name(bridge: str) -> str:
    """The iptables chain of session bridge ``bridge``'s forwarded traffic: ``TAI-SBX-`` and its hex digits."""
    return CHAIN_PREFIX + bridge[len(BRIDGE_PREFIX) :]


def bridge_options(kind: str, network: str) -> dict[str, str]:
    """The driver options of a session bridge: our own interface name; no host address on internal,
    filtered and pool bridges (they have no route out); inter-container traffic off but on an internal
    bridge, whose point is that its owner's sessions reach each other (a database in one, its client in
    another), and on a filtered one, whose sessions reach the outside only through their owner's egress
    gateway on it (docker/gateway.py)."""
    options = {"com.docker.network.bridge.name": bridge_name(network)}
    if kind not in ("internal", "filtered"):
        options.update(NO_ICC)
    if kind != "egress":
        options.update(NO_HOST_ADDRESS)
    return options


def check_pool(pool: str, prefix: int) -> ipaddress.IPv4Network:
    """The range ``pool`` as a network, or ValueError saying what is wrong with it and ``prefix``."""
    try:
        network = ipaddress.IPv4Network(pool, strict=True)
    except ValueError as e:
        raise ValueError(f"{pool!r} is no IPv4 range like '10.201.0.0/16': {e}") from None
    if not network.prefixlen <= prefix <= 29:
        raise ValueError(f"a /{prefix} subnet does not fit in {pool} (the prefix is {network.prefixlen}..29)")
    return network


def taken_subnets(networks: Iterable[Mapping[str, Any]]) -> list[ipaddress.IPv4Network]:
    """The IPv4 subnets the engine's networks hold (their IPAM configs)."""
    taken = []
    for network in networks:
        for config in ((network.get("IPAM") or {}).get("Config")) or []:
            with contextlib.suppress(ValueError, TypeError):
                subnet = ipaddress.ip_network(str((config or {}).get("Subnet")), strict=False)
                if subnet.version == 4:
                    taken.append(subnet)
    return taken


def free_subnet(pool: str, prefix: int, taken: Iterable[ipaddress.IPv4Network]) -> str | None:
    """A random ``/prefix`` subnet of ``pool`` that overlaps none of ``taken``; None when none is left."""
    whole = ipaddress.IPv4Network(pool)
    size = 1 << (32 - prefix)
    start = int(whole.network_address)
    count = whole.num_addresses // size
    blocked: set[int] = set()
    for subnet in taken:
        low = max(int(subnet.network_address), start)
        high = min(int(subnet.broadcast_address), start + whole.num_addresses - 1)
        if low <= high:
            blocked.update(range((low - start) // size, (high - start) // size + 1))
    if len(blocked) >= count:
        return None
    while True:  # most of the range is free in practice: a few draws find a slot
        index = random.randrange(count)
        if index not in blocked:
            return f"{ipaddress.IPv4Address(start + index * size)}/{prefix}"


def capacity_error(owner: str, pool: str, prefix: int) -> SandboxCapacityError:
    count = ipaddress.IPv4Network(pool).num_addresses >> (32 - prefix)
    return SandboxCapacityError(
        f"no free /{prefix} subnet is left in the session network range {pool} ({count} networks, one per owner "
        f"and network mode): configure a larger {owner}.network_pool, or a longer {owner}.network_prefix"
    )


def containers_on_subnet(prefix: int) -> int:
    """How many containers a /``prefix`` subnet holds: its addresses less its network, broadcast and gateway."""
    return (1 << (32 - prefix)) - 3


def full_network_error(
    error: SandboxError, owner: str, prefix: int, network: str | None = None
) -> SandboxCapacityError | None:
    """The typed 503 for an engine's refusal to give a container an address on a session network that is full
    (docker's "no available IPv4 addresses"); None for any other refusal."""
    if "no available ipv4 addresses" not in str(error).lower():
        return None
    sessions = containers_on_subnet(prefix)
    where = f"the session network {network}" if network else "an owner's session network"
    return SandboxCapacityError(
        f"{where} is full: an owner's /{prefix} network holds {sessions} sessions of one network mode; "
        f"configure a shorter {owner}.network_prefix for more"
    )


class NetworkLocks:
    """One asyncio lock per network name (a create's join and a teardown's removal of the same network
    never interleave). Networks of different names are made side by side: :class:`SessionBridges` keeps the
    subnets it is picking apart."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(name) or (asyncio.Lock(), 0)
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users <= 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)


class HostFirewall:
    """iptables rules on the engine's host that keep sessions on the provider's bridges from the host
    itself (INPUT from the bridge: any address of the host, the gateway's among them), and forwarded traffic
    of a bridge (a chain of its own, ``TAI-SBX-<hex>``, jumped to from FORWARD for traffic in or out of it)
    from the link-local range with the cloud metadata service and from every other bridge: the engine's,
    another deployment's, another owner's.

    The engine's own bridge-to-bridge isolation hangs on the jumps at the top of FORWARD, which it deletes
    and inserts again at every network create or remove (any deployment's): for that moment its per-bridge
    ``-i bridge ! -o bridge -j ACCEPT`` lets one bridge reach all the others. Our jumps sit in FORWARD itself,
    above the bridge's own rules, and the engine leaves them alone. The chain returns its bridge's own
    traffic and the replies to its connections to the engine's rules, which decide them as before.

    ``mode``: "auto" sets them when the server can (root, iptables, a ``unix://`` engine whose bridge
    interfaces this process sees: the same host and network namespace), "require" refuses session
    networks it cannot protect, "off" sets none. Each rule carries the comment ``tai-sbx:<tag>``
    (the deployment's tag), so a reap removes only its own deployment's rules whose bridge is gone."""

    def __init__(self, mode: str, base_url: str, tag: str, log: Any, *, setting: str) -> None:
        self.mode = mode
        self.setting = setting
        self.comment = f"tai-sbx:{tag}"
        self._log = log
        self._iptables = shutil.which("iptables")
        self._ip6tables = shutil.which("ip6tables")
        self._why_not = self._unavailable(base_url)
        self._warned = False
        #: bridges whose rules this process set, with the id of the network they were set for (None: unknown)
        self._walled: dict[str, str | None] = {}

    def _unavailable(self, base_url: str) -> str | None:
        if self.mode == "off":
            return f"{self.setting} is off"
        if not base_url.startswith("unix://"):
            return f"the engine at {base_url} is not on this host"
        if os.geteuid() != 0:
            return "the server does not run as root"
        if self._iptables is None:
            return "iptables is not installed"
        return None

    @property
    def active(self) -> bool:
        return self._why_not is None

    async def _run(self, tool: str, *args: str, feed: bytes | None = None) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            tool,
            "-w",
            *args,
            stdin=asyncio.subprocess.PIPE if feed is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate(feed)
        return int(process.returncode or 0), out.decode(errors="replace")

    def _chain_rules(self, bridge: str) -> list[list[str]]:
        """The rules of ``bridge``'s FORWARD chain, in order."""
        tag = ["-m", "comment", "--comment", self.comment]
        return [
            ["-i", bridge, "-o", bridge, *tag, "-j", "RETURN"],
            ["-i", bridge, "-d", LINK_LOCAL, *tag, "-j", "DROP"],
            *(["-i", bridge, "-o", other, *tag, "-j", "DROP"] for other in OTHER_BRIDGES),
            ["-o", bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", *tag, "-j", "RETURN"],
            ["-o", bridge, *tag, "-j", "DROP"],
        ]

    def _jumps(self, bridge: str) -> list[tuple[str, list[str]]]:
        """The rules that send ``bridge``'s traffic to its chain, and keep it from the host."""
        tag = ["-m", "comment", "--comment", self.comment]
        chain = chain_name(bridge)
        jumps = [
            (str(self._iptables), ["FORWARD", "-i", bridge, *tag, "-j", chain]),
            (str(self._iptables), ["FORWARD", "-o", bridge, *tag, "-j", chain]),
            (str(self._iptables), ["INPUT", "-i", bridge, *tag, "-j", "DROP"]),
        ]
        if self._ip6tables:
            jumps.append((self._ip6tables, ["INPUT", "-i", bridge, *tag, "-j", "DROP"]))
        return jumps

    def _refuse(self, why: str) -> None:
        if self.mode == "require":
            raise SandboxUnavailableError(
                f"session networks cannot be kept from the host and 169.254.0.0/16 ({why}), and "
                f"{self.setting} is 'require'"
            )
        if not self._warned:
            self._warned = True
            self._log.warning(
                "sandbox-docker: no host firewall for session bridges (%s): egress sessions reach this host "
                "and 169.254.169.254",
                why,
            )

    def in_force(self, network: str) -> bool:
        """Whether :meth:`protect` has nothing left to do for ``network``: its bridge's rules are in place
        (this process set them and did not release them since), or there are none to set and none are
        required (the firewall is off, or unavailable in mode "auto")."""
        if self._why_not is not None:
            return self.mode != "require"
        return bridge_name(network) in self._walled

    async def protect(self, network: str, network_id: str | None = None) -> None:
        """Make sure the rules for ``network``'s bridge are in place (before a session joins it). ``network_id``:
        the engine's id of the network now under that name. Rules set for another one (a network another server
        removed, with its rules, and someone made again) are set again."""
        if self._why_not is not None:
            if self.mode != "off":
                self._refuse(self._why_not)
            return
        bridge = bridge_name(network)
        if bridge in self._walled and (network_id is None or self._walled[bridge] in (None, network_id)):
            return
        if not os.path.exists(f"/sys/class/net/{bridge}"):
            self._refuse(f"bridge {bridge} is not in this process's network namespace")
            return
        # the chain is declared (made, or emptied) and filled in one commit: a second server protecting the
        # same bridge at once never leaves its rules interleaved out of order
        chain = chain_name(bridge)
        script = [
            "*filter",
            f":{chain} - [0:0]",
            *(shlex.join(["-A", chain, *r]) for r in self._chain_rules(bridge)),
        ]
        status, out = await self._run(
            f"{self._iptables}-restore", "--noflush", feed="\n".join([*script, "COMMIT", ""]).encode()
        )
        if status != 0:
            self._refuse(f"iptables-restore refused the chain {chain}: {out.strip()[:200]}")
            return
        for tool, rule in self._jumps(bridge):
            status, _ = await self._run(tool, "-C", *rule)
            if status != 0:
                status, out = await self._run(tool, "-I", *rule)
                if status != 0 and tool == self._iptables:
                    self._refuse(f"{os.path.basename(tool)} refused a rule: {out.strip()[:200]}")
                    return
        self._walled[bridge] = network_id

    async def release(self, network: str) -> None:
        """Remove the rules of ``network``'s bridge (the network is gone)."""
        bridge = bridge_name(network)
        self._walled.pop(bridge, None)
        if self._why_not is not None:
            return
        for tool, rule in self._jumps(bridge):
            for _ in range(4):  # duplicates, should two servers have added them at once
                status, _ = await self._run(tool, "-D", *rule)
                if status != 0:
                    break
        await self._drop_chain(chain_name(bridge))

    async def _drop_chain(self, chain: str) -> None:
        await self._run(str(self._iptables), "-F", chain)
        await self._run(str(self._iptables), "-X", chain)

    async def sweep(self, live: set[str]) -> None:
        """Remove this deployment's rules and chains whose bridge is none of the networks ``live``."""
        if self._why_not is not None:
            return
        keep = {bridge_name(n) for n in live}
        tools = [str(self._iptables), *([self._ip6tables] if self._ip6tables else [])]
        for tool in tools:
            status, out = await self._run(tool, "-S")
            if status != 0:
                continue
            gone_chains = set()
            for line in out.splitlines():
                words = line.split()
                if self.comment not in line or words[:1] != ["-A"]:
                    continue
                bridge = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-i", "-o")), "")
                if not bridge.startswith(BRIDGE_PREFIX) or bridge in keep:
                    continue
                self._walled.pop(bridge, None)
                if words[1] == chain_name(bridge):
                    gone_chains.add(words[1])
                else:
                    await self._run(tool, "-D", *[w.strip('"') for w in words[1:]])
            for chain in gone_chains:  # after the jumps to them are gone
                await self._drop_chain(chain)


class SessionBridges:
    """A docker provider's session networks on its engine: each owner's egress and internal bridges and the
    pool's holding bridge, made on demand with a subnet of their own and their firewall rules, and removed
    when idle. Callers hold the network's lock (:class:`NetworkLocks`) around :meth:`ensure`, :meth:`drop`
    and :meth:`release`.

    ``idle_seconds``: how long :meth:`release` keeps a network its last session left (the owner's next
    session then joins it: making a bridge and its firewall rules is about a fifth of a cold create). A kept
    network is removed when that time passes with no session on it, at :meth:`close`, or by another server's
    reap; a create that finds it removed meanwhile makes it again."""

    def __init__(
        self,
        engine: DockerEngine,
        *,
        locks: NetworkLocks,
        firewall: HostFirewall,
        labels: Mapping[str, str],
        pick_subnet: Callable[[list[dict[str, Any]]], str],
        pick_wide_subnet: Callable[[list[dict[str, Any]]], str] | None = None,
        idle_seconds: float = 0.0,
    ) -> None:
        self._engine = engine
        self._locks = locks
        self.idle_seconds = idle_seconds
        #: networks kept idle by :meth:`release`, with the timer that removes each
        self._kept: dict[str, asyncio.TimerHandle] = {}
        self._removals: set[asyncio.Task[bool]] = set()
        self.firewall = firewall
        self._labels = dict(labels)
        self._pick_subnet = pick_subnet
        #: the subnets of filtered networks (all of an owner's sessions with an egress policy are on one)
        self._pick_wide_subnet = pick_wide_subnet or pick_subnet
        #: subnets picked for networks being made (listed by the engine once made), and their lock
        self._picked: set[str] = set()
        self._picking = threading.Lock()

    async def ensure(self, network: str, kind: str) -> None:
        """Make ``network`` (kind egress, internal, filtered or pool) unless it exists, with a subnet of its own, and
        its host firewall rules."""
        if (kept := self._kept.pop(network, None)) is not None:
            kept.cancel()
        # a filtered network holds all of an owner's sessions with a policy; the pool's holding one, its containers
        pick = self._pick_wide_subnet if kind in ("filtered", "pool") else self._pick_subnet
        picked: list[str] = []

        def subnet(networks: list[dict[str, Any]]) -> str:
            # (in the engine call's worker thread) the subnets of networks this process is making at the same
            # time are not listed yet: they are kept out, so this process never races itself for one
            with self._picking:
                chosen = pick([*networks, *({"IPAM": {"Config": [{"Subnet": s}]}} for s in self._picked)])
                self._picked.add(chosen)
                picked.append(chosen)
                return chosen

        try:
            network_id = await self._engine.ensure_network(
                network,
                labels={**self._labels, LABEL_NETWORK: kind, LABEL_CREATED: repr(time.time())},
                options=bridge_options(kind, network),
                internal=kind != "egress",
                subnet=subnet,
            )
        finally:
            with self._picking:
                self._picked.difference_update(picked)
        await self.firewall.protect(network, network_id)

    async def drop(self, network: str, *, leaving: Sequence[str] = ()) -> bool:
        """Remove ``network`` (and its firewall rules) when no container but those ``leaving`` (just
        removed) is on it. True when it is gone."""
        if not await self._engine.drop_network_if_idle(network, leaving=leaving):
            return False
        await self.firewall.release(network)
        return True

    async def release(self, network: str, *, leaving: Sequence[str] = ()) -> None:
        """Its last session left ``network`` (``leaving``: the containers just removed): keep it for
        ``idle_seconds``, then remove it if no session joined it meanwhile (0: remove it now)."""
        if self.idle_seconds <= 0:
            await self.drop(network, leaving=leaving)
            return
        if (kept := self._kept.pop(network, None)) is not None:
            kept.cancel()
        self._kept[network] = asyncio.get_running_loop().call_later(
            self.idle_seconds, self._remove_kept, network
        )

    def _remove_kept(self, network: str) -> None:
        self._kept.pop(network, None)
        task = asyncio.ensure_future(self.drop_if_idle(network))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def close(self) -> None:
        """Remove every network kept idle now (one a session still uses, another server's, stays), and wait for
        removals under way."""
        kept, self._kept = self._kept, {}
        for timer in kept.values():
            timer.cancel()
        for network in kept:
            await self.drop_if_idle(network)
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)

    async def drop_if_idle(self, network: str) -> bool:
        """:meth:`drop` under the network's lock, errors aside."""
        async with self._locks.hold(network):
            with contextlib.suppress(SandboxError):
                return await self.drop(network)
        return False

    async def reclaim(self, summaries: Sequence[Mapping[str, Any]], now: float) -> None:
        """Networks no session is on (left by a crash between a network's making and its session's start,
        or by a teardown that failed midway) older than a grace go, with firewall rules whose bridge is gone.
        ``summaries``: the engine's listing of the provider's containers."""
        in_use = {
            name
            for summary in summaries
            for name in ((summary.get("NetworkSettings") or {}).get("Networks") or {})
        }
        live = set()
        for network in await self._engine.networks(LABEL_NETWORK):
            name = str(network.get("Name"))
            try:
                made = float((network.get("Labels") or {}).get(LABEL_CREATED, "0"))
            except ValueError:
                made = 0.0
            if (
                name in in_use
                or name in self._kept
                or now - made < REAP_GRACE_SECONDS
                or not await self.drop_if_idle(name)
            ):
                live.add(name)
        await self.firewall.sweep(live)
