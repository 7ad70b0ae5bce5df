"""Networks of vm sessions: an ``egress`` or ``internal`` session is a member of its owner's bridge on the
Docker engine of this host, the same bridges, subnets and host firewall as a docker session's
(``_docker_networks``), through a *seat*.

A seat is a small container of the session's own on that bridge (no capabilities, a read-only root, the
session agent's ``serve`` waiting in it), and the session's QEMU runs in its network namespace. There the
seat's interface is bridged to a tap device, the guest's network card, and the seat's own address is taken
off: the guest takes the container's address and MAC. To the engine, its isolation rules, the host firewall
and other sessions, the guest *is* that container: an internal bridge's sessions reach each other and
nothing else, an egress bridge routes out and keeps its sessions apart, neither reaches the host. The guest's
frames never enter the seat's own network stack, which has no address left.

The server makes seats as root on the engine's host (``nsenter``, ``ip``, ``/dev/net/tun``); where it
cannot, a vm provider offers network ``none`` only. A seat's container is removed with its session, and
the reap removes seats whose session is gone; a session whose seat is gone (an engine restart stops it) has
lost its network, and the reap ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import ipaddress
import os
import secrets
import shutil
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...agent.binary import AgentBinaryMissing, agent_binary
from ...contract import SandboxError, SandboxNotFoundError, SandboxUnavailableError
from .._docker_networks import REAP_GRACE_SECONDS, HostFirewall, NetworkLocks, SessionBridges
from ..docker_engine import DockerEngine
from ..docker_engine.names import LABEL

#: on a seat container: the id of the vm session it holds the network of
LABEL_SEAT = f"{LABEL}.vm-seat"
#: the seat image's name (its tag: the agent binary's hash); the engine's, shared by every deployment
SEAT_IMAGE = "tai-sbx-vm-seat"
#: the guest's card in the seat's network namespace, and the bridge joining it to the seat's interface
TAP = "tai0"
SEAT_BRIDGE = "taibr"
#: how long the seat's plumbing may take
PLUMB_SECONDS = 10.0


def seat_name(session_id: str) -> str:
    return f"tai-vmseat-{session_id}"


def networks_unavailable(engine_url: str) -> str | None:
    """Why this server cannot seat vm sessions on the engine at ``engine_url``, or None when it can."""
    if not engine_url.startswith("unix://"):
        return f"the engine at {engine_url} is not on this host"
    if not os.path.exists(engine_url[len("unix://") :]):
        return f"no Docker engine at {engine_url}"
    if os.geteuid() != 0:
        return "the server does not run as root"
    missing = [tool for tool in ("nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (Debian: util-linux, iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing"
    return None


@dataclass(frozen=True)
class Seat:
    """A session's seat: its container's process (whose network namespace QEMU joins) and the address the
    guest takes."""

    container_id: str
    pid: int
    address: str
    prefix: int
    mac: str
    gateway: str | None  # egress only: internal and filtered bridges route nowhere
    nameservers: tuple[str, ...]

    @property
    def enter(self) -> list[str]:
        """The words that run a program in the seat's network namespace."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--"]

    def guest_script(self, roots: Sequence[str] = ("",)) -> str:
        """The guest's root's shell lines that give its card the seat's address (and route, and resolvers in
        the ``/etc`` of each of ``roots``): a restored or forked guest's card has another's until then."""
        lines = [
            f"ip link set eth0 down && ip link set eth0 address {self.mac} && ip addr flush dev eth0",
            f"ip addr add {self.address}/{self.prefix} dev eth0 && ip link set eth0 up",
        ]
        if self.gateway:
            lines.append(f"ip route replace default via {self.gateway}")
        resolv = "".join(f"nameserver {ns}\\n" for ns in self.nameservers)
        for root in roots:
            lines.append(f"mkdir -p {root}/etc && printf '{resolv}' > {root}/etc/resolv.conf")
        return " && ".join(lines)


def host_nameservers(path: str = "/etc/resolv.conf") -> tuple[str, ...]:
    """The host's resolvers a guest can use (those on the host's loopback it cannot reach)."""
    found = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ()
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            with contextlib.suppress(ValueError):
                address = ipaddress.ip_address(words[1])
                if address.version == 4 and not address.is_loopback:
                    found.append(str(address))
    return tuple(found[:3])


def _guarded(seat: Seat) -> list[str]:
    """The seat namespace's ebtables rules that hold the guest to its own addresses on a filtered network,
    where its owner's egress gateway knows a session by its source address: frames from the guest's card
    with another MAC, IPv4 or ARP sender address are dropped, IPv6 too (the gateway has none). Without them
    a guest's root could take another session's address (and policy)."""
    rules = [
        ["-A", "FORWARD", "-i", TAP, "-s", "!", seat.mac, "-j", "DROP"],
        ["-A", "FORWARD", "-p", "IPv4", "-i", TAP, "--ip-src", "!", seat.address, "-j", "DROP"],
        ["-A", "FORWARD", "-p", "ARP", "-i", TAP, "--arp-ip-src", "!", seat.address, "-j", "DROP"],
        ["-A", "FORWARD", "-p", "IPv6", "-i", TAP, "-j", "DROP"],
    ]
    return [" ".join(["ebtables", *rule]) for rule in rules]


def _plumbing(seat_mac: str) -> str:
    """The seat namespace's lines: its interface gives up its address and joins a bridge with the tap."""
    return "; ".join(
        [
            "set -e",
            "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 || true",
            f"ip link set eth0 down && ip link set eth0 address {seat_mac} && ip addr flush dev eth0",
            f"ip tuntap add dev {TAP} mode tap && ip link add {SEAT_BRIDGE} type bridge",
            f"ip link set eth0 master {SEAT_BRIDGE} && ip link set {TAP} master {SEAT_BRIDGE}",
            f"ip link set eth0 up && ip link set {TAP} up && ip link set {SEAT_BRIDGE} up",
        ]
    )


class VmSeats:
    """A vm provider's seats on its engine, and its owners' bridges they sit on."""

    def __init__(
        self,
        engine: DockerEngine,
        *,
        locks: NetworkLocks,
        labels: Mapping[str, str],
        pick_subnet: Any,
        firewall: HostFirewall,
    ) -> None:
        self._engine = engine
        self._locks = locks
        self._labels = dict(labels)
        self.bridges = SessionBridges(
            engine, locks=locks, firewall=firewall, labels=labels, pick_subnet=pick_subnet
        )
        self._image: str | None = None

    async def seat(
        self,
        session_id: str,
        network: str,
        kind: str,
        *,
        address: str | None = None,
        nameservers: tuple[str, ...] | None = None,
        held: bool = False,
    ) -> Seat:
        """A seat for the session on ``network`` (made, with its firewall rules, when it is not there). A
        ``filtered`` network's seat (a session with an egress policy) takes the ``address`` its egress gateway
        picked, and the guest the gateway as its resolver (``nameservers``); ``held``: the caller holds the
        network's lock already."""
        image = await self._seat_image()
        options: dict[str, Any] = {
            "name": seat_name(session_id),
            "labels": {**self._labels, LABEL_SEAT: session_id},
            "network": network,
            "hostname": "seat",
            "cap_drop": ["ALL"],
            "read_only": True,
            "security_opt": ["no-new-privileges"],
            "mem_limit": "64m",
            "pids_limit": 32,
        }
        if address is not None:
            endpoint = self._engine.api.create_endpoint_config(ipv4_address=address)
            options["networking_config"] = {network: endpoint}
        async with contextlib.nullcontext() if held else self._locks.hold(network):
            await self.bridges.ensure(network, kind)
            try:
                container_id = await self._engine.create_container(
                    image, options, what="start a vm session's seat"
                )
            except BaseException:
                with contextlib.suppress(SandboxError):
                    await self.bridges.drop(network)
                raise
        try:
            info = await self._engine.inspect_container(container_id)
            attached = ((info.get("NetworkSettings") or {}).get("Networks") or {})[network]
            seat = Seat(
                container_id=container_id,
                pid=int(info["State"]["Pid"]),
                address=attached["IPAddress"],
                prefix=int(attached["IPPrefixLen"]),
                mac=attached["MacAddress"],
                gateway=(attached.get("Gateway") or None) if kind == "egress" else None,
                nameservers=(
                    nameservers
                    if nameservers is not None
                    else await asyncio.to_thread(host_nameservers)
                    if kind == "egress"
                    else ()
                ),
            )
            await _run(
                [
                    *seat.enter,
                    "sh",
                    "-c",
                    _plumbing("02:" + ":".join(secrets.token_hex(5)[i : i + 2] for i in range(0, 10, 2))),
                ]
            )
            if kind == "filtered":
                if shutil.which("ebtables") is None:
                    raise SandboxUnavailableError(
                        "a vm session with an egress policy needs ebtables on the server's host (Debian's "
                        "iptables package has it) to hold its guest to its own address"
                    )
                await _run([*seat.enter, "sh", "-c", "set -e; " + "; ".join(_guarded(seat))])
            return seat
        except BaseException:
            with contextlib.suppress(Exception):
                await self.leave(session_id, network, held=held)
            raise

    async def leave(self, session_id: str, network: str, *, held: bool = False) -> None:
        """Remove the session's seat, and its bridge when no one else sits on it (a filtered network's gateway
        does while it serves); ``held``: the caller holds the network's lock already."""
        await self._engine.remove_container(seat_name(session_id))
        async with contextlib.nullcontext() if held else self._locks.hold(network):
            with contextlib.suppress(SandboxError):
                await self.bridges.drop(network)

    async def seated(self, session_id: str) -> bool:
        """Whether the session's seat runs (True when the engine does not answer: nothing is known)."""
        try:
            info = await self._engine.inspect_container(
                seat_name(session_id), what="inspect a vm session's seat"
            )
        except SandboxNotFoundError:
            return False
        except SandboxError:
            return True
        return bool((info.get("State") or {}).get("Running"))

    async def seats(self) -> list[dict[str, Any]]:
        """The engine's summaries of the deployment's seats."""
        return await self._engine.containers(LABEL_SEAT, what="list the vm sessions' seats")

    async def reap(self, summaries: Sequence[Mapping[str, Any]], keep: set[str], now: float) -> None:
        """Remove the seats (of ``summaries``) of sessions not in ``keep`` once past a grace (a create may be
        about to start its QEMU), then the bridges no one sits on."""
        staying = []
        for summary in summaries:
            session_id = str((summary.get("Labels") or {}).get(LABEL_SEAT))
            if session_id in keep or now - float(summary.get("Created") or 0) < REAP_GRACE_SECONDS:
                staying.append(summary)
                continue
            try:
                await self._engine.remove_container(str(summary["Id"]))
            except SandboxError:
                staying.append(summary)
        await self.bridges.reclaim(staying, now)

    async def _seat_image(self) -> str:
        """The seat image (the session agent alone), imported into the engine when it is not there."""
        if self._image is not None:
            return self._image
        try:
            binary = agent_binary()
        except AgentBinaryMissing as e:
            raise SandboxUnavailableError(str(e)) from None
        data = await asyncio.to_thread(binary.read_bytes)
        tag = hashlib.sha256(data).hexdigest()[:16]
        name = f"{SEAT_IMAGE}:{tag}"
        if not await self._engine.has_image(name):
            archive = io.BytesIO()
            with tarfile.open(fileobj=archive, mode="w") as tar:
                entry = tarfile.TarInfo("tai-agent")
                entry.size, entry.mode, entry.mtime = len(data), 0o755, int(time.time())
                tar.addfile(entry, io.BytesIO(data))
            await self._engine.import_image(
                archive.getvalue(), repository=SEAT_IMAGE, tag=tag, changes=['CMD ["/tai-agent", "serve"]']
            )
        self._image = name
        return name


async def _run(argv: list[str]) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), PLUMB_SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise SandboxUnavailableError(
            f"setting up a vm session's network took over {PLUMB_SECONDS:g} s"
        ) from None
    if process.returncode != 0:
        raise SandboxUnavailableError(
            f"setting up a vm session's network failed: {out.decode(errors='replace').strip()[-500:]}"
        )
