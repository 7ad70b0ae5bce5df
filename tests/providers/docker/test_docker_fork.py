"""Fork on the docker provider: files, not processes (see providers/docker/forks.py and README's docker page;
tests/support/docker.py for skip/fail rules)."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox.contract import (
    ExecRequest,
    SandboxUnsupportedError,
    SessionSpec,
)
from jupyter_tai_sandbox.providers.docker import LABEL_POOL, DockerSandbox
from jupyter_tai_sandbox.providers.docker.forks import FORK_REPOSITORY
from tests.support.docker import RUN_FILTER, RUN_LABEL, TEST_IMAGE, provider

pytestmark = [pytest.mark.docker, pytest.mark.slow(20), pytest.mark.usefixtures("nothing_left")]


async def ended(sandbox: DockerSandbox, *sessions) -> None:
    """Destroy the sessions that were made (forks before their sources), then close the provider."""
    for session in reversed(sessions):
        if session is not None:
            await session.destroy()
    await sandbox.close()


async def out(session, script: str) -> str:
    result = await session.exec(["sh", "-c", script], timeout_seconds=20)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


#: how many of the session's processes run a command line with 'fork-marker' (the pattern does not match itself)
LOOK_FOR_LOOP = "grep -l 'fork[-]marker' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"


def test_a_fork_keeps_the_workspace_not_the_processes_and_the_two_diverge(client):
    async def main():
        sandbox = provider()
        source = await sandbox.create(
            SessionSpec(image=TEST_IMAGE, consumer="docker-fork", ttl_seconds=900, env={"SECRET": "s3"})
        )
        forked = None
        try:
            await source.put_file("dir/data.bin", bytes(range(256)) * 4096)
            await out(source, "chmod 751 dir && ln -s dir/data.bin link && echo scratch > /tmp/scratch")
            loop = await source.start(
                ExecRequest(
                    argv=["sh", "-c", "while :; do sleep 0.05; done # fork-marker"], timeout_seconds=120
                )
            )
            assert int(await out(source, LOOK_FOR_LOOP)) >= 1

            forked = await source.fork()
            assert forked.id != source.id and source.forkable
            info = await forked.info()
            assert (info.spec.owner, info.spec.ttl_seconds, info.spec.env, info.paused) == (
                source.spec.owner,
                900,
                {"SECRET": "s3"},
                False,
            )
            assert info.expires_at > (await source.info()).expires_at  # its TTL counts from the fork
            # the workspace's files, modes and links are in the copy; /tmp and the running loop are not
            assert await forked.get_file("dir/data.bin") == bytes(range(256)) * 4096
            assert (await out(forked, "stat -c %a dir; readlink link; echo $SECRET")).split() == [
                "751",
                "dir/data.bin",
                "s3",
            ]
            assert (await forked.exec(["cat", "/tmp/scratch"], timeout_seconds=10)).exit_code != 0
            assert int(await out(forked, LOOK_FOR_LOOP)) == 0
            # the source was thawed: its loop and its commands go on
            assert int(await out(source, LOOK_FOR_LOOP)) >= 1 and any(
                h.running for h in await source.held_commands()
            )
            assert not client.containers.get(source.container_id).attrs["State"]["Paused"]

            await source.put_file("after.txt", b"source only")
            await forked.put_file("after.txt", b"fork only")
            assert await source.get_file("after.txt") == b"source only"
            assert await forked.get_file("after.txt") == b"fork only"
            assert sorted(i.id for i in await sandbox.list()) == sorted([source.id, forked.id])
            await loop.kill()
        finally:
            await ended(sandbox, source, forked)

    asyncio.run(main())


def test_a_writable_roots_changes_are_committed_and_each_forks_image_goes_when_nothing_uses_it(client):
    """With the disk ceiling and the read-only root off, a fork keeps what the source wrote outside its
    workspace: the engine commits it as an image of the deployment, removed with its last user (a fork of a
    fork stands on its source's image, which then waits for it)."""

    async def main():
        sandbox = provider(disk_limit_mb=0, read_only_rootfs=False)
        source = await sandbox.create(SessionSpec(image=TEST_IMAGE, consumer="docker-fork"))
        first = second = None

        def fork_images() -> list[str]:
            return sorted(
                t for i in client.images.list(FORK_REPOSITORY, filters={"label": RUN_FILTER}) for t in i.tags
            )

        try:
            await out(source, "echo installed > /opt-marker && echo kept > /tmp/kept")
            first = await source.fork()
            assert (await out(first, "cat /opt-marker /tmp/kept")).split() == ["installed", "kept"]
            await out(first, "echo second > /opt-marker")
            second = await first.fork()
            assert (await out(second, "cat /opt-marker")).strip() == "second"
            assert (await out(source, "cat /opt-marker")).strip() == "installed"
            assert fork_images() == sorted(f"{FORK_REPOSITORY}:{s.id}" for s in (first, second))
            # the fork's container inherits its image's labels: it is still a session, not a pooled container
            assert sorted(i.id for i in await sandbox.list()) == sorted(s.id for s in (source, first, second))

            await first.destroy()  # its image stays: the second fork's stands on it
            assert fork_images() == sorted(f"{FORK_REPOSITORY}:{s.id}" for s in (first, second))
            await second.destroy()
            assert fork_images() == []
        finally:
            await ended(sandbox, source, first, second)

    asyncio.run(main())


def test_a_paused_source_forks_and_stays_paused(client):
    async def main():
        sandbox = provider()
        source = await sandbox.create(SessionSpec(image=TEST_IMAGE, consumer="docker-fork"))
        forked = None
        try:
            await source.put_file("note", b"written before the pause")
            await source.pause()
            forked = await source.fork()
            assert (await source.info()).paused and not (await forked.info()).paused
            assert client.containers.get(source.container_id).attrs["State"]["Paused"]
            assert await forked.get_file("note") == b"written before the pause"
        finally:
            await ended(sandbox, source, forked)

    asyncio.run(main())


def test_two_forks_at_once_leave_the_source_running(client):
    async def main():
        sandbox = provider()
        source = await sandbox.create(SessionSpec(image=TEST_IMAGE, consumer="docker-fork"))
        forks = []
        try:
            await source.put_file("n", b"1")
            forks = list(await asyncio.gather(source.fork(), source.fork()))
            assert len({f.id for f in forks}) == 2
            assert [await f.get_file("n") for f in forks] == [b"1", b"1"]
            assert not client.containers.get(source.container_id).attrs["State"]["Paused"]
            assert (await source.exec(["true"], timeout_seconds=10)).exit_code == 0
        finally:
            await ended(sandbox, source, *forks)

    asyncio.run(main())


def test_a_persistent_session_cannot_fork(client):
    async def main():
        sandbox = provider()
        key = f"fork-{RUN_LABEL[next(iter(RUN_LABEL))]}"
        source = await sandbox.create(
            SessionSpec(image=TEST_IMAGE, consumer="docker-fork", durability="persistent", workspace_key=key)
        )
        try:
            with pytest.raises(SandboxUnsupportedError) as refused:
                await source.fork()
            assert refused.value.operation == "fork"
        finally:
            await source.destroy(remove_workspace=True)
            await sandbox.close()

    asyncio.run(main())


def test_a_fork_of_a_pooled_session_is_a_session_not_a_pooled_container(client):
    """A pooled container's labels pass to the image committed from it and so to its fork's container: the
    fork still lists as a session, and the pool (whose reap removes stale or orphaned pooled containers)
    does not count it as one of its own."""

    async def main():
        sandbox = provider(disk_limit_mb=0, read_only_rootfs=False, pool_size=1)
        source = forked = None
        try:
            await sandbox._connect()  # the pool fills
            for _ in range(100):
                if sandbox._pool.ready_count():
                    break
                await asyncio.sleep(0.1)
            assert sandbox._pool.ready_count() == 1
            source = await sandbox.create(SessionSpec(consumer="docker-fork", owner="fiona"))
            assert source.record is not None  # it runs in a pooled container
            await source.put_file("kept", b"yes")
            forked = await source.fork()
            assert client.containers.get(forked.container_id).labels.get(LABEL_POOL)  # inherited
            pooled = {c["Id"] for c in await sandbox._pool.containers()}
            assert source.container_id in pooled and forked.container_id not in pooled
            await sandbox.reap()
            assert sorted(i.id for i in await sandbox.list()) == sorted([source.id, forked.id])
            assert await forked.get_file("kept") == b"yes"
        finally:
            await ended(sandbox, source, forked)

    asyncio.run(main())


def test_calls_during_a_fork_wait_for_it_and_a_users_pause_meanwhile_is_kept(client):
    """A command asked for while a fork holds its source frozen waits for the thaw (and runs); a user's pause
    asked for meanwhile is not undone by the fork's thaw."""

    async def main():
        sandbox = provider()
        source = await sandbox.create(SessionSpec(image=TEST_IMAGE, consumer="docker-fork"))
        forks = []
        try:
            await out(source, "head -c 200000000 /dev/zero > big")  # a copy of a fraction of a second

            async def meanwhile(action):
                await asyncio.sleep(0.1)
                return await action()

            fork, ran = await asyncio.gather(
                source.fork(), meanwhile(lambda: source.exec(["true"], timeout_seconds=30))
            )
            forks.append(fork)
            assert ran.exit_code == 0 and not (await source.info()).paused

            fork, _ = await asyncio.gather(source.fork(), meanwhile(source.pause))
            forks.append(fork)
            assert (await source.info()).paused
            assert client.containers.get(source.container_id).attrs["State"]["Paused"]
            await source.resume()
            assert (await source.exec(["true"], timeout_seconds=10)).exit_code == 0
        finally:
            await ended(sandbox, source, *forks)

    asyncio.run(main())
