"""Server state is never read back from a container (issue 24, point 4), on a real engine.

A pooled session's spec env is kept on its record volume (``tai-rec-<id>``, which
the session cannot touch), not in the container: a session that plants a big
sparse file or junk where the env used to be changes nothing for the next server.
Every read from a container is size-capped.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc

import pytest

from jupyter_tai_sandbox.contract import SandboxError
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.providers.docker_engine import DockerEngine
from tests.support.docker import provider, spec

pytestmark = [pytest.mark.timeout(180), pytest.mark.docker]

#: where the old code kept a pooled session's env, in the container
OLD_ENV_FILE = "/tmp/.tai-sbx-env.json"
#: a sparse file (no disk used): what the old code would have read whole
SPARSE = 128 << 20


async def pool_ready(sandbox: DockerSandbox, count: int, seconds: float = 20.0) -> None:
    await sandbox.list()  # connects, which starts the pool
    deadline = time.monotonic() + seconds
    while sandbox._pool.ready_count() < count:
        assert time.monotonic() < deadline, f"the pool holds {sandbox._pool.ready_count()} of {count}"
        await asyncio.sleep(0.05)


async def peak_bytes_during(coro):
    """(result, peak Python allocations while ``coro`` ran, in bytes)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = await coro
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("planted", ["sparse", "junk"])
def test_a_pooled_sessions_env_is_never_read_back_from_its_container(client, monkeypatch, planted):
    reads: list[tuple[str, str]] = []
    real_read_file = DockerEngine.read_file

    async def spy(self, container_id, path, **kwargs):
        reads.append((container_id, path))
        return await real_read_file(self, container_id, path, **kwargs)

    monkeypatch.setattr(DockerEngine, "read_file", spy)

    async def attack_and_look_up(sandbox: DockerSandbox, session) -> None:
        assert session.record is not None
        await sandbox._pool.settle()
        plant = (
            f"rm -rf {OLD_ENV_FILE} && truncate -s {SPARSE} {OLD_ENV_FILE}"
            if planted == "sparse"
            else f'rm -rf {OLD_ENV_FILE} && printf %s \'{{"SECRET_TOKEN": "planted", "LD_PRELOAD": "/tmp/x.so"}}\' > {OLD_ENV_FILE}'
        )
        result = await session.exec(["sh", "-c", plant], timeout_seconds=20)
        assert result.exit_code == 0, result
        later = provider()  # the next server to look the session up
        try:
            again, peak = await peak_bytes_during(later.get(session.id))
            assert again.spec.env == {"SECRET_TOKEN": "pooled-secret"}
            result = await again.exec(
                ["sh", "-c", 'printf %s "$SECRET_TOKEN:$LD_PRELOAD"'], timeout_seconds=10
            )
            assert result.stdout == b"pooled-secret:"
            assert peak < 8 << 20, peak
            assert reads == []  # nothing of the container was read back
        finally:
            await later.close()

    async def main() -> None:
        sandbox = provider(pool_size=1)
        try:
            await pool_ready(sandbox, 1)
            session = await sandbox.create(spec(env={"SECRET_TOKEN": "pooled-secret"}))
            try:
                await attack_and_look_up(sandbox, session)
            finally:
                await session.destroy()
        finally:
            await sandbox.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_reads_from_a_container_are_size_capped(client):
    async def main() -> None:
        sandbox = provider()
        try:
            session = await sandbox.create(spec())
            try:
                made = await session.exec(
                    ["sh", "-c", f"printf small > /workspace/small && truncate -s {SPARSE} /workspace/big"],
                    timeout_seconds=20,
                )
                assert made.exit_code == 0, made
                engine = sandbox._engine
                assert await engine.read_file(session.container_id, "/workspace/small") == b"small"
                started = time.monotonic()
                with pytest.raises(SandboxError, match="over the"):
                    await engine.read_file(session.container_id, "/workspace/big")
                assert time.monotonic() - started < 5
                _, peak = await peak_bytes_during(
                    asyncio.gather(
                        engine.read_file(session.container_id, "/workspace/big"), return_exceptions=True
                    )
                )
                assert peak < (1 << 20) + (4 << 20)  # DockerEngine.read_file reads at most 1 MiB, peak
                # a helper command's output is capped too (the container's programs are the session's)
                with pytest.raises(SandboxError, match="more than"):
                    await engine.run(
                        session.container_id, ["sh", "-c", "yes | head -c 3000000"], limit=1 << 20
                    )
                code, out, _ = await engine.run(session.container_id, ["sh", "-c", "printf ok"])
                assert (code, out) == (0, b"ok")
            finally:
                await session.destroy()
        finally:
            await sandbox.close()

    asyncio.run(asyncio.wait_for(main(), 120))
