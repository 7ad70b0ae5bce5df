"""Hostile users against the operator's limits and the scrub (issue 24, points 6, 8, 10 and 12).

Each test is one hole: concurrent requests of one user (asyncio.gather of real requests to a
real server) must not pass a per-user limit, one user must not take a shared pool, and with
the scrub on no MCP tool answer carries an injected credential. Users as in test_tenancy: the
token authenticates, X-Test-User names the user.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from tests.support.mcp import (
    MCP_HEADERS,
    AdminOnlyAdmin,
    HeaderUsers,
    data,
    httpx2,
    initialize,
    mcp_client,
    mcp_url,
    refusal,
)
from tests.support.server import call, sandbox_app, server_config

SECRET = "s3cret-value-0123456789"

INIT = initialize(client="hostile")


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    monkeypatch.setenv("ALICE_TOKEN", SECRET)
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={
            "credentials": {"user:alice": ["ALICE_TOKEN"]},
            "scrub_transcript": True,
            "max_sessions_per_user": 2,
            "max_ttl_seconds": 600.0,
        },
        SandboxApp={
            "presets_path": str(tmp_path / "presets.json"),
            "live_command_grace_seconds": 30.0,
            "max_live_commands_per_user": 4,
            "max_live_commands_per_session": 3,
        },
        SandboxMCP={"max_sessions": 12, "max_sessions_per_user": 3},
    )


@pytest.fixture
def as_user(jp_auth_header):
    return lambda name: {**jp_auth_header, "X-Test-User": name}


@pytest.fixture
def url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return mcp_url(jp_http_port, jp_base_url)


async def create(jp_fetch, user, **spec):
    return await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300, **spec}, headers={"X-Test-User": user}
    )


async def destroy_all(jp_fetch, user):
    status, listing = await call(jp_fetch, "sessions", headers={"X-Test-User": user})
    assert status == 200, listing
    for info in listing["sessions"]:
        await call(jp_fetch, "sessions", info["id"], method="DELETE", headers={"X-Test-User": user})


# ------------------------------------------------------------------ point 6: quota races


async def test_concurrent_creates_cannot_pass_max_sessions_per_user(jp_fetch):
    answers = await asyncio.gather(*(create(jp_fetch, "alice") for _ in range(10)))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201, 201] + [429] * 8, statuses
    assert all(body["error"] == "SandboxQuotaError" for status, body in answers if status == 429)
    _, listing = await call(jp_fetch, "sessions", headers={"X-Test-User": "alice"})
    assert len(listing["sessions"]) == 2
    await destroy_all(jp_fetch, "alice")
    # a create that fails gives its reserved slot back
    refused = await asyncio.gather(*(create(jp_fetch, "alice", ttl_seconds=10_000) for _ in range(2)))
    assert [status for status, _ in refused] == [400, 400], refused
    answers = await asyncio.gather(create(jp_fetch, "alice"), create(jp_fetch, "alice"))
    assert [status for status, _ in answers] == [201, 201], answers
    await destroy_all(jp_fetch, "alice")


async def test_concurrent_mcp_starts_cannot_pass_max_live_commands_per_user(url, as_user, jp_serverapp):
    """The user's cap (4) holds across sessions; each session's (3) within one (both shared with the websocket)."""
    async with mcp_client(url, as_user("alice")) as client:
        sid = data(await client.call_tool("session_create", {}))["id"]
        other = data(await client.call_tool("session_create", {}))["id"]
        starts = await asyncio.gather(
            *(
                client.call_tool(
                    "session_exec_start",
                    {"session_id": (sid, other)[i % 2], "argv": ["sleep", "30"], "timeout_seconds": 30},
                )
                for i in range(9)
            )
        )
        started = [data(r) for r in starts if not r.is_error]
        refused = [refusal(r) for r in starts if r.is_error]
        assert len(started) == 4, [r.structured_content for r in starts]
        assert max(sum(1 for s in started if s["session_id"] == session) for session in (sid, other)) <= 3
        assert {r["error"] for r in refused} == {"SandboxQuotaError"}
        assert any("max_live_commands_per_user" in r["message"] for r in refused), refused
        assert sandbox_app(jp_serverapp).execs.running_count("alice") == 4
        # a start that fails (an unknown program) gives its slot back
        for each in started:
            await client.call_tool("session_exec_kill", {"handle": each["handle"]})
        await client.call_tool("session_destroy", {"session_id": other})
        failed = await asyncio.gather(
            *(
                client.call_tool("session_exec_start", {"session_id": sid, "argv": ["/no/such/program"]})
                for _ in range(4)
            )
        )
        assert all(r.is_error or data(r)["handle"] for r in failed)
        for r in failed:
            if not r.is_error:
                await client.call_tool("session_exec_kill", {"handle": data(r)["handle"]})
        again = data(
            await client.call_tool(
                "session_exec_start", {"session_id": sid, "argv": ["sleep", "30"], "timeout_seconds": 30}
            )
        )
        assert again["handle"]
        await client.call_tool("session_destroy", {"session_id": sid})


async def test_finished_mcp_commands_kept_for_polls_are_bounded_per_user(url, as_user):
    """A finished handle keeps its output for its last polls: a user keeps at most the cap's number of them."""
    async with mcp_client(url, as_user("alice")) as client:
        sid = data(await client.call_tool("session_create", {}))["id"]
        handles = []
        for i in range(6):
            handle = data(
                await client.call_tool(
                    "session_exec_start", {"session_id": sid, "script": f"echo run{i}", "timeout_seconds": 10}
                )
            )["handle"]
            answer = data(await client.call_tool("session_exec_poll", {"handle": handle, "wait_seconds": 10}))
            while answer["running"]:
                answer = data(
                    await client.call_tool("session_exec_poll", {"handle": handle, "wait_seconds": 10})
                )
            handles.append(handle)
        polls = [
            await client.call_tool("session_exec_poll", {"handle": h, "wait_seconds": 0}) for h in handles
        ]
        assert [p.is_error for p in polls] == [True] * 3 + [False] * 3
        assert refusal(polls[0])["error"] == "SandboxNotFoundError"
        assert data(polls[-1])["output"] == [{"stream": "stdout", "text": "run5\n"}]
        await client.call_tool("session_destroy", {"session_id": sid})


# ------------------------------------------------------- point 8: websocket commands


async def start_ws(jp_ws_fetch, user, session_id, argv=("sleep", "30")):
    """Open an exec websocket and start a command: (socket, the first text message)."""
    ws = await jp_ws_fetch(
        "api", "sandbox", "sessions", session_id, "exec", "ws", headers={"X-Test-User": user}
    )
    await ws.write_message(json.dumps({"type": "start", "argv": list(argv), "timeout_seconds": 30}))
    return ws, json.loads(await asyncio.wait_for(ws.read_message(), 30))


async def test_websocket_commands_have_per_session_and_per_user_caps_detached_ones_included(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    execs = sandbox_app(jp_serverapp).execs
    first = (await create(jp_fetch, "alice"))[1]["id"]
    second = (await create(jp_fetch, "alice"))[1]["id"]
    bobs = (await create(jp_fetch, "bob"))[1]["id"]
    sockets = []
    try:
        opened = await asyncio.gather(*(start_ws(jp_ws_fetch, "alice", first) for _ in range(6)))
        sockets += [ws for ws, _ in opened]
        kinds = sorted(message["type"] for _, message in opened)
        assert kinds == ["error"] * 3 + ["started"] * 3, [m for _, m in opened]
        refused = [m for _, m in opened if m["type"] == "error"]
        assert {m["error"] for m in refused} == {"SandboxQuotaError"}
        assert "max_live_commands_per_session" in refused[0]["message"]
        # closing the sockets detaches the commands: they still count (they run on for the grace)
        for ws in sockets:
            ws.close()
        sockets.clear()
        await asyncio.sleep(0.3)
        assert len(execs) == 3
        ws, message = await start_ws(jp_ws_fetch, "alice", first)
        sockets.append(ws)
        assert (message["type"], message["error"]) == ("error", "SandboxQuotaError")
        # the user's cap (4) spans sessions: one more in another session, then no more
        opened = await asyncio.gather(*(start_ws(jp_ws_fetch, "alice", second) for _ in range(3)))
        sockets += [ws for ws, _ in opened]
        assert sorted(m["type"] for _, m in opened) == ["error", "error", "started"], [m for _, m in opened]
        refused = [m for _, m in opened if m["type"] == "error"]
        assert all("max_live_commands_per_user" in m["message"] for m in refused), refused
        assert len(execs) == 4
        # another user is not held back by alice's commands
        ws, message = await start_ws(jp_ws_fetch, "bob", bobs)
        sockets.append(ws)
        assert message["type"] == "started"
    finally:
        for ws in sockets:
            ws.close()
        await destroy_all(jp_fetch, "alice")
        await destroy_all(jp_fetch, "bob")
        await execs.close()


# ------------------------------------------------------------- point 10: MCP session slots


async def test_one_user_cannot_fill_the_servers_mcp_session_slots(url, as_user):
    async with httpx2.AsyncClient(timeout=30) as http:

        async def initialize(user):
            return await http.post(url, json=INIT, headers={**MCP_HEADERS, **as_user(user)})

        answers = await asyncio.gather(*(initialize("alice") for _ in range(15)))
        assert sorted(r.status_code for r in answers) == [200] * 3 + [429] * 12, [
            (r.status_code, r.text[:200]) for r in answers
        ]
        opened = [r.headers["mcp-session-id"] for r in answers if r.status_code == 200]
        refused = [r for r in answers if r.status_code != 200]
        assert {r.status_code for r in refused} == {429}
        assert {r.json()["error"]["data"]["error"] for r in refused} == {
            "SandboxQuotaError"
        }  # in a JSON-RPC error
        assert "max_sessions_per_user" in refused[0].json()["error"]["message"]
        # everyone else still gets in
        bob = await initialize("bob")
        assert bob.status_code == 200, bob.text
        # ending one of hers gives her the slot back
        ended = await http.delete(
            url,
            headers={
                **MCP_HEADERS,
                **as_user("alice"),
                "Mcp-Session-Id": opened[0],
                "Mcp-Protocol-Version": "2025-06-18",
            },
        )
        assert ended.status_code == 200, ended.text
        assert (await initialize("alice")).status_code == 200


# ------------------------------------------------------------- point 12: the scrub


async def test_mcp_file_tools_never_answer_an_injected_credential(url, as_user):
    async with mcp_client(url, as_user("alice")) as client:
        sid = data(await client.call_tool("session_create", {}))["id"]
        script = (
            'printf "key=%s\\n" "$ALICE_TOKEN" > creds.txt; mkdir -p d; touch "d/$ALICE_TOKEN";'
            'printf "%s" "$ALICE_TOKEN" > bare.txt'
        )
        ran = data(await client.call_tool("session_exec", {"session_id": sid, "script": script}))
        assert ran["exit_code"] == 0, ran
        answers = []
        text = data(await client.call_tool("session_read_file", {"session_id": sid, "path": "creds.txt"}))
        assert text["content"] == "key=[scrubbed]\n" and text["truncated"] is False
        answers.append(text)
        raw = data(
            await client.call_tool(
                "session_read_file", {"session_id": sid, "path": "creds.txt", "encoding": "base64"}
            )
        )
        assert base64.b64decode(raw["content"]) == b"key=[scrubbed]\n"
        answers.append(raw)
        # a cut inside the value answers none of it (the value is replaced whole)
        for max_bytes in (6, 10, 4 + len(SECRET)):
            cut = data(
                await client.call_tool(
                    "session_read_file",
                    {"session_id": sid, "path": "creds.txt", "encoding": "base64", "max_bytes": max_bytes},
                )
            )
            assert base64.b64decode(cut["content"]) == b"key=[scrubbed]" and cut["truncated"] is True
            answers.append(cut)
        bare = data(
            await client.call_tool(
                "session_read_file", {"session_id": sid, "path": "bare.txt", "max_bytes": 5}
            )
        )
        assert bare["content"] == "[scrubbed]"
        answers.append(bare)
        listed = data(await client.call_tool("session_list_files", {"session_id": sid, "path": "d"}))
        assert [e["name"] for e in listed["entries"]] == ["[scrubbed]"]
        answers.append(listed)
        # an error naming the path does not carry the value either
        missing = refusal(
            await client.call_tool("session_read_file", {"session_id": sid, "path": f"d/{SECRET}/x"})
        )
        answers.append(missing)
        await client.call_tool("session_destroy", {"session_id": sid})
    dumped = json.dumps(answers)
    assert SECRET not in dumped and SECRET[:8] not in dumped
    assert all(
        SECRET.encode() not in base64.b64decode(a["content"])
        for a in answers
        if a.get("encoding") == "base64"
    )
