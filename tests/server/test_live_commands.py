"""One live-command registry behind both doors: the exec websocket (push) and MCP (pull) share its list,
its per-user cap and its grace policy; one set of SandboxApp settings configures it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from traitlets.config import Config

from jupyter_tai_sandbox.app import SandboxApp
from tests.support.mcp import data, mcp_client, mcp_url, refusal
from tests.support.server import call, sandbox_app, server_config

GRACE = 1.5


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        SandboxApp={"live_command_grace_seconds": GRACE, "max_live_commands_per_user": 2},
    )


@pytest.fixture
def url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return mcp_url(jp_http_port, jp_base_url)


async def new_session(jp_fetch) -> str:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    assert status == 201, info
    return info["id"]


async def ws_start(jp_ws_fetch, sid, argv):
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(json.dumps({"type": "start", "argv": argv, "timeout_seconds": 30}))
    return ws, json.loads(await asyncio.wait_for(ws.read_message(), 30))


async def test_the_per_user_cap_counts_the_commands_of_both_doors(jp_fetch, jp_ws_fetch, url, jp_auth_header):
    sid = await new_session(jp_fetch)
    ws, started = await ws_start(jp_ws_fetch, sid, ["sleep", "30"])
    assert started["type"] == "started"
    async with mcp_client(url, jp_auth_header) as client:
        first = await client.call_tool("session_exec_start", {"session_id": sid, "argv": ["sleep", "30"]})
        assert not first.is_error, first.structured_content
        # the websocket's command and MCP's fill the cap of 2: a third is refused on either door
        over = refusal(await client.call_tool("session_exec_start", {"session_id": sid, "argv": ["true"]}))
        assert over["error"] == "SandboxQuotaError" and "max_live_commands_per_user" in over["message"]
        other, refused = await ws_start(jp_ws_fetch, sid, ["true"])
        assert (refused["type"], refused["error"]) == ("error", "SandboxQuotaError")
        # an ended command gives its place: kill MCP's, then the websocket starts one
        await client.call_tool("session_exec_kill", {"handle": data(first)["handle"]})
        again, started = await ws_start(jp_ws_fetch, sid, ["true"])
        assert started["type"] == "started"
    for socket in (ws, other, again):
        socket.close()
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_an_mcp_started_command_is_listed_with_the_websocket_ones_and_can_be_attached(
    jp_fetch, jp_ws_fetch, url, jp_auth_header
):
    sid = await new_session(jp_fetch)
    async with mcp_client(url, jp_auth_header) as client:
        started = data(
            await client.call_tool(
                "session_exec_start",
                {"session_id": sid, "script": "echo from-mcp; sleep 30", "timeout_seconds": 30},
            )
        )
        handle = started["handle"]
        answer = data(await client.call_tool("session_exec_poll", {"handle": handle, "wait_seconds": 10}))
        assert answer["output"] == [{"stream": "stdout", "text": "from-mcp\n"}]
        _, listed = await call(jp_fetch, "sessions", sid, "execs")
        [entry] = listed["execs"]
        assert (entry["id"], entry["door"], entry["running"], entry["offset"]) == (handle, "mcp", True, 9)
        # the websocket's push face on the same entry: the ring replayed from 0, then the kill's exit
        ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
        await ws.write_message(json.dumps({"type": "attach", "exec_id": handle}))
        assert json.loads(await ws.read_message()) == {"type": "attached", "exec_id": handle, "offset": 0}
        assert await ws.read_message() == b"\x01from-mcp\n"
        assert (await call(jp_fetch, "sessions", sid, "execs", handle, method="DELETE"))[0] == 204
        assert json.loads(await ws.read_message()) == {"type": "exit", "exit_code": 137}
        # the MCP reader still polls its end (a polled command is kept for its last polls)
        answer = data(await client.call_tool("session_exec_poll", {"handle": handle, "offset": 9}))
        assert (answer["running"], answer["exit_code"]) == (False, 137)
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_an_unwatched_command_of_either_door_is_killed_after_the_one_grace(
    jp_fetch, jp_ws_fetch, url, jp_auth_header, jp_serverapp
):
    execs = sandbox_app(jp_serverapp).execs
    sid = await new_session(jp_fetch)
    ws, started = await ws_start(jp_ws_fetch, sid, ["sleep", "30"])
    ws_id = started["exec_id"]
    async with mcp_client(url, jp_auth_header) as client:
        handle = data(
            await client.call_tool(
                "session_exec_start", {"session_id": sid, "argv": ["sleep", "30"], "timeout_seconds": 30}
            )
        )["handle"]
        ws.close()  # the websocket's command is now unwatched too
        t0 = time.monotonic()
        while execs.running_count() and time.monotonic() - t0 < 15:
            await asyncio.sleep(0.1)
        took = time.monotonic() - t0
        assert execs.running_count() == 0 and GRACE * 0.8 < took < GRACE + 5, took
        # the websocket's command is forgotten (nobody is left to tell); the MCP one says why it ended
        assert ws_id not in [e["id"] for e in (await call(jp_fetch, "sessions", sid, "execs"))[1]["execs"]]
        answer = data(await client.call_tool("session_exec_poll", {"handle": handle, "wait_seconds": 0}))
        assert not answer["running"] and answer["error"]["error"] == "HandleExpired"
        assert "live_command_grace_seconds" in answer["error"]["message"]
    await call(jp_fetch, "sessions", sid, method="DELETE")


def test_the_live_command_settings_configure_the_one_policy_of_both_doors():
    config = Config(
        {
            "SandboxApp": {
                "live_command_grace_seconds": 7.0,
                "live_command_retention_seconds": 9.0,
                "live_command_buffer_bytes": 4096,
                "max_live_commands_per_user": 3,
                "max_live_commands_per_session": 5,
            }
        }
    )
    policy = SandboxApp(config=config).live_command_policy()
    assert (
        policy.grace_seconds,
        policy.retention_seconds,
        policy.buffer_bytes,
        policy.max_per_user,
        policy.max_per_session,
    ) == (7.0, 9.0, 4096, 3, 5)
