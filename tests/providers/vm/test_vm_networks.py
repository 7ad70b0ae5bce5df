"""vm sessions on a network: each sits on its owner's bridge of the Docker engine through a seat (a container
whose network namespace its QEMU runs in, see providers/vm/networks.py), so an owner's internal sessions
reach each other and nothing else, egress routes out, and neither reaches the host. Real QEMU guests under TCG
on the real engine; run as root (CI is)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.providers.vm import VmSandbox
from jupyter_tai_sandbox.providers.vm.networks import LABEL_SEAT, host_nameservers
from tests.support import DEPLOYMENT
from tests.support.docker import host_listener
from tests.support.vm import missing, need_qemu

pytestmark = [pytest.mark.docker, pytest.mark.slow(90), pytest.mark.timeout(300)]


@pytest.fixture(scope="module", autouse=True)
def qemu() -> None:
    need_qemu()
    if os.geteuid() != 0:
        missing("root (a vm session's seat is set up by the server as root)")


@pytest.fixture
def sandbox(client, request) -> Iterator[VmSandbox]:
    """A provider of the test's own deployment and state folder; afterwards nothing of it is left: no VM, no
    seat, no bridge."""
    state = tempfile.mkdtemp(prefix="tai-vmn-", dir="/tmp")
    deployment = f"{DEPLOYMENT}-vmnet-{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]}"
    made = VmSandbox(accel="tcg", state_dir=state, deployment=deployment)
    yield made
    mine = {"label": f"jupyter-tai-sandbox.deployment={made.scope.labels['jupyter-tai-sandbox.deployment']}"}
    try:
        assert asyncio.run(made.list()) == [] and made._machines.ids() == []
        assert client.containers.list(all=True, filters=mine) == [], "a seat was left"
        assert client.networks.list(filters=mine) == [], "an owner's bridge was left"
    finally:

        async def close() -> None:
            for info in await made.list():
                with contextlib.suppress(Exception):
                    await (await made.get(info.id)).destroy()
            await made.reap()
            await made.close()

        asyncio.run(close())
        for container in client.containers.list(all=True, filters=mine):
            container.remove(force=True)
        shutil.rmtree(state, ignore_errors=True)


async def sh(session, script: str) -> bytes:
    return (await session.exec(["sh", "-c", script], timeout_seconds=30)).stdout


async def address_of(session) -> str:
    return (await sh(session, "ip -4 -o addr show eth0")).split()[3].split(b"/")[0].decode()


def docker0_address(client) -> str:
    """The host's address on the engine's default bridge (its record names it, or it is its subnet's first)."""
    config = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


async def reach(session, address: str, port: int) -> bytes:
    return await sh(session, f"nc -w 2 {address} {port} </dev/null 2>&1; echo rc=$?")


async def serve_pong(session, port: int = 9000):
    listener = await session.exec_start(
        ["sh", "-c", f"while true; do echo pong | nc -l -p {port}; done"], timeout_seconds=120
    )
    await asyncio.sleep(0.3)
    return listener


def test_internal_sessions_of_one_owner_reach_each_other_and_nothing_else(sandbox, client):
    async def main():
        made = []
        try:
            for owner in ("alice", "alice", "bob"):
                made.append(await sandbox.create(SessionSpec(network="internal", owner=owner)))
            alice1, alice2, bob = made
            made.append(alice_out := await sandbox.create(SessionSpec(network="egress", owner="alice")))
            target = await address_of(alice1)
            listener = await serve_pong(alice1)
            try:
                assert b"pong" in await reach(alice2, target, 9000)  # the same owner: reachable
                for stranger in (bob, alice_out):  # another owner; the owner's own egress session
                    assert b"pong" not in await reach(stranger, target, 9000)
            finally:
                await listener.kill()
            assert b"default" not in await sh(alice2, "ip route")  # no route out
            # each sits on its owner's internal bridge of the engine, through a seat of its own
            seats = {c.labels[LABEL_SEAT]: c for c in client.containers.list(filters={"label": LABEL_SEAT})}
            nets = {s.id: list(seats[s.id].attrs["NetworkSettings"]["Networks"]) for s in made}
            assert nets[alice1.id] == nets[alice2.id] != nets[bob.id]
            assert all(client.networks.get(n[0]).attrs["Internal"] for n in (nets[alice1.id], nets[bob.id]))
            seat = seats[alice1.id].attrs
            assert seat["HostConfig"]["CapDrop"] == ["ALL"] and seat["HostConfig"]["ReadonlyRootfs"]
            # the guest is the seat's container to the engine: its address
            assert seat["NetworkSettings"]["Networks"][nets[alice1.id][0]]["IPAddress"] == target
            none = await sandbox.create(SessionSpec(network="none", owner="alice"))
            made.append(none)
            assert (await sh(none, "ls /sys/class/net")).split() == [b"lo"]
        finally:
            for session in made:
                await session.destroy()

    asyncio.run(main())


def test_egress_routes_out_but_never_to_the_host(sandbox, client):
    """Through its bridge's gateway the host answers only with the host firewall off (the route out works);
    with it on, neither the gateway, nor another address of the host, nor the metadata range."""

    async def main():
        open_wall = VmSandbox(
            accel="tcg", state_dir=sandbox.state_dir, deployment=sandbox.deployment, egress_firewall="off"
        )
        made = []
        try:
            with host_listener() as port:
                session = await open_wall.create(SessionSpec(network="egress"))
                made.append(session)
                routes = (await sh(session, "ip route")).decode()
                gateway = routes.split("default via ", 1)[1].split()[0]
                assert b"pong" in await reach(session, gateway, port)
                walled = await sandbox.create(SessionSpec(network="egress", owner="alice"))
                made.append(walled)
                own = (await sh(walled, "ip route")).decode().split("default via ", 1)[1].split()[0]
                docker0 = docker0_address(client)
                for address in (own, docker0):
                    assert b"pong" not in await reach(walled, address, port), address
                assert b"rc=0" not in await reach(walled, "169.254.169.254", 80)
                # the host's resolvers that a guest can reach (not those on the host's loopback)
                resolvers = [f"nameserver {ns}" for ns in host_nameservers()]
                assert (await sh(walled, "cat /etc/resolv.conf")).decode().splitlines() == resolvers
        finally:
            for session in made:
                await session.destroy()
            await open_wall.close()

    asyncio.run(main())


def test_a_fork_on_a_network_takes_an_address_of_its_own(sandbox):
    async def main():
        made = []
        try:
            source = await sandbox.create(SessionSpec(network="internal", owner="alice"))
            made.append(source)
            peer = await sandbox.create(SessionSpec(network="internal", owner="alice"))
            made.append(peer)
            listener = await serve_pong(source)
            fork = await source.fork()
            made.append(fork)
            there, here = await address_of(source), await address_of(fork)
            assert there != here
            # the copy's listener came with it (its memory and processes), on its own address; the source's
            # answers still at its own
            assert b"pong" in await reach(peer, here, 9000)
            assert b"pong" in await reach(peer, there, 9000)
            await listener.kill()
        finally:
            for session in made:
                await session.destroy()

    asyncio.run(main())


def test_a_restarted_server_keeps_the_network_and_the_reap_ends_a_session_whose_seat_is_gone(sandbox, client):
    async def main():
        made = []
        try:
            server = await sandbox.create(SessionSpec(network="internal", owner="alice"))
            other = await sandbox.create(SessionSpec(network="internal", owner="alice"))
            made += [server, other]
            target = await address_of(server)
            listener = await serve_pong(server)
            # a second server of the deployment (a restarted one) finds both, still on their network
            again = VmSandbox(accel="tcg", state_dir=sandbox.state_dir, deployment=sandbox.deployment)
            try:
                assert await again.reap() == []
                found = await again.get(other.id)
                assert b"pong" in await reach(found, target, 9000)
                await listener.kill()
                # the engine lost the seat (an engine restart stops it): the session has lost its network
                (seat,) = client.containers.list(filters={"label": f"{LABEL_SEAT}={server.id}"})
                seat.remove(force=True)
                assert await again.reap() == [server.id]
                made.remove(server)
                assert [i.id for i in await again.list()] == [other.id]
            finally:
                await again.close()
        finally:
            for session in made:
                await session.destroy()

    asyncio.run(main())
