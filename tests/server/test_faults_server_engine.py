"""A frozen engine under a live server: requests that need the engine fail in bounded time with 503,
and the server's event loop never blocks (``GET /api/sandbox/status`` answers within 1 s throughout).

It freezes the shared engine (SIGSTOP for a few seconds), so it runs only in CI or with
``TAI_SANDBOX_DISTURB_ENGINE=1``; the engine is resumed in a ``finally`` block.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.support.docker import disturbs_engine, engine_pid, freeze_engine
from tests.support.server import call, exec_call, server_config

pytestmark = [disturbs_engine, pytest.mark.docker]
FROZEN_SECONDS = 5.0


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "docker", tmp_path / "sandboxes",
        DockerSandbox={"engine_timeout_seconds": 2.0, "engine_slow_timeout_seconds": 3.0},
    )  # fmt: skip


async def test_status_answers_within_a_second_while_the_engine_is_frozen(jp_fetch):
    _, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120})
    sid = info["id"]
    pid = engine_pid()
    freeze_engine(pid)
    try:
        frozen_at = time.monotonic()
        # requests that need the engine, left running while status is polled
        engine_calls = [
            asyncio.ensure_future(exec_call(jp_fetch, sid, ["echo", "x"], 5, request_timeout=30)),
            asyncio.ensure_future(call(jp_fetch, "sessions", request_timeout=30)),
            asyncio.ensure_future(call(jp_fetch, "sessions", method="POST", body={}, request_timeout=30)),
        ]
        slowest = 0.0
        while time.monotonic() - frozen_at < FROZEN_SECONDS:
            started = time.monotonic()
            status, body = await call(jp_fetch, "status", request_timeout=5)
            slowest = max(slowest, time.monotonic() - started)
            # fast either way: the kind row, or 503 saying the engine does not answer (issue 25 point 7)
            assert (status == 200 and body["kind"] == "docker") or (
                status == 503
                and body["error"] == "SandboxUnavailableError"
                and "Docker engine" in body["message"]
            ), (status, body)
            await asyncio.sleep(0.2)
        answers = await asyncio.wait_for(asyncio.gather(*engine_calls), 20)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert slowest < 1.0, f"status took {slowest:.2f} s while the engine was frozen"
    for status, body in answers:
        # each answered, bounded by the engine timeouts: 503 while frozen (or done, if it had finished)
        assert status in (200, 201, 503), body
        if status == 503:
            assert body["error"] == "SandboxUnavailableError"
    # after the thaw the server works again
    for _ in range(30):
        status, result = await exec_call(jp_fetch, sid, ["echo", "back"], 10, request_timeout=30)
        if status == 200:
            break
        await asyncio.sleep(1)
    assert (status, result["stdout"]) == (200, "back\n")
    for session in (await call(jp_fetch, "sessions"))[1]["sessions"]:
        await call(jp_fetch, "sessions", session["id"], method="DELETE", request_timeout=30)
