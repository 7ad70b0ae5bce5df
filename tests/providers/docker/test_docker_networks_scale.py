"""200 owners with internal sessions on one engine (issue 29): every owner network gets a small subnet
from the operator's range, so none fails on the engine's default pools (about 30 networks of /16)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxError, SessionSpec
from tests.support.docker import TEST_IMAGE, leftovers, provider

pytestmark = [pytest.mark.docker, pytest.mark.slow(89)]

OWNERS = 200
CONCURRENCY = 6
#: a range of this test's own (other tests use the default one meanwhile)
POOL = "10.216.0.0/16"


def test_internal_sessions_of_200_owners_each_on_a_network_of_their_own_that_no_other_reaches(client):
    async def main() -> None:
        sandbox = provider(network_pool=POOL)
        gate = asyncio.Semaphore(CONCURRENCY)
        sessions: dict[str, object] = {}

        async def create(owner: str) -> None:
            async with gate:
                spec = SessionSpec(
                    image=TEST_IMAGE, consumer="scale", owner=owner, network="internal", ttl_seconds=900
                )
                sessions[owner] = await sandbox.create(spec)

        async def destroy(session) -> None:
            async with gate:
                with contextlib.suppress(SandboxError):
                    await session.destroy()

        started = time.monotonic()
        try:
            await asyncio.gather(*(create(f"owner-{i:03d}") for i in range(OWNERS)))
            made = time.monotonic() - started
            networks = {}
            for owner, session in sessions.items():
                ((name, settings),) = client.api.inspect_container(session.container_id)["NetworkSettings"][
                    "Networks"
                ].items()
                networks[owner] = (name, settings["IPAddress"])
            assert len({name for name, _ in networks.values()}) == OWNERS
            subnets = set()
            for _, address in networks.values():
                assert ipaddress.ip_address(address) in ipaddress.ip_network(POOL)
                subnets.add(ipaddress.ip_network(f"{address}/26", strict=False))
            assert len(subnets) == OWNERS  # no two owners share a subnet
            rng = random.Random(29)
            owners = sorted(sessions)
            for _ in range(8):
                target, peer = rng.sample(owners, 2)
                listener = await sessions[target].exec_start(
                    ["sh", "-c", "echo hello | nc -l -p 7070"], timeout_seconds=30
                )
                try:
                    await asyncio.sleep(0.3)
                    got = await sessions[peer].exec(
                        ["sh", "-c", f"nc -w 2 {networks[target][1]} 7070 </dev/null 2>&1; echo rc=$?"],
                        timeout_seconds=20,
                    )
                    assert b"hello" not in got.stdout and b"rc=0" not in got.stdout, (
                        target,
                        peer,
                        got.stdout,
                    )
                finally:
                    await listener.kill()
            print(f"\n{OWNERS} owners' internal sessions made in {made:.1f}s")
        finally:
            await asyncio.gather(*(destroy(s) for s in sessions.values()))
            await sandbox.close()
        assert time.monotonic() - started < 300

    asyncio.run(main())
    assert leftovers(client) == []
