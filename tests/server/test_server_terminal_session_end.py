"""A terminal's life against its session's: a shell opens on a session that lives longer than the operator's
longest command deadline (issue 48: the panel asks for the TTL left, at most the status route's
``policy.max_timeout_seconds``), and a session reaped at its TTL or destroyed under an open command says so in the
command's last message, in the websocket's close (4404 and the reason) and in a later look-up, instead of a
transport error (ECONNRESET) or a bare close."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from jupyter_tai_sandbox.sessions import Caller
from tests.support.server import call, read_all, sandbox_app, server_config

EIGHT_HOURS = 8 * 3600  # the magics' default TTL


@pytest.fixture
def jp_server_config(provider, tmp_path):
    # the reaper is driven by the test (reap_once), not by its timer
    return server_config(provider, tmp_path / "sandboxes", SandboxApp={"reap_interval_seconds": 3600})


async def new_session(jp_fetch, ttl: float) -> dict:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": ttl})
    assert status == 201, info
    return info


async def start(jp_ws_fetch, session_id: str, argv: list[str], timeout: float, **more):
    ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws")
    await ws.write_message(json.dumps({"type": "start", "argv": argv, "timeout_seconds": timeout, **more}))
    return ws


async def started_and_ready(ws) -> None:
    """The "started" message, then the command's "ready" line."""
    seen = b""
    deadline = time.monotonic() + 60
    while b"ready" not in seen:
        message = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
        assert message is not None, "closed before the command was ready"
        if isinstance(message, bytes):
            seen += message[1:]
        else:
            data = json.loads(message)
            assert data["type"] == "started", data


async def test_a_terminal_opens_on_a_session_living_longer_than_the_longest_deadline(jp_fetch, jp_ws_fetch):
    info = await new_session(jp_fetch, EIGHT_HOURS)
    status, body = await call(jp_fetch, "status")
    assert status == 200, body
    maximum = body["policy"]["max_timeout_seconds"]
    assert 0 < maximum < info["seconds_left"], (maximum, info["seconds_left"])

    # the whole TTL left is over the maximum: refused, naming it (what the panel asked before issue 48)
    ws = await start(jp_ws_fetch, info["id"], ["sh", "-c", "echo no"], info["seconds_left"], pty=True)
    _, _, final, _ = await read_all(ws)
    assert final["type"] == "error" and final["error"] == "SandboxRequestError", final
    assert "max_timeout_seconds" in final["message"]

    # what the panel asks now (terminal.ts terminalTimeout): the lower of the TTL left and the maximum
    ws = await start(
        jp_ws_fetch,
        info["id"],
        ["sh", "-c", "echo shell-open"],
        min(info["seconds_left"], maximum),
        pty=True,
        rows=24,
        cols=80,
    )
    out, _, final, _ = await read_all(ws)
    assert b"shell-open" in out and final == {"type": "exit", "exit_code": 0}, (out, final)


async def test_a_session_destroyed_under_an_open_terminal_says_so(jp_fetch, jp_ws_fetch, jp_serverapp):
    info = await new_session(jp_fetch, 300)
    session_id = info["id"]
    ws = await start(jp_ws_fetch, session_id, ["sh", "-c", "echo ready; exec sleep 600"], 600)
    await started_and_ready(ws)

    status, _ = await call(jp_fetch, "sessions", session_id, method="DELETE")
    assert status == 204
    _, _, final, _ = await read_all(ws)
    expected = f"session {session_id} was destroyed"
    assert final == {
        "type": "error",
        "error": "SandboxSessionGoneError",
        "message": expected,
        "session_id": session_id,
        "reason": "destroyed",
    }, final
    assert ws.close_code == 4404 and ws.close_reason == expected, (ws.close_code, ws.close_reason)

    # a later look-up (the panel's, a reattach) says the same, a 404
    status, body = await call(jp_fetch, "sessions", session_id)
    assert status == 404 and body["error"] == "SandboxSessionGoneError" and body["reason"] == "destroyed", (
        body
    )
    # to another user it stays a 404 like any unknown id (nothing tells someone else's session apart)
    execs = sandbox_app(jp_serverapp).execs
    assert execs.gone(session_id, Caller("someone-else")) is None
    assert execs.gone(session_id, Caller("an-admin", frozenset({"write"}))) is not None


async def test_a_session_reaped_at_its_ttl_under_an_open_terminal_says_so(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    info = await new_session(jp_fetch, 4)
    session_id = info["id"]
    ws = await start(jp_ws_fetch, session_id, ["sh", "-c", "echo ready; exec sleep 600"], 600, pty=True)
    await started_and_ready(ws)
    await asyncio.sleep(max(0.0, info["expires_at"] - time.time()) + 0.2)

    assert session_id in await sandbox_app(jp_serverapp).reap_once()
    _, _, final, _ = await read_all(ws)
    expected = f"session {session_id} reached its TTL and was reaped"
    assert final["type"] == "error" and final["error"] == "SandboxSessionGoneError", final
    assert final["message"] == expected and final["reason"] == "ttl", final
    assert "ECONNRESET" not in json.dumps(final)
    assert ws.close_code == 4404 and ws.close_reason == expected, (ws.close_code, ws.close_reason)

    status, body = await call(jp_fetch, "sessions", session_id)
    assert status == 404 and body["reason"] == "ttl" and body["message"] == expected, body
