"""Session networks on a real engine: per-owner egress bridges with inter-container traffic off, subnets
from the operator's range, the host firewall, the capacity error and the reaper (issue 24.5, issue 29)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import subprocess
import threading
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxCapacityError, SessionSpec
from jupyter_tai_sandbox.errors import error_status
from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.providers import _docker_networks
from jupyter_tai_sandbox.providers._docker_networks import bridge_name
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from tests.support import RUN_PREFIX
from tests.support.docker import (
    RUN_LABEL,
    TEST_IMAGE,
    docker_client,
    host_listener,
    leftovers,
    provider,
    python_image,
    spec,
)
from tests.support.server import call, server_config

pytestmark = [pytest.mark.docker, pytest.mark.slow(55)]

#: ranges of these tests' own, away from the default one other tests use at the same time
TINY_POOL = "10.215.77.0/26"
OWN_POOL = "10.215.0.0/20"


def networks_of(client, container_id: str) -> dict:
    return client.api.inspect_container(container_id)["NetworkSettings"]["Networks"]


def address_of(client, container_id: str) -> str:
    (settings,) = networks_of(client, container_id).values()
    return settings["IPAddress"]


async def listen(session, port: int = 7070):
    """A command in ``session`` answering ``hello`` to one connection on ``port``."""
    command = await session.exec_start(["sh", "-c", f"echo hello | nc -l -p {port}"], timeout_seconds=60)
    await asyncio.sleep(0.3)
    return command


async def reach(session, address: str, port: int = 7070) -> bytes:
    result = await session.exec(
        ["sh", "-c", f"nc -w 2 {address} {port} </dev/null 2>&1; echo rc=$?"], timeout_seconds=20
    )
    return result.stdout


def firewall_rules() -> str:
    return "".join(
        subprocess.run([tool, "-w", "-S"], capture_output=True, text=True).stdout
        for tool in ("iptables", "ip6tables")
    )


def firewall_dump() -> str:
    """The host's whole ruleset, for the message of a failed isolation check (a flake seen once under load)."""
    return subprocess.run(["iptables-save"], capture_output=True, text=True).stdout


firewall = pytest.mark.skipif(
    os.geteuid() != 0 or subprocess.run(["which", "iptables"], capture_output=True).returncode != 0,
    reason="the host firewall needs root and iptables on the engine's host",
)


def test_egress_sessions_of_different_owners_cannot_reach_each_other_or_foreign_containers(client):
    foreign = client.containers.run(
        TEST_IMAGE,
        ["sh", "-c", "while true; do echo hello | nc -l -p 7070; done"],
        entrypoint=[],
        detach=True,
        labels=RUN_LABEL,
        network_mode="bridge",
    )

    async def main() -> None:
        sandbox = provider(idle_network_seconds=0)  # each owner's network goes with their last session
        made = []
        try:
            alice = await sandbox.create(spec(owner="alice"))
            made.append(alice)
            alice2 = await sandbox.create(spec(owner="alice"))
            made.append(alice2)
            bob = await sandbox.create(spec(owner="bob"))
            made.append(bob)
            nets = {s: networks_of(client, s.container_id) for s in (alice, alice2, bob)}
            # each owner has an egress bridge of its own, never the default one, inter-container traffic off
            assert list(nets[alice]) == list(nets[alice2]) != list(nets[bob])
            for names in nets.values():
                (name,) = names
                assert name != "bridge"
                options = client.api.inspect_network(name)["Options"]
                assert options["com.docker.network.bridge.enable_icc"] == "false"
                address = ipaddress.ip_address(names[name]["IPAddress"])
                assert (
                    address in ipaddress.ip_network(sandbox.network_pool) and names[name]["IPPrefixLen"] == 26
                )
            # the isolation does not hang on the engine's own jumps alone (it deletes and inserts them again at
            # every network create or remove): FORWARD itself sends each session bridge's traffic to a chain
            # that returns its own and drops the rest
            rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout.splitlines()
            for names in nets.values():
                bridge = _docker_networks.bridge_name(next(iter(names)))
                chain = _docker_networks.chain_name(bridge)
                for way in ("-i", "-o"):
                    assert any(
                        r.startswith(f"-A FORWARD {way} {bridge} ") and r.endswith(f"-j {chain}")
                        for r in rules
                    ), (bridge, way, rules)
                own = [
                    r.split(" -m ")[0] + " " + r.split()[-1] for r in rules if r.startswith(f"-A {chain} ")
                ]
                assert own[0] == f"-A {chain} -i {bridge} -o {bridge} RETURN", own
                for other in _docker_networks.OTHER_BRIDGES:
                    assert f"-A {chain} -i {bridge} -o {other} DROP" in own, own
                assert own[-1] == f"-A {chain} -o {bridge} DROP", own
            # egress keeps its route out
            routes = (await alice.exec(["cat", "/proc/net/route"], timeout_seconds=10)).stdout
            assert any(line.split()[1:2] == [b"00000000"] for line in routes.splitlines()[1:]), routes
            for target, peer in ((bob, alice), (alice2, alice), (alice, bob)):
                listener = await listen(target)
                try:
                    got = await reach(peer, address_of(client, target.container_id))
                    assert b"hello" not in got and b"rc=0" not in got, (got, nets, firewall_dump())
                finally:
                    await listener.kill()
            foreign.reload()
            got = await reach(alice, foreign.attrs["NetworkSettings"]["IPAddress"])
            assert b"hello" not in got and b"rc=0" not in got, (got, nets, firewall_dump())
            for session in (alice, alice2, bob):
                await session.destroy()
            for names in nets.values():
                assert not client.networks.list(names=list(names)), names  # the idle owner networks are gone
        finally:
            for session in made:  # a failed check leaves nothing for the next test to trip on
                with contextlib.suppress(Exception):
                    await session.destroy()
            await sandbox.close()

    try:
        asyncio.run(main())
    finally:
        foreign.remove(force=True)
    assert leftovers(client) == []


#: a UDP counter: how many datagrams reached port 7071 in its first ``argv[1]`` seconds
UDP_COUNTER = """import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 7071)); s.settimeout(0.5)
end, n = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    try: s.recv(64); n += 1
    except OSError: pass
print(n)"""
#: a UDP flood: datagrams to ``argv[2]``:7071 for ``argv[1]`` seconds, then how many were sent
UDP_FLOOD = """import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, n = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    s.sendto(b"x", (sys.argv[2], 7071)); n += 1
print(n)"""


def test_another_owners_bridge_stays_unreachable_while_the_engine_rewrites_its_rules(client):
    """Every network create or remove on the engine (any deployment's) makes it delete and insert again the jumps
    its bridge-to-bridge isolation hangs on. Under that churn a flood of datagrams from bob's egress session
    reached alice's (about 270,000 of 9.9 million in 20 s before the per-bridge chains) and a foreign
    container on the default bridge: none may."""
    python_image().close()  # there, or a skip (a failure in CI)
    image = PYTHON_IMAGE
    foreign = client.containers.run(
        image,
        ["python3", "-c", UDP_COUNTER, "14"],
        entrypoint=[],
        detach=True,
        labels=RUN_LABEL,
        network_mode="bridge",
    )
    stop = threading.Event()

    def churn() -> None:
        churner = docker_client()
        try:
            turn = 0
            while not stop.is_set():
                churner.networks.create(f"{RUN_PREFIX}churn-{turn % 3}", labels=RUN_LABEL).remove()
                turn += 1
        finally:
            churner.close()

    async def main() -> None:
        sandbox = DockerSandbox(image=image, extra_labels=RUN_LABEL)
        made = []
        try:
            alice = await sandbox.create(SessionSpec(image=image, consumer="network-tests", owner="alice"))
            made.append(alice)
            bob = await sandbox.create(SessionSpec(image=image, consumer="network-tests", owner="bob"))
            made.append(bob)
            counter = await alice.exec_start(["python3", "-c", UDP_COUNTER, "12"], timeout_seconds=60)
            await asyncio.sleep(1)
            foreign.reload()
            churner = threading.Thread(target=churn)
            churner.start()
            try:
                floods = await asyncio.gather(
                    bob.exec(
                        ["python3", "-c", UDP_FLOOD, "8", address_of(client, alice.container_id)],
                        timeout_seconds=60,
                    ),
                    bob.exec(
                        ["python3", "-c", UDP_FLOOD, "8", foreign.attrs["NetworkSettings"]["IPAddress"]],
                        timeout_seconds=60,
                    ),
                )
            finally:
                stop.set()
                await asyncio.to_thread(churner.join)
            sent = [int(flood.stdout) for flood in floods]
            assert min(sent) > 50_000, sent  # the probe had the power to see a lapse
            got = b""
            async for item in counter.output:
                got += getattr(item, "data", b"")
            assert got.strip() == b"0", (got, sent, firewall_dump())
            foreign.wait(timeout=30)
            assert foreign.logs().strip() == b"0", (foreign.logs(), sent, firewall_dump())
        finally:
            for session in made:
                with contextlib.suppress(Exception):
                    await session.destroy()
            await sandbox.close()

    try:
        asyncio.run(main())
    finally:
        foreign.remove(force=True)
    assert leftovers(client) == []


def test_control_two_containers_on_one_plain_bridge_reach_each_other(client):
    """The probe itself works: with inter-container traffic on, nc gets through."""
    net = client.networks.create("tai-test-icc-control", labels=RUN_LABEL)
    started = []
    try:
        for command in (["sh", "-c", "echo hello | nc -l -p 7070"], ["sleep", "60"]):
            started.append(
                client.containers.run(
                    TEST_IMAGE, command, entrypoint=[], detach=True, labels=RUN_LABEL, network=net.name
                )
            )
        started[0].reload()
        address = started[0].attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"]
        _, out = started[1].exec_run(["sh", "-c", f"sleep 0.3; nc -w 2 {address} 7070 </dev/null"])
        assert b"hello" in out, out
    finally:
        for container in started:
            container.remove(force=True)
        net.remove()


@firewall
def test_egress_session_cannot_reach_the_host_and_its_rules_go_with_the_network(client):
    async def main() -> None:
        sandbox = provider(idle_network_seconds=0)
        try:
            with host_listener() as port:
                session = await sandbox.create(spec(owner="carol"))
                ((name, settings),) = networks_of(client, session.container_id).items()
                bridge = bridge_name(name)
                rules = firewall_rules()
                assert f"-i {bridge}" in rules and "169.254.0.0/16" in rules, rules
                host_addresses = {
                    settings["Gateway"],
                    *subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split(),
                }
                for address in host_addresses:
                    if ":" in address:
                        continue
                    got = await reach(session, address, port)
                    assert b"pong" not in got and b"rc=0" not in got, (address, got)
                await session.destroy()
                rules = firewall_rules()
                assert f"-i {bridge}" not in rules and f"-o {bridge}" not in rules, rules
                assert _docker_networks.chain_name(bridge) not in rules, rules
        finally:
            await sandbox.close()

    asyncio.run(main())


def test_a_network_left_by_a_crash_is_reclaimed_by_the_reaper(client, monkeypatch):
    monkeypatch.setattr(_docker_networks, "REAP_GRACE_SECONDS", 0.0)

    async def main() -> None:
        sandbox = provider()
        try:
            session = await sandbox.create(spec(owner="dave", network="internal"))
            egress = await sandbox.create(spec(owner="dave"))
            names = [*networks_of(client, session.container_id), *networks_of(client, egress.container_id)]
            for container_id in (session.container_id, egress.container_id):
                client.api.remove_container(
                    container_id, force=True, v=True
                )  # the server died before its teardown
            assert all(client.networks.list(names=[n]) for n in names)
            await sandbox.reap()
            assert not any(client.networks.list(names=[n]) for n in names), names
            rules = firewall_rules()
            assert not any(bridge_name(n) in rules for n in names), rules
        finally:
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


@firewall
def test_the_reaper_removes_the_rules_and_chain_of_a_bridge_removed_behind_its_back(client):
    async def main() -> None:
        sandbox = provider()
        try:
            session = await sandbox.create(spec(owner="gina"))
            (name,) = networks_of(client, session.container_id)
            bridge = bridge_name(name)
            chain = _docker_networks.chain_name(bridge)
            assert f"-N {chain}" in firewall_rules()
            client.api.remove_container(session.container_id, force=True, v=True)
            client.api.remove_network(name)  # the server died between the two, or someone else removed it
            assert f"-N {chain}" in firewall_rules()
            await sandbox.reap()
            rules = firewall_rules()
            assert bridge not in rules and chain not in rules, rules
        finally:
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_sessions_of_one_owner_destroyed_together_take_their_network_with_them(client):
    """Each destroy may still see the other containers' endpoints (the engine lists them for a moment
    after a removal); the last one out must not take those for users and leave the network behind."""

    async def main() -> None:
        sandbox = provider(idle_network_seconds=0)
        try:
            for _ in range(3):
                sessions = await asyncio.gather(*(sandbox.create(spec(owner="frank")) for _ in range(4)))
                (name,) = networks_of(client, sessions[0].container_id)
                await asyncio.gather(*(session.destroy() for session in sessions))
                assert not client.networks.list(names=[name]), f"{name} outlived every session on it"
        finally:
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the host firewall needs root (CI runs as root)")
def test_a_network_another_server_removed_gets_its_firewall_rules_again_when_made_anew(client):
    """Server A set the rules of an owner's bridge; server B removed the network with its last session (and
    the rules with it); A's next session of that owner is on a new network of the same name: its rules are
    set again, not taken for the old network's."""

    async def main() -> None:
        a, b = provider(idle_network_seconds=0), provider(idle_network_seconds=0)
        try:
            first = await a.create(spec(owner="hana"))
            (name,) = networks_of(client, first.container_id)
            second = await b.create(spec(owner="hana"))
            await first.destroy()  # B's session still holds the network: it stays, A's rules with it
            await second.destroy()  # B removes the network and its rules
            assert not client.networks.list(names=[name])
            assert _docker_networks.chain_name(bridge_name(name)) not in firewall_rules()
            with host_listener() as port:
                third = await a.create(spec(owner="hana"))
                try:
                    settings = networks_of(client, third.container_id)[name]
                    assert _docker_networks.chain_name(bridge_name(name)) in firewall_rules()  # set again
                    got = await reach(third, settings["Gateway"], port)
                    assert b"pong" not in got and b"rc=0" not in got, got
                finally:
                    await third.destroy()
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_an_owners_idle_network_waits_for_their_next_session_then_goes(client, monkeypatch):
    """DockerSandbox.idle_network_seconds: the owner's next session joins the network their last one left
    (no bridge nor firewall rules made again); it goes once idle that long, at close(), or by another
    server's reap, and a create after that makes it again."""

    async def main() -> None:
        sandbox = provider(idle_network_seconds=2)
        other = provider()  # another server of the deployment
        try:
            session = await sandbox.create(spec(owner="gina"))
            (name,) = networks_of(client, session.container_id)
            made = client.networks.get(name).id
            await session.destroy()
            assert client.networks.get(name).id == made  # kept, idle
            session = await sandbox.create(spec(owner="gina"))
            assert client.networks.get(name).id == made  # joined, not made again
            if os.geteuid() == 0:  # the host firewall is set (mode auto)
                assert bridge_name(name) in firewall_rules()
            await session.destroy()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and (
                client.networks.list(names=[name]) or f"-i {bridge_name(name)} " in firewall_rules()
            ):
                await asyncio.sleep(0.2)
            assert not client.networks.list(names=[name]), f"{name} outlived idle_network_seconds"
            assert f"-i {bridge_name(name)} " not in firewall_rules()  # its rules went with it

            sandbox.idle_network_seconds = 60
            sandbox._bridges.idle_seconds = 60
            session = await sandbox.create(spec(owner="gina"))
            await session.destroy()
            assert client.networks.list(names=[name])
            monkeypatch.setattr(_docker_networks, "REAP_GRACE_SECONDS", 0.0)
            await sandbox.reap()
            assert client.networks.list(names=[name]), "the server that keeps it reaped it"
            await other.reap()
            assert not client.networks.list(names=[name]), "another server's reap left an idle network"
            session = await sandbox.create(spec(owner="gina"))
            assert (await session.exec(["true"], timeout_seconds=10)).exit_code == 0
            await session.destroy()
            assert client.networks.list(names=[name])
            await sandbox.close()
            assert not client.networks.list(names=[name]), "close() left an idle network"
        finally:
            await sandbox.close()
            await other.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_a_network_within_its_grace_is_left_to_its_creator(client, monkeypatch):
    async def main() -> None:
        sandbox = provider()
        try:
            session = await sandbox.create(spec(owner="erin"))
            (name,) = networks_of(client, session.container_id)
            client.api.remove_container(session.container_id, force=True, v=True)
            await sandbox.reap()
            assert client.networks.list(names=[name])  # maybe another server's, about to be joined
            monkeypatch.setattr(_docker_networks, "REAP_GRACE_SECONDS", 0.0)
            await sandbox.reap()
            assert not client.networks.list(names=[name])
        finally:
            await sandbox.close()

    asyncio.run(main())


def test_session_subnets_come_from_the_configured_range(client):
    async def main() -> None:
        sandbox = provider(network_pool=OWN_POOL, network_prefix=28)
        try:
            sessions = [
                await sandbox.create(spec(owner=owner, network=mode))
                for owner in ("f1", "f2")
                for mode in ("egress", "internal")
            ]
            subnets = set()
            for session in sessions:
                (name,) = networks_of(client, session.container_id)
                (config,) = client.api.inspect_network(name)["IPAM"]["Config"]
                subnet = ipaddress.ip_network(config["Subnet"])
                assert subnet.prefixlen == 28 and subnet.subnet_of(ipaddress.ip_network(OWN_POOL)), subnet
                subnets.add(subnet)
            assert len(subnets) == 4
            for session in sessions:
                await session.destroy()
        finally:
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


@pytest.mark.parametrize("pool_size", [0, 1], ids=["cold", "pooled"])
def test_an_owner_past_their_networks_addresses_gets_the_typed_503_naming_the_setting(client, pool_size):
    """A /29 holds 5 sessions (8 addresses less the network's, the broadcast and the engine's gateway): the
    sixth create of one owner is SandboxCapacityError (503) naming network_prefix, cold or from the pool,
    never the engine's 500; the five keep working and a session of another owner is still made."""

    async def main() -> None:
        sandbox = provider(network_pool=OWN_POOL, network_prefix=29, pool_size=pool_size)
        made = []
        try:
            for _ in range(5):
                made.append(await sandbox.create(spec(owner="hana")))
            with pytest.raises(SandboxCapacityError, match=r"DockerSandbox\.network_prefix") as refused:
                made.append(await sandbox.create(spec(owner="hana")))
            assert error_status(refused.value) == 503 and "holds 5 sessions" in str(refused.value)
            assert (await made[0].exec(["true"], timeout_seconds=20)).exit_code == 0
            made.append(await sandbox.create(spec(owner="ivan")))
        finally:
            for session in made:
                await session.destroy()
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_pooled_session_joins_its_owners_egress_network_not_the_pools(client):
    async def main() -> None:
        sandbox = provider(pool_size=1)
        try:
            await sandbox._connect()
            for _ in range(100):
                if sandbox._pool.ready_count():
                    break
                await asyncio.sleep(0.1)
            assert sandbox._pool.ready_count() == 1
            pooled = await sandbox.create(SessionSpec(owner="gina"))
            assert pooled.record is not None  # it came from the pool
            own = await sandbox.create(spec(owner="gina", network="internal"))
            # it leaves the holding network just after the claim: internal, no host address, no traffic
            # between its containers, so it reaches nothing there meanwhile
            holding = client.api.inspect_network(sandbox.pool_network)
            assert (
                holding["Internal"] and holding["Options"]["com.docker.network.bridge.enable_icc"] == "false"
            )
            for _ in range(100):
                if sandbox.pool_network not in networks_of(client, pooled.container_id):
                    break
                await asyncio.sleep(0.1)
            assert list(networks_of(client, pooled.container_id)) == [
                sandbox.scope.owner_network(sandbox.egress_network, "gina")
            ]
            await pooled.destroy()
            await own.destroy()
        finally:
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_an_owners_spare_waits_on_their_network_and_serves_only_them(client):
    """After an owner takes from the pool, the refill waits on that owner's egress network (their next
    create joins no network); another owner never gets it, and close() removes it and its network."""

    async def ready_on(sandbox, network: str) -> str:
        for _ in range(200):
            found = [r for r in sandbox._pool._ready if r.network == network]
            if found:
                return found[0].container_id
            await asyncio.sleep(0.1)
        raise AssertionError(f"no spare on {network}")

    async def main() -> None:
        sandbox = provider(pool_size=2)
        hana = sandbox.scope.owner_network(sandbox.egress_network, "hana")
        try:
            await sandbox._connect()
            await ready_on(sandbox, "")
            first = await sandbox.create(SessionSpec(owner="hana"))
            assert first.record is not None
            spare = await ready_on(sandbox, hana)
            await ready_on(sandbox, "")  # the refill: the other waits on the holding network
            assert list(networks_of(client, spare)) == [hana]  # on hana's network, with no session label
            await first.destroy()  # hana's last session: her network stays for the spare
            assert hana in {n.name for n in client.networks.list(names=[hana])}
            ivan = await sandbox.create(SessionSpec(owner="ivan"))
            assert ivan.record is not None and ivan.container_id != spare
            second = await sandbox.create(SessionSpec(owner="hana"))
            assert second.container_id == spare and second.record is not None
            assert (await second.exec(["true"], timeout_seconds=10)).exit_code == 0
            assert list(networks_of(client, spare)) == [hana]
            await second.destroy()
            await ivan.destroy()
        finally:
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []
    asyncio.run(main())
    assert leftovers(client) == []


# ------------------------------------------------------------------- the REST door


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "docker", tmp_path / "sandboxes", DockerSandbox={"network_pool": TINY_POOL, "network_prefix": 26}
    )


async def test_an_exhausted_network_range_answers_503_naming_the_setting(jp_fetch):
    status, first = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120, "network": "internal"}
    )
    assert status == 201, first
    try:
        status, body = await call(
            jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120, "network": "egress"}
        )
        assert status == 503, body
        assert body["error"] == "SandboxCapacityError"
        assert "network_pool" in body["message"] and TINY_POOL in body["message"], body
    finally:
        await call(jp_fetch, "sessions", first["id"], method="DELETE")
