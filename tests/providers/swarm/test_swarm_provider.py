"""The swarm provider on a real three-node Docker Swarm (started and torn down by this module).

The conformance suite runs against it over TLS; then placement over several
nodes, networks across nodes, a persistent workspace pinned to its node, and
the loss of a worker's engine mid-session. Nothing is left behind: the
module's last test checks the swarm, its fixture's teardown checks the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time

import docker
import pytest

from jupyter_tai_sandbox.contract import (
    ExitItem,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionSpec,
)
from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support.aio import run
from tests.support.docker import RUN_LABEL
from tests.support.swarm import (
    leftovers_on_host,
    node_socket,
    running_swarm,
    script,
    swarm_sandbox,
    wait_for,
)

# with the other workers: under the sh wrappers (one engine exec per transfer) the loaded nodes' engines cut
# transfer streams, so the module ran alone; on the agent (one channel per session) two loaded runs of this
# module beside the docker, kernel and conformance tests on four workers passed whole
pytestmark = [pytest.mark.docker, pytest.mark.swarm, pytest.mark.slow(141)]

#: whether the host had a docker_gwbridge (of its default engine) before the swarm started
_HOST_BEFORE: dict[str, object] = {}


def _host_state() -> tuple[bool, list[str]]:
    gwbridge = subprocess.run(["ip", "link", "show", "docker_gwbridge"], capture_output=True).returncode == 0
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    return gwbridge, [line for line in rules.splitlines() if "10.213." in line or "tai-sw" in line]


@pytest.fixture(scope="module", autouse=True)
def swarm():
    before = _host_state()
    _HOST_BEFORE["gwbridge"] = before[0]
    with running_swarm():
        yield
    left = leftovers_on_host()
    assert left == [], f"the swarm left things behind on the host: {left}"
    after = _host_state()
    assert after == before, f"the host's networking changed: {before} -> {after}"


class TestSwarmConformance(SandboxConformance):
    """Every conformance check, sessions wherever the manager puts them, commands over TLS on their nodes,
    through the agent's relay (one engine exec per session connection): what a server off the nodes' hosts
    uses. The direct connection to the agent is the docker class's (the same code on any engine)."""

    def make_sandbox(self, tmp_path):
        return swarm_sandbox(agent_transport="exec")


def test_host_networking_untouched():
    """The swarm's docker_gwbridge, bridges and iptables rules live in the engines' namespaces only."""
    gwbridge, rules = _host_state()
    assert rules == []
    assert gwbridge == _HOST_BEFORE["gwbridge"]  # no docker_gwbridge appeared on the host
    client = docker.from_env(timeout=30)
    try:
        assert client.info()["Swarm"]["LocalNodeState"] == "inactive"  # the default engine is no swarm node
    finally:
        client.close()
    for n in (1, 2, 3):
        links = subprocess.run(
            ["ip", "-n", f"tai-swarm-{n}", "-br", "link"], capture_output=True, text=True, check=True
        ).stdout
        assert "docker_gwbridge" in links


def test_a_session_found_before_is_found_again_with_no_engine_call_while_its_agent_answers():
    """As on docker: a request's look-up of a session this server found or made needs neither the manager nor the
    node while its agent connection is open; info() gives the end another server moved (a change of the
    service's labels that leaves its task running), and once that server destroys the session the next
    look-up here is a 404."""

    async def main():
        here, there = swarm_sandbox(), swarm_sandbox()
        try:
            session = await here.create(SessionSpec(ttl_seconds=600))
            assert (await session.exec(["true"], timeout_seconds=30)).exit_code == 0
            engines = (here.manager, session.engine)
            calls = [engine.calls for engine in engines]
            for _ in range(3):
                again = await here.get(session.id)
                assert (await again.exec(["echo", "x"], timeout_seconds=30)).stdout == b"x\n"
            assert [engine.calls for engine in engines] == calls, "a look-up or a command asked an engine"

            await session.put_file("kept.txt", b"kept")
            moved = (await there.get(session.id)).expires_at + 900
            await (await there.get(session.id)).set_expiry(moved)
            assert (await (await here.get(session.id)).info()).expires_at == moved
            # a new end changes the service's labels only: its task (the container, its files) is not replaced
            await asyncio.sleep(2)
            assert len(await here.manager.tasks(session.service_id)) == 1
            assert await (await there.get(session.id)).get_file("kept.txt") == b"kept"

            await (await there.get(session.id)).destroy()
            give_up = time.monotonic() + 15
            while True:
                try:
                    await here.get(session.id)
                except SandboxNotFoundError:
                    break
                assert time.monotonic() < give_up, "the destroyed session is still found here"
                await asyncio.sleep(0.05)
        finally:
            for provider in (here, there):
                await provider.close()

    run(main())


def test_sessions_spread_over_nodes():
    async def main():
        sandbox = swarm_sandbox()
        sessions = []
        try:
            for _ in range(3):
                sessions.append(await sandbox.create(SessionSpec(ttl_seconds=300)))
            nodes = {s.placement.hostname for s in sessions}
            assert len(nodes) >= 2, f"every session went to {nodes}"
            for session in sessions:
                result = await session.exec(["sh", "-c", "echo $SANDBOX_WORKSPACE; pwd"], timeout_seconds=30)
                assert result.stdout == b"/workspace\n/workspace\n"
                # the container really is on that node's engine
                n = session.placement.hostname.rsplit("-", 1)[1]
                local = docker.DockerClient(base_url=node_socket(int(n)), timeout=30)
                try:
                    assert (
                        local.containers.get(session.container_id).labels["jupyter-tai-sandbox.session"]
                        == session.id
                    )
                finally:
                    local.close()
            return nodes
        finally:
            for session in sessions:
                await session.destroy()
            await sandbox.close()

    run(main())


def test_unix_engines_and_resources():
    """The same provider over unix sockets (engine label tai.engine.unix); limits and reservations reach the task."""

    async def main():
        sandbox = swarm_sandbox(
            base_url=node_socket(1), tls_cert="", engine_label="tai.engine.unix", reserve_fraction=0.5
        )
        try:
            session = await sandbox.create(SessionSpec(cpu=0.5, memory_mb=64))
            try:
                result = await session.exec(
                    ["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"], timeout_seconds=30
                )
                assert result.stdout.strip() == str(64 << 20).encode()
                manager = docker.DockerClient(base_url=node_socket(1), timeout=30)
                try:
                    resources = manager.services.get(session.service_id).attrs["Spec"]["TaskTemplate"][
                        "Resources"
                    ]
                finally:
                    manager.close()
                assert resources["Limits"]["NanoCPUs"] == 500_000_000
                assert resources["Limits"]["Pids"] == 1024
                assert resources["Reservations"]["MemoryBytes"] == 32 << 20
            finally:
                await session.destroy()
        finally:
            await sandbox.close()

    run(main())


def test_networks_across_nodes():
    """internal: one overlay per owner across nodes, no route out, other owners unreachable; none: loopback only."""

    async def main():
        on = {n: swarm_sandbox(constraints=[f"node.labels.tai.node=={n}"]) for n in (2, 3)}
        made = []
        try:
            server = await on[2].create(SessionSpec(network="internal", owner="alice"))
            client = await on[3].create(SessionSpec(network="internal", owner="alice"))
            stranger = await on[3].create(SessionSpec(network="internal", owner="mallory"))
            alone = await on[2].create(SessionSpec(network="none"))
            made += [server, client, stranger, alone]
            assert server.placement.hostname == "tai-swarm-2" and client.placement.hostname == "tai-swarm-3"
            address = (
                await server.exec(["sh", "-c", "ip -4 -o addr show eth0"], timeout_seconds=30)
            ).stdout.split()[3]
            ip = address.split(b"/")[0].decode()
            listener = await server.exec_start(
                ["sh", "-c", "echo hello-overlay | nc -l -p 8000"], timeout_seconds=60
            )
            try:
                got = b""
                for _ in range(40):
                    got = (
                        await client.exec(["sh", "-c", f"nc -w 2 {ip} 8000 </dev/null"], timeout_seconds=30)
                    ).stdout
                    if got:
                        break
                    await asyncio.sleep(0.25)
                assert got == b"hello-overlay\n"
                denied = await stranger.exec(
                    ["sh", "-c", f"nc -w 2 {ip} 8000 </dev/null"], timeout_seconds=30
                )
                assert denied.stdout == b""
            finally:
                await listener.kill()
            routes = await client.exec(["ip", "route"], timeout_seconds=30)
            assert b"default" not in routes.stdout
            links = await alone.exec(["sh", "-c", "ls /sys/class/net"], timeout_seconds=30)
            assert links.stdout.split() == [b"lo"]
        finally:
            for session in made:
                await session.destroy()
            for sandbox in on.values():
                await sandbox.close()
        # the owners' overlay networks went with their last sessions
        manager = docker.DockerClient(base_url=node_socket(1), timeout=30)
        try:
            assert [n.name for n in manager.networks.list() if n.name.startswith("tai-sbx-internal")] == []
        finally:
            manager.close()

    run(main())


def test_persistent_workspace_pinned_to_its_node():
    key = f"pin-{RUN_LABEL[next(iter(RUN_LABEL))]}"

    async def main():
        sandbox = swarm_sandbox()
        try:
            first = await sandbox.create(
                SessionSpec(durability="persistent", workspace_key=key, owner="alice")
            )
            home = first.node_id
            await first.put_file("kept.txt", b"on my node")
            await first.destroy()
            # a restarted server (a new provider) finds the workspace's node from the manager's record
            for _ in range(3):
                again_sandbox = swarm_sandbox()
                try:
                    again = await again_sandbox.create(
                        SessionSpec(durability="persistent", workspace_key=key, owner="alice")
                    )
                    assert again.node_id == home
                    assert await again.get_file("kept.txt") == b"on my node"
                    await again.destroy()
                finally:
                    await again_sandbox.close()
            # another owner's key of that name is her own new workspace (keys are a namespace per owner)
            mallory = await sandbox.create(
                SessionSpec(durability="persistent", workspace_key=key, owner="mallory")
            )
            with pytest.raises(SandboxNotFoundError):
                await mallory.get_file("kept.txt")
            await mallory.destroy(remove_workspace=True)
            last = await sandbox.create(
                SessionSpec(durability="persistent", workspace_key=key, owner="alice")
            )
            await last.destroy(remove_workspace=True)
            manager = docker.DockerClient(base_url=node_socket(1), timeout=30)
            try:
                assert [
                    c
                    for c in manager.configs.list()
                    if c.attrs["Spec"]["Labels"].get("jupyter-tai-sandbox.workspace") == key
                ] == []
            finally:
                manager.close()
        finally:
            await sandbox.close()

    run(main())


@pytest.mark.parametrize("transport", ["exec", "auto"])
def test_losing_a_workers_engine(transport):
    """Node 3's engine dies mid-command (its containers keep running). Through the relay ('exec') its sessions
    answer SandboxUnavailableError within a bound. Over the direct connection ('auto': a root server on the
    nodes' host, whose containers ran no engine exec) they need only their agents and go on until the engine
    comes back and stops their containers; then their calls fail typed. Either way node 2's session goes on,
    look-ups through the manager say the node is down, and once it is back the reaper removes what it lost."""
    bound = 15.0

    async def main():
        on2 = swarm_sandbox(constraints=["node.labels.tai.node==2"])
        on3 = swarm_sandbox(constraints=["node.labels.tai.node==3"], agent_transport=transport)
        sandbox = swarm_sandbox()
        try:
            safe = await on2.create(SessionSpec(ttl_seconds=600))
            doomed = await on3.create(SessionSpec(ttl_seconds=600))
            handle = await doomed.exec_start(["sh", "-c", "echo started; sleep 100"], timeout_seconds=120)
            first = await handle.output.__anext__()
            assert first.data == b"started\n"
            node3 = docker.DockerClient(base_url=node_socket(3), timeout=30)
            try:
                execs = node3.api.inspect_container(doomed.container_id)["ExecIDs"] or []
            finally:
                node3.close()
            assert len(execs) == (0 if transport == "auto" else 1), execs

            # the running command's output ends with a typed error, not a hang
            async def read_to_end() -> None:
                async for item in handle.output:
                    assert not isinstance(item, ExitItem)

            started = time.monotonic()
            script("kill-node", "3")
            if transport == "exec":
                with pytest.raises(SandboxError):
                    await asyncio.wait_for(read_to_end(), bound)
                with pytest.raises(SandboxUnavailableError):
                    await asyncio.wait_for(doomed.exec(["echo"], timeout_seconds=10), bound)
            else:  # the agent alone serves the session meanwhile
                still = await asyncio.wait_for(doomed.exec(["echo", "still"], timeout_seconds=10), bound)
                assert still.stdout == b"still\n"
            with pytest.raises((SandboxUnavailableError, SandboxNotFoundError)):
                await asyncio.wait_for(sandbox.get(doomed.id), bound)
            assert time.monotonic() - started < 3 * bound
            if transport == "exec":
                with contextlib.suppress(SandboxError):  # a kill never hangs on a lost engine
                    await asyncio.wait_for(handle.kill(), 10)
            # another node's session is unaffected
            assert (await safe.exec(["echo", "fine"], timeout_seconds=30)).stdout == b"fine\n"
            # once the manager sees the node down, get() says so without trying its engine
            manager = docker.DockerClient(base_url=node_socket(1), timeout=30)
            try:
                wait_for(
                    lambda: manager.nodes.get(doomed.node_id).attrs["Status"]["State"] == "down",
                    60,
                    "the manager marking node 3 down",
                )
            finally:
                manager.close()
            with pytest.raises(SandboxUnavailableError, match="down"):
                await asyncio.wait_for(sandbox.get(doomed.id), bound)
            assert doomed.id not in await sandbox.reap()  # a node that may return: not reaped yet
            script("start-node", "3")
            if (
                transport == "auto"
            ):  # the engine's restart stops what it ran before: the agent's calls end typed
                with pytest.raises(SandboxError):
                    await asyncio.wait_for(read_to_end(), 4 * bound)
                with pytest.raises(SandboxError):
                    await asyncio.wait_for(doomed.exec(["echo"], timeout_seconds=10), bound)
            # back: the reaper removes the lost service
            give_up = time.monotonic() + 90
            while doomed.id not in await sandbox.reap():
                assert time.monotonic() < give_up, "the reaper did not remove the lost session"
                await asyncio.sleep(1)
            with pytest.raises(SandboxNotFoundError):
                await sandbox.get(doomed.id)
            await safe.destroy()
            # node 3 takes sessions again
            back = await on3.create(SessionSpec())
            assert (await back.exec(["echo", "back"], timeout_seconds=30)).stdout == b"back\n"
            await back.destroy()
        finally:
            for provider in (on2, on3, sandbox):
                await provider.close()

    run(main())


def test_read_only_root_and_missing_image():
    """read_only_rootfs: / refuses writes, /tmp (a tmpfs) and the workspace take them; an image no node
    holds is a spec rejection that leaves no service behind."""

    async def main():
        sandbox = swarm_sandbox(read_only_rootfs=True)
        try:
            session = await sandbox.create(SessionSpec())
            try:
                result = await session.exec(
                    [
                        "sh",
                        "-c",
                        "touch /x 2>/dev/null && echo root; touch /tmp/x && echo tmp; touch w && echo ws",
                    ],
                    timeout_seconds=30,
                )
                assert result.stdout == b"tmp\nws\n"
            finally:
                await session.destroy()
            before = {i.id for i in await sandbox.list()}
            with pytest.raises(SandboxSpecRejectedError, match="not on the swarm node"):
                await sandbox.create(SessionSpec(image="tai-no-such-image:1"))
            assert {i.id for i in await sandbox.list()} == before
        finally:
            await sandbox.close()

    run(main())


def test_registered_as_swarm():
    from jupyter_tai_sandbox.providers.swarm import SwarmSandbox
    from jupyter_tai_sandbox.sandboxes import load_provider_class

    assert load_provider_class("swarm") is SwarmSandbox


def test_nothing_is_left_in_the_swarm():
    """Runs last: no service, container, volume, network or record of this run remains on any node."""
    ((key, value),) = RUN_LABEL.items()
    mine = {"label": f"{key}={value}"}
    found = []
    for n in (1, 2, 3):
        client = docker.DockerClient(base_url=node_socket(n), timeout=30)
        try:
            if n == 1:
                found += [f"service {s.name}" for s in client.services.list(filters=mine)]
                found += [f"config {c.name}" for c in client.configs.list(filters=mine)]
                found += [f"network {x.name}" for x in client.networks.list(filters=mine)]
            found += [f"node {n} container {c.name}" for c in client.containers.list(all=True, filters=mine)]
            found += [f"node {n} volume {v.name}" for v in client.volumes.list(filters=mine)]
        finally:
            client.close()
    if found:
        try:
            wait_for(lambda: _still_there(mine) == [], 30, "the nodes removing what is left")
        except AssertionError:
            raise AssertionError(f"left in the swarm after 30 s: {_still_there(mine)}") from None


def _still_there(mine) -> list[str]:
    found = []
    for n in (1, 2, 3):
        client = docker.DockerClient(base_url=node_socket(n), timeout=30)
        try:
            if n == 1:
                found += [s.name for s in client.services.list(filters=mine)]
                found += [c.name for c in client.configs.list(filters=mine)]
                found += [x.name for x in client.networks.list(filters=mine)]
            found += [c.name for c in client.containers.list(all=True, filters=mine)]
            found += [v.name for v in client.volumes.list(filters=mine)]
        finally:
            client.close()
    return found
