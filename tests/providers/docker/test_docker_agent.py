"""The docker provider on the session agent: an image that holds nothing but one static program still
serves sessions (files, and commands of that program), on a read-only root filesystem; and its file
transfers keep the provider's idle limit (transfer_idle_seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from jupyter_tai_sandbox.agent import agent_binary
from jupyter_tai_sandbox.contract import SandboxError, SandboxNotFoundError, SessionSpec
from jupyter_tai_sandbox.providers.container import TransferIdleError
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from tests.support.docker import RUN_ID, RUN_LABEL, TEST_IMAGE, leftovers, provider

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

LABEL_KEY, LABEL_VALUE = next(iter(RUN_LABEL.items()))


@pytest.fixture(scope="module")
def bare_image(client):
    """An image holding one static program (the agent binary itself, as /prog) and nothing else."""
    buf = io.BytesIO()
    data = agent_binary().read_bytes()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("prog")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    tag = f"tai-sbx-test/bare:{RUN_ID}".lower()
    subprocess.run(
        ["docker", "import", "--change", f"LABEL {LABEL_KEY}={LABEL_VALUE}", "-", tag],
        input=buf.getvalue(),
        check=True,
        capture_output=True,
    )
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_an_image_without_a_shell_or_tmp_serves_a_session(client, bare_image):
    async def main() -> None:
        sandbox = DockerSandbox(image=bare_image, extra_labels=RUN_LABEL)
        session = await sandbox.create(SessionSpec(image=bare_image, consumer="docker-tests", network="none"))
        try:
            await session.put_file("dir/hello.txt", b"hello")
            assert await session.get_file("dir/hello.txt") == b"hello"
            assert [e["name"] for e in await session.list_files("dir")] == ["hello.txt"]
            result = await session.exec(["/prog", "version"], timeout_seconds=30)
            assert (result.exit_code, result.stdout) == (0, b"tai-agent protocol 1\n")
            with pytest.raises(SandboxError, match="no such program"):
                await session.exec(["sh", "-c", "true"], timeout_seconds=30)
            assert session.resolve("dir/hello.txt") == "/workspace/dir/hello.txt"
            again = await sandbox.get(session.id)
            assert await again.get_file("dir/hello.txt") == b"hello"
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def agent_session(**traits):
    """A session on the agent of a provider with ``traits``, destroyed with its provider after."""
    sandbox = provider(**traits)
    session = await sandbox.create(SessionSpec(consumer="docker-tests", network="none"))
    try:
        yield session
    finally:
        await session.destroy()
        await sandbox.close()


def test_a_stalled_upload_is_aborted_after_the_idle_limit_and_writes_nothing(client):
    async def main() -> None:
        gate = asyncio.Event()

        async def stalls():
            yield b"first part "
            await gate.wait()  # never set: the client went quiet
            yield b"never sent"

        async with agent_session(transfer_idle_seconds=2) as session:
            await session.put_file("kept.txt", b"before")
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TransferIdleError, match="transfer_idle_seconds"):
                await asyncio.wait_for(session.put_file("kept.txt", stalls()), 30)
            assert 2 <= loop.time() - started < 10
            # atomic: the target keeps its old content and no temporary file is left beside it
            assert await session.get_file("kept.txt") == b"before"
            assert [e["name"] for e in await session.list_files(".")] == ["kept.txt"]

            # a source that keeps sending, however slowly, is not idle
            async def trickles():
                for piece in (b"a", b"b", b"c"):
                    await asyncio.sleep(1)
                    yield piece

            await session.put_file("slow.txt", trickles())
            assert await session.get_file("slow.txt") == b"abc"

    asyncio.run(main())


def test_a_stalled_download_is_aborted_after_the_idle_limit(client):
    async def main() -> None:
        async with agent_session(transfer_idle_seconds=2) as session:
            await session.put_file("big.bin", bytes(1 << 20))
            chunks = session.iter_file("big.bin", 1 << 16)
            assert len(await anext(chunks)) == 1 << 16
            await asyncio.sleep(3)
            with pytest.raises(TransferIdleError, match="transfer_idle_seconds"):
                await anext(chunks)
            # a reader that keeps asking gets the whole file, and the session serves it again
            assert len(await session.get_file("big.bin")) == 1 << 20

    asyncio.run(main())


REPLACE_THE_AGENT = r"""
for try in 'echo forged > /.tai/agent' 'rm -f /.tai/agent' 'mv /.tai/agent /.tai/elsewhere' \
           'ln -sf /bin/sh /.tai/agent' 'touch /.tai/other' 'mv /.tai /elsewhere' 'rm -rf /.tai' \
           'chmod 777 /.tai/agent' 'mount -t tmpfs none /.tai' 'umount /.tai' 'umount -l /.tai'; do
  if sh -c "$try" 2>/dev/null; then echo "ALLOWED: $try"; fi
done
sha256sum /.tai/agent
"""
#: ends the connect relays (the agent's comm, not PID 1) once this command has exited: session code may
KILL_THE_RELAYS = r"""(sleep 0.5; for pid in /proc/[0-9]*; do
  [ "${pid#/proc/}" != 1 ] && [ "$(cat $pid/comm 2>/dev/null)" = agent ] && kill -9 "${pid#/proc/}"
done) >/dev/null 2>&1 &"""


def test_root_session_code_cannot_replace_the_agent_the_server_connects_through(client):
    """The agent binary is on a read-only mount: writing, removing, renaming or mounting over it fails for a
    root command, so the connection the server opens after session code killed the relay is the real agent."""
    import hashlib

    async def main() -> None:
        async with agent_session(
            agent_transport="exec"
        ) as session:  # through the relay session code may kill
            result = await session.exec(["sh", "-c", REPLACE_THE_AGENT], timeout_seconds=60)
            assert "ALLOWED" not in result.stdout.decode(), result.stdout.decode()
            expected = hashlib.sha256(agent_binary().read_bytes()).hexdigest()
            assert result.stdout.decode().split()[0] == expected
            assert (await session.exec(["sh", "-c", KILL_THE_RELAYS], timeout_seconds=30)).exit_code == 0
            await asyncio.sleep(1.5)
            again = await session.exec(
                ["id", "-u"], timeout_seconds=30
            )  # a new connection, to the real agent
            assert (again.exit_code, again.stdout) == (0, b"0\n")

    asyncio.run(main())


def test_a_root_server_on_the_engines_host_reaches_the_agent_with_no_engine_exec(client):
    """agent_transport 'auto' (the default): the server, root on the engine's host, connects to the agent's
    socket from the container's network namespace, so the container runs no exec at all; 'exec' takes the
    relay, one exec per connection. Both serve the same commands."""

    async def main() -> None:
        for transport, execs in (("auto", 0), ("exec", 1)):
            async with agent_session(agent_transport=transport) as session:
                result = await session.exec(["sh", "-c", "echo $((6 * 7))"], timeout_seconds=30)
                assert (result.exit_code, result.stdout) == (0, b"42\n")
                await session.put_file("x.txt", b"x")
                attrs = client.api.inspect_container(session.container_id)
                assert len(attrs["ExecIDs"] or []) == execs, (transport, attrs["ExecIDs"])

    asyncio.run(main())


def counted(call, calls: list[str]):
    """``call`` (an engine coroutine method taking a container id), each id it is given added to ``calls``."""

    async def counting(container_id: str, **kw):
        calls.append(container_id)
        return await call(container_id, **kw)

    return counting


def test_a_new_sessions_first_command_has_its_environment_from_one_inspect(client):
    """A new session's first command runs with the container's environment (the image's and the create's);
    on the direct connection, the one inspect that finds the agent also gives that environment, so the
    create and the first command ask the engine for the container once, as the relay does."""

    async def main() -> None:
        for transport in ("auto", "exec"):
            sandbox = provider(agent_transport=transport)
            engine = sandbox._engine
            inspected: list[str] = []
            engine.inspect_container = counted(engine.inspect_container, inspected)
            try:
                session = await sandbox.create(
                    SessionSpec(consumer="docker-tests", network="none", env={"GREETING": "hello"})
                )
                try:
                    result = await session.exec(["sh", "-c", 'echo "$GREETING $HOME"'], timeout_seconds=30)
                    assert (result.exit_code, result.stdout) == (0, b"hello /workspace\n")
                    assert inspected == [session.container_id], (transport, inspected)
                finally:
                    await session.destroy()
            finally:
                await sandbox.close()

    asyncio.run(main())


def test_a_direct_connection_believes_only_the_containers_agent(client):
    """The server's direct connection checks what it enters: a pid whose cgroup is not the session's
    container is never entered (a pid reused by another container's process), and a listener that is not
    the container's PID 1 is refused (session code cannot pose as the agent)."""
    from jupyter_tai_sandbox.agent.netns import NotReachableHere
    from jupyter_tai_sandbox.agent.transport import open_in_netns

    async def main() -> None:
        async with agent_session() as ours, agent_session() as theirs:
            handle = await ours.exec_start(["sleep", "300"], timeout_seconds=60)
            try:
                top = client.api.top(ours.container_id, ps_args="-eo pid,args")
                sleeper = next(int(pid) for pid, args in top["Processes"] if args == "sleep 300")
                with pytest.raises(ConnectionRefusedError, match="not the agent"):
                    await open_in_netns(sleeper, ours.container_id)
                their_agent = client.api.inspect_container(theirs.container_id)["State"]["Pid"]
                with pytest.raises(NotReachableHere, match="not the session's"):
                    await open_in_netns(their_agent, ours.container_id)
                ours_agent = client.api.inspect_container(ours.container_id)["State"]["Pid"]
                direct = await open_in_netns(ours_agent, ours.container_id)
                assert (await (await direct.start(["true"])).wait()).code == 0
                await direct.close()
            finally:
                await handle.kill()

    asyncio.run(main())


def test_a_container_sent_to_the_relay_is_tried_directly_again_after_the_retry_time(client):
    """A direct connection refused for one container (another host's: NotReachableHere) sends that container
    alone through the exec relay, and only for RELAY_RETRY_SECONDS: the fallback is never permanent."""
    import time

    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(SessionSpec(consumer="docker-tests", network="none"))
        try:
            engine = sandbox._engine
            cid = session.container_id

            def exec_ids() -> set[str]:
                return set(client.api.inspect_container(cid)["ExecIDs"] or [])

            async def relays_of_one_connection() -> int:
                """The relays (execs of ``connect``) this connection made: new ones only, since a relay of an
                earlier connection may still be ending when the next one opens."""
                before = exec_ids()
                agent = await engine.open_agent(cid)
                try:
                    assert (await (await agent.start(["true"])).wait()).code == 0
                    made = [client.api.exec_inspect(e) for e in exec_ids() - before]
                    return sum(e["ProcessConfig"]["arguments"] == ["connect"] for e in made)
                finally:
                    await agent.close()

            assert await relays_of_one_connection() == 0  # direct
            engine.relay_until[cid] = time.monotonic() + 3600  # as a NotReachableHere leaves it
            assert await relays_of_one_connection() == 1  # through an exec of the relay
            engine.relay_until[cid] = time.monotonic() - 1  # its retry time has come
            assert await relays_of_one_connection() == 0
            assert cid not in engine.relay_until  # direct again, and forgotten
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_the_agent_volume_is_shared_by_deployments_and_old_builds_go_once_unused(client):
    from jupyter_tai_sandbox.providers._docker_agent import AGENT_VOLUME_PREFIX, LABEL_AGENT_BUILD

    old = f"{AGENT_VOLUME_PREFIX}test-{RUN_ID}".lower()

    async def main() -> None:
        first = provider(deployment=f"{RUN_ID}-agent-a")
        second = provider(deployment=f"{RUN_ID}-agent-b")
        try:
            await second.check_available()  # its engine is connected by the status check, not by a create
            sessions = [
                await sandbox.create(SessionSpec(consumer="docker-tests", network="none"))
                for sandbox in (first, second)
            ]
            mounts = [
                {m["Destination"]: m for m in client.api.inspect_container(s.container_id)["Mounts"]}["/.tai"]
                for s in sessions
            ]
            assert mounts[0]["Name"] == mounts[1]["Name"] and not mounts[0]["RW"]
            assert mounts[0]["Name"].startswith(f"{AGENT_VOLUME_PREFIX}{client.info()['Architecture']}-")
            labels = client.api.inspect_volume(mounts[0]["Name"])["Labels"]
            assert set(labels) == {
                LABEL_AGENT_BUILD
            }  # no deployment's: every deployment's leftover check passes
            client.api.create_volume(old, labels={LABEL_AGENT_BUILD: "000000000000"})
            for session in sessions:
                await session.destroy()
            await first.reap()
            names = {
                v["Name"] for v in client.api.volumes(filters={"label": LABEL_AGENT_BUILD})["Volumes"] or []
            }
            assert old not in names and mounts[0]["Name"] in names
        finally:
            with contextlib.suppress(Exception):
                client.api.remove_volume(old)
            await first.close()
            await second.close()

    asyncio.run(main())


def test_servers_filling_the_agent_volume_at_once_fill_it_once_and_whole(client):
    from jupyter_tai_sandbox.providers.docker_engine import DockerEngine

    name = f"tai-agent-test-fill-{RUN_ID}".lower()
    data = bytes(range(256)) * 4096
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("agent")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))

    async def main() -> None:
        engines = [
            DockerEngine("unix:///var/run/docker.sock", timeout=30, slow_timeout=60, scope={})
            for _ in range(3)
        ]
        try:
            await asyncio.gather(
                *(e.fill_shared_volume(name, TEST_IMAGE, buf.getvalue(), labels=RUN_LABEL) for e in engines)
            )
            # a fill lock a crash left behind (older than stale_seconds) is taken over and the fill redone
            client.containers.create(TEST_IMAGE, name=f"{name}-fill", entrypoint=["/none"], labels=RUN_LABEL)
            await engines[0].fill_shared_volume(
                name, TEST_IMAGE, buf.getvalue(), labels=RUN_LABEL, stale_seconds=0
            )
        finally:
            for e in engines:
                await e.close()
        out = client.containers.run(
            TEST_IMAGE,
            ["sha256sum", "/v/agent"],
            remove=True,
            labels=RUN_LABEL,
            volumes={name: {"bind": "/v", "mode": "ro"}},
        )
        assert out.split()[0].decode() == __import__("hashlib").sha256(data).hexdigest()
        assert client.containers.list(all=True, filters={"name": f"{name}-fill"}) == []

    try:
        asyncio.run(main())
    finally:
        with contextlib.suppress(Exception):
            client.containers.get(f"{name}-fill").remove(force=True)
        with contextlib.suppress(Exception):
            client.api.remove_volume(name)


@pytest.mark.parametrize("transport", ["auto", "exec"])
def test_every_session_object_of_a_container_shares_one_agent_connection(client, transport):
    """A server gets a session object per request: they share the container's one connection (one relay in
    the session, or one socket straight to the agent), rather than one each that would live as long as the
    container."""
    relays = r"""n=0; for d in /proc/[0-9]*; do
      [ "${d#/proc/}" != 1 ] && [ "$(cat $d/comm 2>/dev/null)" = agent ] && [ "$(cut -d' ' -f4 $d/stat)" = 0 ] && n=$((n+1))
    done; echo $n"""

    async def main() -> None:
        sandbox = provider(agent_transport=transport)
        session = await sandbox.create(SessionSpec(consumer="docker-tests", network="none"))
        try:
            for _ in range(5):
                again = await sandbox.get(session.id)
                assert (await again.exec(["true"], timeout_seconds=30)).exit_code == 0
            count = await session.exec(["sh", "-c", relays], timeout_seconds=30)
            assert count.stdout == (b"1\n" if transport == "exec" else b"0\n")
            agent = client.api.inspect_container(session.container_id)["State"]["Pid"]
            fds = Path(f"/proc/{agent}/fd")
            sockets = [fd for fd in fds.iterdir() if os.readlink(fd).startswith("socket:")]
            assert len(sockets) == 2, sockets  # the agent's listener and the one connection
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["auto", "exec"])
def test_a_session_is_found_again_with_no_engine_call_while_its_agent_answers(client, transport):
    """A request's look-up of a session this server found before needs no engine call while the session's agent
    connection is open (the agent is the container's PID 1). What another server of the deployment does shows:
    info() gives the end it moved, and once it destroys the session the next look-up here is a 404."""

    async def main() -> None:
        here = provider(agent_transport=transport)
        there = provider(agent_transport=transport)
        session = await here.create(SessionSpec(consumer="docker-tests", network="none", ttl_seconds=600))
        try:
            assert (await session.exec(["true"], timeout_seconds=30)).exit_code == 0
            calls = here._engine.calls
            for _ in range(3):
                again = await here.get(session.id)
                assert (await again.exec(["echo", "x"], timeout_seconds=30)).stdout == b"x\n"
            assert here._engine.calls == calls, "a look-up or a command asked the engine"

            moved = (await there.get(session.id)).expires_at + 900
            await (await there.get(session.id)).set_expiry(moved)
            assert (await (await here.get(session.id)).info()).expires_at == moved

            await (await there.get(session.id)).destroy()

            async def gone() -> None:
                while True:
                    try:
                        await here.get(session.id)
                    except SandboxNotFoundError:
                        return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(gone(), 10)
        finally:
            with contextlib.suppress(SandboxError):
                await session.destroy()
            await here.close()
            await there.close()

    asyncio.run(main())


def test_an_upload_ends_promptly_when_another_server_destroys_its_session(client):
    """The engine keeps an exec's stream open after its process died while input keeps coming, so a write
    that waits asks whether the container still runs (AgentClient.still_there): the upload fails, no hang."""

    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(SessionSpec(consumer="docker-tests", network="none"))
        elsewhere = await provider().get(session.id)

        async def endless():
            while True:
                yield b"x" * (1 << 20)
                await asyncio.sleep(0.01)

        upload = asyncio.create_task(session.put_file("big.bin", endless()))
        try:
            await asyncio.sleep(1)
            await elsewhere.destroy()
            with pytest.raises(SandboxError):
                await asyncio.wait_for(upload, 10)
        finally:
            upload.cancel()
            await sandbox.close()

    asyncio.run(main())


def test_a_session_user_runs_commands_and_file_operations_with_that_users_rights():
    """user='1000:1000': the agent stays root, commands run as the user, and file operations too (what they
    make is the user's; a file the user locked is locked to the API as well, where root would read it)."""

    async def main() -> None:
        async with agent_session(user="1000:1000") as session:
            result = await session.exec(["sh", "-c", "id -u; id -g; stat -c %u /proc/1"], timeout_seconds=30)
            assert result.stdout.split() == [b"1000", b"1000", b"0"], result.stdout
            await session.put_file("made/by/api.txt", b"hi")
            owners = await session.exec(
                ["stat", "-c", "%u:%g", "made", "made/by/api.txt"], timeout_seconds=30
            )
            assert owners.stdout.split() == [b"1000:1000", b"1000:1000"]
            locked = await session.exec(
                ["sh", "-c", "echo x > locked && chmod 000 locked && mkdir shut && chmod 500 shut"],
                timeout_seconds=30,
            )
            assert locked.exit_code == 0
            with pytest.raises(SandboxError, match=r"(?i)permission"):
                await session.get_file("locked")
            with pytest.raises(SandboxError, match=r"(?i)permission"):
                await session.put_file("shut/new.txt", b"no")
            await session.remove_path("made")
            assert [e["name"] for e in await session.list_files(".")] == ["locked", "shut"]

    asyncio.run(main())


def test_a_session_user_named_is_read_from_the_image_and_one_it_lacks_fails_the_create(client):
    async def main() -> None:
        async with agent_session(user="nobody") as session:
            result = await session.exec(["id", "-u"], timeout_seconds=30)
            assert result.stdout == b"65534\n"
        sandbox = provider(user="nosuchuser")
        try:
            with pytest.raises(SandboxError, match="no user 'nosuchuser'"):
                await sandbox.create(SessionSpec(consumer="docker-tests", network="none"))
            assert [s for s in await sandbox.list()] == []
        finally:
            await sandbox.close()

    asyncio.run(main())


def test_the_images_user_is_the_session_user_when_none_is_configured(client):
    dockerfile = f"FROM {TEST_IMAGE}\nUSER 4321:4322\nLABEL {LABEL_KEY}={LABEL_VALUE}\n".encode()
    tag = f"tai-sbx-test/user:{RUN_ID}".lower()
    client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    try:

        async def main() -> None:
            sandbox = DockerSandbox(image=tag, extra_labels=RUN_LABEL)
            session = await sandbox.create(SessionSpec(image=tag, consumer="docker-tests", network="none"))
            try:
                result = await session.exec(["sh", "-c", "id -u; id -g"], timeout_seconds=30)
                assert result.stdout.split() == [b"4321", b"4322"]
                again = await sandbox.get(session.id)  # a session found again keeps its user
                assert (await again.exec(["id", "-u"], timeout_seconds=30)).stdout == b"4321\n"
            finally:
                await session.destroy()
                await sandbox.close()

        asyncio.run(main())
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_the_docker_engine_fills_the_container_engine_seam():
    from jupyter_tai_sandbox.providers.container import ContainerEngine
    from jupyter_tai_sandbox.providers.docker_engine import DockerEngine

    assert isinstance(
        DockerEngine("unix:///var/run/docker.sock", timeout=1, slow_timeout=1, scope={}), ContainerEngine
    )


def test_nothing_is_left_behind(client):
    assert leftovers(client) == []
