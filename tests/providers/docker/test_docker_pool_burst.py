"""The warm pool under a burst (issue 56, target 4), on a real engine: it fills with several starts at once and
never holds more than its size, concurrent creates each get a container of their own on their owner's network,
the refill runs one start at a time while claims are under way, and close() during a fill leaves nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import threading
import time

import pytest

from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.providers.docker.pool import FILL_STARTS
from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_POOL, LABEL_RECORD, LABEL_SESSION
from tests.support.docker import RUN_FILTER, leftovers, provider, spec

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]


def pooled_ids(client) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": [LABEL_POOL, RUN_FILTER]})}


def networks_of(client, container_id: str) -> set[str]:
    return set(client.api.inspect_container(container_id)["NetworkSettings"]["Networks"])


class Starts:
    """Watches the pool's real starts: how many run at once (at most, and while claims are under way), and
    how many containers the pool held or was starting at each start."""

    def __init__(self, sandbox: DockerSandbox) -> None:
        self.pool = sandbox._pool
        self.running = 0
        self.most = 0
        self.most_during_claims = 0
        self.most_held = 0
        real = self.pool._start

        async def start(*args):
            self.running += 1
            self.most = max(self.most, self.running)
            if self.pool._claims:
                self.most_during_claims = max(self.most_during_claims, self.running)
            self.most_held = max(self.most_held, self.pool.ready_count() + self.pool.starting_count())
            try:
                return await real(*args)
            finally:
                self.running -= 1

        self.pool._start = start


async def filled(sandbox: DockerSandbox, count: int, seconds: float = 120.0) -> None:
    await sandbox.list()  # connects, which starts the pool
    deadline = time.monotonic() + seconds
    while sandbox._pool.ready_count() < count:
        assert time.monotonic() < deadline, f"the pool holds {sandbox._pool.ready_count()} of {count}"
        await asyncio.sleep(0.05)


def test_a_pool_fills_with_several_starts_at_once_and_never_holds_more_than_its_size(client):
    async def main() -> None:
        sandbox = provider(pool_size=6)
        starts = Starts(sandbox)
        try:
            await filled(sandbox, 6)
            assert 1 < starts.most <= FILL_STARTS
            assert starts.most_held <= 6
            await asyncio.sleep(0.5)  # nothing more starts once it is full
            assert sandbox._pool.starting_count() == 0 and sandbox._pool.ready_count() == 6
            assert len(pooled_ids(client)) == 6
            # the holding network takes a subnet 4 times an owner network's: a pool past 61 fills
            (config,) = client.api.inspect_network(sandbox.pool_network)["IPAM"]["Config"]
            assert ipaddress.ip_network(config["Subnet"]).prefixlen == sandbox.network_prefix - 2
        finally:
            await sandbox.close()
        assert pooled_ids(client) == set()

    asyncio.run(main())
    assert leftovers(client) == []


def test_concurrent_creates_each_get_a_container_of_their_own_on_their_owners_network(client):
    """Six creates at once of three owners, from a pool of six: six distinct pooled containers, each named for
    its session with a record naming it, each on its owner's egress network only (once it left the holding
    one); the refill started one container at a time while the claims ran, and refills the pool."""

    async def main() -> None:
        sandbox = provider(pool_size=6)
        made = []
        try:
            await filled(sandbox, 6)
            waiting = pooled_ids(client)
            starts = Starts(sandbox)
            owners = [f"burst-{i % 3}" for i in range(6)]
            made = list(await asyncio.gather(*(sandbox.create(spec(owner=o)) for o in owners)))
            assert {s.container_id for s in made} <= waiting
            assert len({s.container_id for s in made}) == 6 and len({s.id for s in made}) == 6
            for session, owner in zip(made, owners, strict=True):
                assert session.record is not None  # from the pool
                assert client.containers.get(session.container_id).name == f"tai-{session.id}"
                labels = client.volumes.get(session.record).attrs["Labels"]
                assert (labels[LABEL_SESSION], labels[LABEL_RECORD]) == (session.id, session.container_id)
                assert session.spec.owner == owner
            results = await asyncio.gather(
                *(s.exec(["sh", "-c", "echo $HOSTNAME"], timeout_seconds=20) for s in made)
            )
            assert all(r.exit_code == 0 for r in results)
            owner_network = {o: sandbox.scope.owner_network(sandbox.egress_network, o) for o in owners}
            deadline = time.monotonic() + 30
            for session, owner in zip(made, owners, strict=True):
                while (on := networks_of(client, session.container_id)) != {owner_network[owner]}:
                    assert time.monotonic() < deadline, on  # it leaves the holding network after the claims
                    await asyncio.sleep(0.1)
            await filled(sandbox, 6)
            assert starts.most_during_claims <= 1
            assert starts.most_held <= 6
        finally:
            await asyncio.gather(*(s.destroy() for s in made), return_exceptions=True)
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_close_during_a_fill_leaves_nothing(client):
    async def main() -> None:
        sandbox = provider(pool_size=6)
        try:
            await sandbox.list()
            deadline = time.monotonic() + 60
            while sandbox._pool.starting_count() < 2:  # several starts under way
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        finally:
            await sandbox.close()
        assert sandbox._pool.starting_count() == 0 and sandbox._pool.ready_count() == 0
        assert pooled_ids(client) == set()

    asyncio.run(main())
    assert leftovers(client) == []


def test_networks_made_at_once_by_one_process_go_side_by_side_and_never_pick_the_same_subnet(client):
    """A burst of new owners does not wait for each owner's network in turn: they are made at once, and the
    subnets being picked are kept apart, so twelve made at once in a range of sixteen are never refused for an
    overlap (one engine create each) and get twelve subnets."""

    async def main() -> None:
        taken = [
            ipaddress.ip_network(c["Subnet"])
            for n in client.api.networks()
            for c in (n.get("IPAM") or {}).get("Config") or []
            if ":" not in str(c.get("Subnet", ":"))
        ]
        free = [
            r
            for r in (ipaddress.ip_network(f"10.219.{i}.0/24") for i in random.sample(range(256), 256))
            if not any(r.overlaps(t) for t in taken)
        ]
        sandbox = provider(network_pool=str(free[0]), network_prefix=28)
        names = [sandbox.scope.owner_network(sandbox.egress_network, f"side-{i}") for i in range(12)]
        creates: list[str] = []
        at_once = [0, 0]  # under way, most
        lock = threading.Lock()
        try:
            await sandbox._connect()
            api = sandbox.engine.api
            real = api.create_network

            def create_network(*args, **kwargs):
                with lock:
                    creates.append(args[0])
                    at_once[0] += 1
                    at_once[1] = max(at_once)
                try:
                    return real(*args, **kwargs)
                finally:
                    with lock:
                        at_once[0] -= 1

            api.create_network = create_network

            async def make(name: str) -> None:
                async with sandbox._networks.hold(name):
                    await sandbox._bridges.ensure(name, "internal")

            await asyncio.gather(*(make(name) for name in names))
            assert sorted(creates) == sorted(names)  # none refused for an overlap and tried again
            assert at_once[1] > 1
            subnets = {client.api.inspect_network(n)["IPAM"]["Config"][0]["Subnet"] for n in names}
            assert len(subnets) == 12
        finally:
            for name in names:
                await sandbox._bridges.drop_if_idle(name)
            await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


def test_a_pool_larger_than_its_holding_network_keeps_what_it_holds_and_says_so(caplog):
    # the holding network is 2 bits wider than an owner network: /24 at the default /26, 253 addresses for
    # containers; a larger pool could never fill (its starts past that fail on the full network)
    caplog.set_level(logging.WARNING)
    assert DockerSandbox(pool_size=253)._pool.size == 253
    assert "holding network" not in caplog.text
    assert DockerSandbox(pool_size=300)._pool.size == 253
    assert (
        "DockerSandbox.pool_size=300 is more than the warm pool's holding network holds (253" in caplog.text
    )
    assert DockerSandbox(pool_size=300, network_prefix=27)._pool.size == 125
