"""The engine killed under a live session (issue 15): calls fail fast, and after dockerd is back new
sessions work and the reaper removes what was left.

It stops the shared engine, so it runs only in CI (or with TAI_SANDBOX_DISTURB_ENGINE=1), marked
``disturbs_engine("kills")``: last of the serial group, so nothing runs after it on an engine it restarted. The engine is started again in
``finally`` blocks, even when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest

from jupyter_tai_sandbox.contract import SandboxError, SandboxUnavailableError
from tests.support.docker import (
    docker_client,
    engine_pid,
    fault_spec,
    kills_engine,
    leftovers,
    provider,
    start_engine,
    timed,
)

pytestmark = [pytest.mark.docker]


@kills_engine
@pytest.mark.parametrize("transport", ["exec", "auto"])
def test_a_killed_engine_fails_calls_fast_and_its_leftovers_are_reaped(client, transport):
    """SIGKILL dockerd under a live session and a running command, start it again. Through the relay
    ('exec') the session's calls and the running command fail at once; over the direct connection ('auto')
    they go on while the engine is down, and end typed when the engine's restart stops the container
    (live-restore off)."""

    async def main() -> None:
        sandbox = provider(
            engine_timeout_seconds=3,
            engine_slow_timeout_seconds=5,
            transfer_idle_seconds=3,
            agent_transport=transport,
        )
        session = await sandbox.create(fault_spec())
        running = await session.exec_start(
            ["sh", "-c", "while :; do echo tick; sleep 1; done"], timeout_seconds=60
        )
        os.kill(engine_pid(), signal.SIGKILL)
        try:
            await asyncio.sleep(0.5)
            outcomes = await asyncio.gather(
                timed(sandbox.list(), 15),
                timed(session.exec(["echo", "x"], timeout_seconds=5), 15),
                timed(session.get_file("x.txt"), 15),
                timed(sandbox.create(fault_spec()), 15),
            )

            async def drain() -> None:
                async for _ in running.output:
                    pass

            if transport == "exec":
                ended = await timed(drain(), 15)
        finally:
            await asyncio.to_thread(start_engine)
        if transport == "auto":
            ended = await timed(drain(), 15)
        for index, (took, result) in enumerate(outcomes):
            assert took < 6, (took, result)
            if transport == "auto" and index in (1, 2):  # exec and get_file: the agent's alone
                assert not isinstance(result, SandboxUnavailableError), result
            else:
                assert isinstance(result, SandboxUnavailableError), result
        took, result = ended
        assert took < 10 and isinstance(result, SandboxError), result
        # the engine is back: new sessions work, and what was left is reaped
        fresh = await asyncio.wait_for(sandbox.create(fault_spec()), 60)
        assert (await fresh.exec(["echo", "ok"], timeout_seconds=10)).stdout == b"ok\n"
        await fresh.destroy()
        reaped: list[str] = []
        for _ in range(20):
            reaped += await asyncio.wait_for(sandbox.reap(), 60)
            if session.id in reaped:
                break
            await asyncio.sleep(1)
        assert session.id in reaped
        with contextlib.suppress(SandboxError):
            await session.destroy()
        await sandbox.close()

    try:
        asyncio.run(main())
    finally:
        start_engine()
    assert leftovers(client) == [] or leftovers(docker_client()) == []
