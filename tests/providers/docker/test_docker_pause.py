"""Pause and resume on the docker provider: the engine's freezer, seen by this server and by another of the
deployment (see tests/support/docker.py for skip/fail rules)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from jupyter_tai_sandbox.contract import ExecRequest, OutputChunk, SandboxConflictError, SessionSpec
from tests.support.docker import TEST_IMAGE, provider

pytestmark = [pytest.mark.docker, pytest.mark.slow(15), pytest.mark.usefixtures("nothing_left")]


def test_a_paused_container_runs_nothing_until_resumed_and_another_server_sees_it_paused(client):
    async def main():
        ours, other = provider(), provider()
        session = await ours.create(SessionSpec(image=TEST_IMAGE, consumer="docker-pause"))
        try:
            handle = await session.start(
                ExecRequest(
                    argv=["sh", "-c", "while :; do cut -d' ' -f1 /proc/uptime; sleep 0.05; done"],
                    timeout_seconds=60,
                )
            )
            info = await session.pause()
            assert info.paused and session.pausable
            assert client.containers.get(session.container_id).attrs["State"]["Paused"]
            with pytest.raises(SandboxConflictError):
                await session.exec(["true"], timeout_seconds=10)
            with pytest.raises(SandboxConflictError):
                await session.put_file("x", b"x")
            assert (await session.pause()).paused  # again: a no-op

            theirs = await other.get(session.id)
            assert (await theirs.info()).paused and [i.paused for i in await other.list()] == [True]
            with pytest.raises(SandboxConflictError):
                await theirs.exec(["true"], timeout_seconds=10)

            await asyncio.sleep(0.6)
            assert not (await theirs.resume()).paused
            assert not (await session.info()).paused  # this server learns it from the engine
            assert (await session.exec(["echo", "on"], timeout_seconds=10)).stdout == b"on\n"
            stamps: list[float] = []
            resumed = time.monotonic()
            async for item in handle.output:
                if isinstance(item, OutputChunk):
                    stamps += [float(line) for line in item.data.split()]
                if time.monotonic() - resumed > 0.5:
                    break
            await handle.kill()
            # the loop printed nothing while it was frozen: a gap of at least the pause between two stamps
            assert max(b - a for a, b in itertools.pairwise(stamps)) >= 0.5
        finally:
            await session.destroy()
            await ours.close()
            await other.close()

    asyncio.run(main())


def test_a_paused_session_is_destroyed_whole(client):
    async def main():
        sandbox = provider()
        session = await sandbox.create(SessionSpec(image=TEST_IMAGE, consumer="docker-pause"))
        await session.pause()
        await session.destroy()
        assert await sandbox.list() == []
        await sandbox.close()

    asyncio.run(main())
