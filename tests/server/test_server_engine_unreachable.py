"""A docker provider whose engine cannot be reached: status says so (503, typed) before a create waits for it."""

from __future__ import annotations

import time

import pytest

from tests.support.server import call, server_config

NOWHERE = "unix:///tmp/nothing.sock"


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "docker", tmp_path / "sandboxes", DockerSandbox={"base_url": NOWHERE, "engine_timeout_seconds": 2.0}
    )


async def test_status_answers_503_when_the_engine_is_unreachable(jp_fetch):
    started = time.monotonic()
    status, body = await call(jp_fetch, "status")
    assert status == 503, body
    assert body["error"] == "SandboxUnavailableError"
    assert "cannot reach the Docker engine" in body["message"] and NOWHERE in body["message"], body
    assert time.monotonic() - started < 10  # said at once, not after a create's wait
