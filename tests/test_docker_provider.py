"""The docker provider against a real engine (see docker_support for skip/fail rules)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import pytest
from docker_support import RUN_LABEL, TEST_IMAGE, docker_client, host_listener, leftovers

from jupyter_tai_sandbox.conformance import run_sandbox_conformance
from jupyter_tai_sandbox.contract import (
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionSpec,
)
from jupyter_tai_sandbox.providers.docker import LABEL_SESSION, LABEL_SPEC, DockerSandbox


@pytest.fixture(scope="module")
def client():
    client = docker_client()
    yield client
    client.close()


def provider(**traits) -> DockerSandbox:
    return DockerSandbox(image=TEST_IMAGE, extra_labels=RUN_LABEL, **traits)


def spec(**changes) -> SessionSpec:
    return SessionSpec(image=TEST_IMAGE, consumer="docker-tests", **changes)


def container_attrs(client, session_id: str) -> dict:
    (container,) = client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"})
    return container.attrs


def test_docker_provider_passes_the_conformance_suite(client):
    sandbox = provider()
    assert asyncio.run(run_sandbox_conformance(sandbox)) == []
    assert asyncio.run(sandbox.list()) == []


def test_network_egress_internal_and_none(client):
    """Each session tries to reach a port on this machine through the default bridge's gateway."""

    async def probe(sandbox: DockerSandbox, network: str, port: int, gateway: str) -> tuple[bytes, bytes]:
        session = await sandbox.create(spec(network=network))
        try:
            reach = await session.exec(
                ["sh", "-c", f"nc -w 3 {gateway} {port} </dev/null 2>&1; echo rc=$?"], timeout_seconds=20
            )
            routes = await session.exec(["sh", "-c", "ip route; ls /sys/class/net"], timeout_seconds=10)
            return reach.stdout, routes.stdout
        finally:
            await session.destroy()

    async def main() -> None:
        sandbox = provider()
        with host_listener() as port:
            session = await sandbox.create(spec())
            route = (await session.exec(["ip", "route"], timeout_seconds=10)).stdout.decode()
            await session.destroy()
            gateway = route.split("default via ", 1)[1].split()[0]
            reach, _ = await probe(sandbox, "egress", port, gateway)
            assert b"pong" in reach, reach
            reach, routes = await probe(sandbox, "internal", port, gateway)
            assert b"pong" not in reach and b"rc=0" not in reach, reach
            # nor through the internal bridge's own gateway address
            own_gateway = routes.split(b"default via ", 1)[1].split()[0].decode()
            reach, _ = await probe(sandbox, "internal", port, own_gateway)
            assert b"pong" not in reach and b"rc=0" not in reach, reach
            reach, routes = await probe(sandbox, "none", port, gateway)
            assert b"pong" not in reach and b"rc=0" not in reach, reach
            assert routes.split() == [b"lo"], routes

    asyncio.run(main())
    assert [n.name for n in client.networks.list(names=["tai-sbx-internal"])] == []


def test_caps_hardening_and_labels(client):
    async def main() -> None:
        sandbox = provider(pids_limit=256)
        session = await sandbox.create(spec(cpu=0.5, memory_mb=64, env={"SECRET_TOKEN": "do-not-label-me"}))
        try:
            attrs = container_attrs(client, session.id)
            host = attrs["HostConfig"]
            assert host["NanoCpus"] == 500_000_000
            assert host["Memory"] == 64 << 20
            assert host["CapDrop"] == ["ALL"]
            assert "no-new-privileges" in host["SecurityOpt"]
            assert host["PidsLimit"] == 256
            assert host["Privileged"] is False
            assert host["Init"] is True
            labels = attrs["Config"]["Labels"]
            assert "do-not-label-me" not in json.dumps(labels)
            assert json.loads(labels[LABEL_SPEC])["env"] == ["SECRET_TOKEN"]
            assert "SECRET_TOKEN=do-not-label-me" in attrs["Config"]["Env"]
            result = await session.exec(["sh", "-c", 'printf %s "$SECRET_TOKEN"'], timeout_seconds=10)
            assert result.stdout == b"do-not-label-me"
            # a restarted server (a new instance) sees the same session, env included
            again = await provider().get(session.id)
            assert (await again.info()).spec == session.spec  # type: ignore[attr-defined]
        finally:
            await session.destroy()

    asyncio.run(main())


def test_persistent_workspace_survives_destroy_and_a_new_instance(client):
    key = f"test-{secrets.token_hex(4)}"
    volume = f"tai-sbx-{key}"

    async def main() -> None:
        first = await provider().create(spec(durability="persistent", workspace_key=key))
        await first.put_file("notes/kept.txt", b"still here")
        await first.destroy()
        assert client.volumes.get(volume).name == volume
        second = await provider().create(spec(durability="persistent", workspace_key=key))
        assert await second.get_file("notes/kept.txt") == b"still here"
        await second.destroy(remove_workspace=True)
        assert [v.name for v in client.volumes.list() if v.name == volume] == []

    asyncio.run(main())


def test_orphans_are_reaped_by_label_and_foreign_containers_untouched(client):
    foreign = client.containers.run(TEST_IMAGE, ["sleep", "300"], detach=True, labels={"someone.else": "1"})
    try:

        async def main() -> None:
            earlier = provider()  # a server process that went away
            orphan = await earlier.create(spec(ttl_seconds=1))
            keeper = await earlier.create(spec(ttl_seconds=600))
            await asyncio.sleep(1.5)
            later = provider()
            assert {orphan.id, keeper.id} <= {i.id for i in await later.list()}
            assert await later.reap() == [orphan.id]
            with pytest.raises(SandboxNotFoundError):
                await later.get(orphan.id)
            assert {i.id for i in await later.list()} >= {keeper.id}
            await (await later.get(keeper.id)).destroy()
            with pytest.raises(SandboxNotFoundError):
                await later.get(foreign.id)

        asyncio.run(main())
        foreign.reload()
        assert foreign.status == "running"
    finally:
        foreign.remove(force=True)


def test_missing_image_is_a_typed_rejection(client):
    missing = f"tai-sbx-test/no-such-image:{secrets.token_hex(4)}"
    with pytest.raises(SandboxSpecRejectedError) as caught:
        asyncio.run(provider().create(SessionSpec(image=missing)))
    assert missing in str(caught.value) and "build-image" in str(caught.value)


def test_vm_isolation_is_rejected(client):
    with pytest.raises(SandboxSpecRejectedError):
        asyncio.run(provider().create(spec(isolation="vm")))


def test_unreachable_engine_is_a_typed_unavailability(tmp_path):
    url = f"unix://{tmp_path}/no-engine.sock"
    sandbox = DockerSandbox(base_url=url)
    for action in (sandbox.create(SessionSpec()), sandbox.list(), sandbox.reap(), sandbox.get("sbx-0123456789abcdef")):
        started = time.monotonic()
        with pytest.raises(SandboxUnavailableError) as caught:
            asyncio.run(action)
        assert url in str(caught.value)
        assert time.monotonic() - started < 30


def test_nothing_is_left_behind(client):
    """Runs last in this module: no container, volume or network of ours remains."""
    assert leftovers(client) == []
