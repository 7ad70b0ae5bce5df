"""A session that expired (reaped) or was destroyed answers 404 saying it may have expired, in the same
words as an id that never existed, on every provider (so nothing tells another user's session apart)."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox import sandboxes
from tests.support.server import call, server_config

NEVER = "sbx-0123456789abcdef"


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes")


async def test_a_reaped_session_says_it_may_have_expired_like_an_unknown_id(jp_fetch, provider):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 1})
    assert status == 201, info
    sid = info["id"]
    await asyncio.sleep(1.5)
    assert sid in await sandboxes.require_sandbox().reap()
    status, gone = await call(jp_fetch, "sessions", sid)
    assert status == 404 and gone["error"] == "SandboxNotFoundError"
    assert "may have expired" in gone["message"], gone
    status, never = await call(jp_fetch, "sessions", NEVER)
    assert status == 404 and never["message"].replace(NEVER, sid) == gone["message"]
    status, exec_gone = await call(jp_fetch, "sessions", sid, "exec", method="POST",
                                   body={"argv": ["true"], "timeout_seconds": 5})  # fmt: skip
    assert status == 404 and exec_gone["message"] == gone["message"]
