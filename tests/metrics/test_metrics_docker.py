"""What the docker provider counts under the gate, on a real server's /metrics: its warm pool (ready, size,
hits and misses), the engine's errors, and the session agent's connection opened again after its loss."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError
from jupyter_tai_sandbox.providers.docker_engine import DockerEngine
from tests.metrics.scrape import key, moved, scrape
from tests.support.server import call, exec_call, sandbox_app, server_config

pytestmark = [pytest.mark.docker, pytest.mark.slow(30)]


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("docker", tmp_path / "sandboxes", DockerSandbox={"pool_size": 1})


async def until(jp_fetch, sample, value, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while True:
        samples = await scrape(jp_fetch)
        if samples.get(sample) == value:
            return samples
        assert time.monotonic() < deadline, (sample, samples.get(sample))
        await asyncio.sleep(0.25)


async def test_the_pool_the_engine_and_the_agent_connection_on_metrics(jp_fetch, jp_serverapp):
    ready, size = key("pool_ready", provider="docker"), key("pool_size", provider="docker")
    before = await until(jp_fetch, ready, 1)
    assert before[size] == 1
    # two creates at once: the first takes the pooled container, the second finds the pool empty
    made = await asyncio.gather(
        *(call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120}) for _ in range(2))
    )
    assert [status for status, _ in made] == [201, 201], made
    sid = made[0][1]["id"]
    # the agent's connection, lost (closed under the session), is opened again by the next call
    session = await sandbox_app(jp_serverapp).sandbox.get(sid)
    assert (await exec_call(jp_fetch, sid, ["true"]))[1]["exit_code"] == 0
    client = await session.session._channel.client()
    await client.close()
    assert (await exec_call(jp_fetch, sid, ["true"]))[1]["exit_code"] == 0
    # an engine call that fails: a container that is not there
    engine = DockerEngine("unix:///var/run/docker.sock")
    try:
        with pytest.raises(SandboxNotFoundError):
            await engine.inspect_container("tai-metrics-no-such-container")
    finally:
        await engine.close()
    after = await scrape(jp_fetch)
    for _, info in made:
        assert (await call(jp_fetch, "sessions", info["id"], method="DELETE"))[0] == 204
    changes = moved(before, after)
    assert changes[key("pool_takes_total", outcome="hit")] == 1
    assert changes[key("pool_takes_total", outcome="miss")] == 1
    assert changes[key("agent_reconnects_total")] == 1
    # the server's own workload here makes no failed engine call: the one is the test's
    assert changes[key("engine_errors_total", error="SandboxNotFoundError")] == 1
    assert changes[key("session_creates_total", provider="docker", outcome="ok")] == 2
    # the pool refills to its size
    await until(jp_fetch, ready, 1)
