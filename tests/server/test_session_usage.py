"""Resource use per session: the provider hook and GET /api/sandbox/sessions/{id}'s ``usage``."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.contract import USAGE_FIELDS, SessionSpec
from jupyter_tai_sandbox.providers.local.session import disk_usage
from tests.support.server import call, exec_call, make_provider, server_config

MiB = 1 << 20


def test_usage_on_each_provider(provider, tmp_path):
    async def main():
        sandbox = make_provider(provider, tmp_path)
        spec = SessionSpec(memory_mb=64) if provider == "docker" else SessionSpec()
        session = await sandbox.create(spec)
        try:
            result = await session.exec(
                [
                    "sh",
                    "-c",
                    "mkdir -p d && head -c 3000000 /dev/urandom > d/big && i=0; "
                    "while [ $i -lt 20000 ]; do i=$((i+1)); done",
                ],
                timeout_seconds=60,
            )
            assert result.exit_code == 0, result
            started = time.monotonic()
            usage = await session.usage()
            took = time.monotonic() - started
            assert set(usage) == set(USAGE_FIELDS)
            assert usage["disk_bytes"] >= 3000000 and usage["disk_partial"] is False
            assert abs(usage["measured_at"] - time.time()) < 60
            if provider == "local":
                assert usage["cpu_seconds"] is usage["memory_bytes"] is usage["memory_limit_bytes"] is None
                assert "cannot attribute" in usage["note"]
            else:
                assert usage["cpu_seconds"] > 0
                assert 0 < usage["memory_bytes"] <= usage["memory_limit_bytes"] == 64 * MiB
                assert usage["note"] is None
            assert took < 5, f"usage took {took:.1f} s"
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_the_local_walk_is_bounded(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"x" * 5000)
    total, partial = disk_usage(tmp_path, 10, 5.0)
    assert partial and total < 50 * 5000
    total, partial = disk_usage(tmp_path, 1000, 5.0)
    assert not partial and total >= 50 * 4096


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes")


async def test_get_session_includes_usage(jp_fetch, provider):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120})
    assert status == 201, info
    sid = info["id"]
    status, _ = await exec_call(jp_fetch, sid, ["sh", "-c", "head -c 100000 /dev/zero > f"], 30)
    assert status == 200
    status, seen = await call(jp_fetch, "sessions", sid)
    assert status == 200 and set(seen["usage"]) == set(USAGE_FIELDS)
    assert seen["usage"]["disk_bytes"] >= 100000
    assert (seen["usage"]["memory_bytes"] is None) == (provider == "local")
    status, listing = await call(jp_fetch, "sessions")
    assert "usage" not in listing["sessions"][0]  # the listing stays cheap: usage is per session
    await call(jp_fetch, "sessions", sid, method="DELETE")
