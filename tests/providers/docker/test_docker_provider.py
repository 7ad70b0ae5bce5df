"""The docker provider against a real engine (see tests/support/docker.py for skip/fail rules)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import socket
import time

import pytest

from jupyter_tai_sandbox.contract import (
    ExitItem,
    OutputChunk,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionSpec,
)
from jupyter_tai_sandbox.providers.docker import LABEL_POOL, LABEL_SESSION, LABEL_SPEC, DockerSandbox
from tests.support.docker import (
    RUN_FILTER,
    TEST_IMAGE,
    host_listener,
    leftovers,
    provider,
    spec,
    wait_stopped_in,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow(65)]


def container_attrs(client, session_id: str) -> dict:
    (container,) = client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"})
    return container.attrs


def test_network_egress_internal_and_none(client):
    """Each session tries to reach a port on this machine through its egress bridge's gateway: egress gets
    there only with the host firewall off (its route out works), never with it on (as root, see
    test_docker_networks), internal and none never."""

    async def probe(
        sandbox: DockerSandbox, network: str, port: int, gateway: str | None
    ) -> tuple[bytes, bytes]:
        session = await sandbox.create(spec(network=network))
        try:
            if gateway is None:  # its own bridge's (each owner network has a subnet of its own)
                route = (await session.exec(["ip", "route"], timeout_seconds=10)).stdout.decode()
                gateway = route.split("default via ", 1)[1].split()[0]
            reach = await session.exec(
                ["sh", "-c", f"nc -w 3 {gateway} {port} </dev/null 2>&1; echo rc=$?"], timeout_seconds=20
            )
            routes = await session.exec(["sh", "-c", "ip route; ls /sys/class/net"], timeout_seconds=10)
            return reach.stdout, routes.stdout
        finally:
            await session.destroy()

    async def main() -> None:
        sandbox = provider(idle_network_seconds=0)  # each probe's network goes with its session
        with host_listener() as port:
            session = await sandbox.create(spec())
            route = (await session.exec(["ip", "route"], timeout_seconds=10)).stdout.decode()
            await session.destroy()
            gateway = route.split("default via ", 1)[1].split()[0]
            reach, _ = await probe(
                provider(egress_firewall="off", idle_network_seconds=0), "egress", port, None
            )
            assert b"pong" in reach, reach
            if os.geteuid() == 0:
                reach, _ = await probe(sandbox, "egress", port, None)
                assert b"pong" not in reach and b"rc=0" not in reach, reach
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
    network = provider().scope.owner_network("tai-sbx-internal", None)
    assert [n.name for n in client.networks.list(names=[network])] == []


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
            # PID 1 reaps what commands leave: the session agent, from its read-only mount
            assert attrs["Config"]["Entrypoint"] == ["/.tai/agent", "serve"] and host["Init"] is False
            assert [m["RW"] for m in attrs["Mounts"] if m["Destination"] == "/.tai"] == [False]
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
    volume = provider().scope.workspace_volume(key)

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
    for action in (
        sandbox.create(SessionSpec()),
        sandbox.list(),
        sandbox.reap(),
        sandbox.get("sbx-0123456789abcdef"),
    ):
        started = time.monotonic()
        with pytest.raises(SandboxUnavailableError) as caught:
            asyncio.run(action)
        assert url in str(caught.value)
        assert time.monotonic() - started < 30


def test_every_deadline_stop_of_held_output_is_noted(client):
    """A deadline stop of a command whose output a process it started still holds is noted in the
    timeout error, every time, and comes promptly."""
    escape = 'setsid sh -c "echo \\$\\$ > $1; echo held; exec sleep 60" &'

    async def scenario():
        sandbox = provider()
        session = await sandbox.create(spec())
        try:
            for attempt in range(3):
                started = time.monotonic()
                with pytest.raises(SandboxExecTimeoutError) as raised:
                    await session.exec(["sh", "-c", escape, "sh", f"held{attempt}.pid"], timeout_seconds=1.5)
                took = time.monotonic() - started
                pid = int((await session.get_file(f"held{attempt}.pid")).decode())
                await session.exec(["kill", "-9", str(pid)], timeout_seconds=10)
                assert raised.value.note, f"attempt {attempt}: the stop of held output was not noted"
                assert raised.value.stdout_bytes == len(b"held\n")
                assert took < 1.5 + 3, f"attempt {attempt}: the timeout came {took:.1f}s after the start"
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(scenario())


def test_pty_kill_after_the_exit_keeps_the_status_and_a_missing_command_is_typed(client):
    """A missing program is the typed error naming argv, raised by the start."""

    async def scenario():
        sandbox = provider()
        session = await sandbox.create(spec())
        try:
            handle = await session.exec_start(["sh", "-c", "exit 3"], timeout_seconds=30, pty=True)
            items = [item async for item in handle.output]
            assert items[-1] == ExitItem(3)
            await handle.kill()
            await handle.kill()
            with pytest.raises(SandboxRequestError, match="no such program"):
                await session.exec_start(["no-such-command"], timeout_seconds=30, pty=True)
            # the deadline stops a pty command's whole session too
            handle = await session.exec_start(["sh", "-i"], timeout_seconds=2, pty=True)
            await handle.write(b"sleep 60 & echo job-$!\n")
            seen = b""
            while not (found := re.search(rb"job-(\d+)\r\n", seen)):
                seen += (await asyncio.wait_for(handle.output.__anext__(), 5)).data
            pid = int(found.group(1))
            with pytest.raises(SandboxExecTimeoutError):
                async for _ in handle.output:
                    pass
            assert await wait_stopped_in(session, pid)
            await handle.kill()
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


async def pool_ready(sandbox: DockerSandbox, count: int, seconds: float = 20.0) -> None:
    await sandbox.list()  # connects, which starts the pool
    deadline = time.monotonic() + seconds
    while sandbox._pool.ready_count() < count:
        assert time.monotonic() < deadline, f"the pool holds {sandbox._pool.ready_count()} of {count}"
        await asyncio.sleep(0.05)


def pooled_ids(client) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": [LABEL_POOL, RUN_FILTER]})}


def test_pool_hands_out_started_containers_refills_and_never_reuses_one(client):
    async def main() -> None:
        sandbox = provider(pool_size=2)
        try:
            await pool_ready(sandbox, 2)
            waiting = pooled_ids(client)
            assert len(waiting) == 2
            others = {i.id for i in await sandbox.list()}  # sessions of other runs on this engine
            started = time.time()
            session = await sandbox.create(spec(consumer="pool-user", ttl_seconds=120))
            assert session.container_id in waiting  # handed out: no container was started for it
            attrs = client.containers.get(session.container_id).attrs
            assert attrs["Name"] == f"/tai-{session.id}"
            assert attrs["State"]["Running"] and attrs["Created"] < time.strftime(
                "%Y-%m-%dT%H:%M:%S", time.gmtime(started + 1)
            )
            result = await session.exec(["sh", "-c", "echo ran > mark; cat mark"], timeout_seconds=10)
            assert result.stdout == b"ran\n"
            (info,) = [
                i for i in await sandbox.list() if i.id not in others
            ]  # a pooled container is no session
            assert (info.id, info.consumer, info.spec.ttl_seconds) == (session.id, "pool-user", 120)
            assert info.expires_at - info.created_at == 120
            await pool_ready(sandbox, 2)  # refilled in the background
            used = session.container_id
            await session.destroy()
            # sparse: one listing, no look at each container (another run may remove one meanwhile)
            assert used not in {c.id for c in client.containers.list(all=True, sparse=True)}
            seen = {used}
            for _ in range(3):
                again = await sandbox.create(spec())
                assert again.container_id not in seen  # never a container a session has run in
                assert await again.list_files() == []
                seen.add(again.container_id)
                await again.destroy()
            # other specs are not served from the pool
            capped = await sandbox.create(spec(memory_mb=64))
            assert capped.container_id not in pooled_ids(client) | seen
            await capped.destroy()
        finally:
            await sandbox.close()
        assert pooled_ids(client) == set()  # close() removes what waited in the pool

    asyncio.run(asyncio.wait_for(main(), 120))


def test_pooled_session_env_reaches_commands_and_survives_a_restart(client):
    async def main() -> None:
        sandbox = provider(pool_size=1)
        try:
            await pool_ready(sandbox, 1)
            session = await sandbox.create(spec(env={"SECRET_TOKEN": "pooled-secret"}, ttl_seconds=1.5))
            assert session.record is not None
            result = await session.exec(["sh", "-c", 'printf %s "$SECRET_TOKEN"'], timeout_seconds=10)
            assert result.stdout == b"pooled-secret"
            handle = await session.exec_start(
                ["sh", "-c", 'printf %s "$SECRET_TOKEN"'], timeout_seconds=10, pty=True
            )
            assert b"pooled-secret" in b"".join(
                [i.data async for i in handle.output if isinstance(i, OutputChunk)]
            )
            await handle.kill()
            attrs = client.containers.get(session.container_id).attrs
            assert "pooled-secret" not in json.dumps(attrs["Config"]["Labels"])
            # kept on the record volume (which the session cannot touch), never in the container's files
            volume = client.volumes.get(f"tai-rec-{session.id}")
            assert "pooled-secret" in json.dumps(volume.attrs["Labels"])
            await sandbox._pool.settle()
            found = await session.exec(
                ["sh", "-c", "find /tmp /workspace -type f -exec grep -l pooled-secret {} +; true"],
                timeout_seconds=10,
            )
            assert found.stdout == b""
            later = provider()  # a restarted server
            try:
                again = await later.get(session.id)
                assert (await again.info()).spec == session.spec
                result = await again.exec(["sh", "-c", 'printf %s "$SECRET_TOKEN"'], timeout_seconds=10)
                assert result.stdout == b"pooled-secret"
                assert session.id in {i.id for i in await later.list()}
                await asyncio.sleep(1.6)
                assert session.id in await later.reap()
                with pytest.raises(SandboxNotFoundError):
                    await later.get(session.id)
                with pytest.raises(SandboxNotFoundError):
                    await session.info()
            finally:
                await later.close()
            assert f"tai-rec-{session.id}" not in [v.name for v in client.volumes.list()]
        finally:
            await sandbox.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_unclaimed_pooled_containers_of_a_gone_server_are_reaped(client):
    async def main() -> None:
        gone = provider()
        dead = f"{socket.gethostname()}:{2**22 + 12345}:gone"  # beyond pid_max: no such process
        left = await gone._pool.create(dead)
        stale = await gone._pool.create(f"elsewhere:1:{secrets.token_hex(2)}")
        await gone.close()
        later = provider(pool_idle_seconds=3600)
        try:
            # each is named for the session it would serve: unclaimed, it is no session
            listed = {i.id for i in await later.list()}
            assert not listed & {left.session_id, stale.session_id}
            for ready in (left, stale):
                with pytest.raises(SandboxNotFoundError):
                    await later.get(ready.session_id)
            await later.reap()
            remaining = pooled_ids(client)
            assert left.container_id not in remaining  # its owner is gone
            assert stale.container_id in remaining  # another host's pool, not yet past its idle limit
        finally:
            await later.engine.remove_container(stale.container_id)
            await later.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_nothing_is_left_behind(client):
    """Runs last in this module: no container, volume or network of ours remains."""
    assert leftovers(client) == []
