"""Numbers a hostile client sends to every numeric field: each is a typed 400 naming the field, never a 500."""

from __future__ import annotations

import json

import pytest

from tests.support.server import call, server_config

HUGE = 10**400


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes")


@pytest.mark.parametrize("value", [HUGE, -HUGE, "60", True, None, 0, -1, float("inf")])
async def test_a_ttl_patch_with_a_bad_number_is_400(jp_fetch, value):
    _, info = await call(jp_fetch, "sessions", method="POST", body={})
    raw = json.dumps({"ttl_seconds": value}).encode() if value != float("inf") else b'{"ttl_seconds": 1e999}'
    status, body = await call(jp_fetch, "sessions", info["id"], method="PATCH", raw=raw)
    assert (status, body["error"], body.get("field")) == (400, "SandboxRequestError", "ttl_seconds"), body
    await call(jp_fetch, "sessions", info["id"], method="DELETE")


@pytest.mark.parametrize(
    ("field", "value"), [("timeout_seconds", HUGE), ("timeout_seconds", "5"), ("argv", HUGE)]
)
async def test_an_exec_with_a_bad_number_is_400(jp_fetch, field, value):
    _, info = await call(jp_fetch, "sessions", method="POST", body={})
    body = {"argv": ["true"], "timeout_seconds": 5, field: value}
    status, answer = await call(
        jp_fetch, "sessions", info["id"], "exec", method="POST", raw=json.dumps(body).encode()
    )
    assert (status, answer["error"], answer.get("field")) == (400, "SandboxRequestError", field), answer
    await call(jp_fetch, "sessions", info["id"], method="DELETE")
