"""The MCP door driven by the official `mcp` client over Streamable HTTP, against a live jupyter_server.

Users as in test_tenancy: the server's token authenticates, X-Test-User names the user
(alice, bob, reader, admin), and only admin holds the admin resource.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.support.mcp import (
    MCP_HEADERS,
    WORD_COUNT,
    AdminOnlyAdmin,
    HeaderUsers,
    MCPError,
    data,
    httpx2,
    initialize,
    mcp_client,
    mcp_url,
    refusal,
)
from tests.support.server import sandbox_app, server_config

SESSION_TOOLS = {
    "session_create",
    "session_exec",
    "session_exec_start",
    "session_exec_poll",
    "session_exec_kill",
    "session_read_file",
    "session_write_file",
    "session_list_files",
    "session_destroy",
    "session_status",
    "session_pause",
    "session_resume",
    "session_fork",
    "session_transcript",
}


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WORD_COUNT_TOKEN", "s3cret-value")
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={
            "credentials": {"user:alice": ["WORD_COUNT_TOKEN"]},
            "scrub_transcript": True,
            "max_timeout_seconds": 30.0,
        },
        SandboxApp={
            "presets_path": str(tmp_path / "presets.json"),
            "presets": {"word_count": WORD_COUNT},
            "live_command_grace_seconds": 1.5,
        },
        SandboxMCP={"tools_poll_interval_seconds": 0.5},
    )


@pytest.fixture
def url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    """The door's URL on the test server's real port (http_server is what listens on it)."""
    return mcp_url(jp_http_port, jp_base_url)


@pytest.fixture
def as_user(jp_auth_header):
    return lambda name: {**jp_auth_header, "X-Test-User": name}


@pytest.fixture
def audit(jp_serverapp):
    records = []
    sandbox_app(jp_serverapp).mcp_door.audit_sinks.append(records.append)
    return records


async def test_initialize_and_tools_list_with_preset_schemas(url, as_user):
    async with mcp_client(url, as_user("alice")) as client:
        assert client.session.server_capabilities.tools.list_changed is True
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert SESSION_TOOLS | {
        "sandbox_exec",
        "sandbox_status",
        "word_count",
        "preset_put",
        "preset_remove",
    } <= set(tools)
    assert tools["word_count"].input_schema == WORD_COUNT["input_schema"]
    assert tools["word_count"].description.startswith("Count the words in a text.")
    assert tools["sandbox_exec"].input_schema["oneOf"] == [{"required": ["argv"]}, {"required": ["script"]}]
    assert tools["session_exec"].input_schema["required"] == ["session_id"]
    assert tools["session_read_file"].annotations.read_only_hint is True


def _type_lists(schema, where="inputSchema"):
    """Where in ``schema`` a ``type`` is a list or an ``enum`` holds null (what strict MCP clients reject)."""
    found = []
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), list):
            found.append(where)
        if isinstance(schema.get("enum"), list) and None in schema["enum"]:
            found.append(f"{where}.enum")
        for key, value in schema.items():
            found += _type_lists(value, f"{where}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found += _type_lists(value, f"{where}[{i}]")
    return found


async def test_no_tool_input_schema_has_a_type_list_or_a_null_enum(url, as_user):
    async with mcp_client(url, as_user("admin")) as client:
        tools = (await client.list_tools()).tools
    assert {"session_create", "sandbox_exec"} <= {tool.name for tool in tools}
    found = {tool.name: _type_lists(tool.input_schema) for tool in tools}
    assert not {name: where for name, where in found.items() if where}


async def test_a_session_a_command_and_a_file_round_trip(url, as_user, audit):
    async with mcp_client(url, as_user("alice")) as client:
        info = data(await client.call_tool("session_create", {"ttl_seconds": 300}))
        sid = info["id"]
        assert info["owner"] == "alice" and info["consumer"] == "user:alice"
        ran = data(await client.call_tool("session_exec", {"session_id": sid, "argv": ["echo", "hello"]}))
        assert ran["exit_code"] == 0 and ran["stdout"] == "hello\n" and ran["stdout_bytes"] == 6
        assert ran["truncated"] is False
        ran = data(
            await client.call_tool(
                "session_exec",
                {"session_id": sid, "script": "cat; echo err >&2; exit 3", "stdin": "from stdin"},
            )
        )
        assert (ran["exit_code"], ran["stdout"], ran["stderr"]) == (3, "from stdin", "err\n")
        # the credential the policy injects for alice is scrubbed from what the agent reads
        ran = data(
            await client.call_tool("session_exec", {"session_id": sid, "script": "echo $WORD_COUNT_TOKEN"})
        )
        assert ran["stdout"] == "[scrubbed]\n" and ran["stdout_bytes"] == len("s3cret-value\n")
        written = data(
            await client.call_tool(
                "session_write_file",
                {"session_id": sid, "path": "data/notes.txt", "content": "héllo\nworld\n"},
            )
        )
        assert written["size"] == len("héllo\nworld\n".encode())
        read = data(
            await client.call_tool("session_read_file", {"session_id": sid, "path": "data/notes.txt"})
        )
        assert read["content"] == "héllo\nworld\n" and read["truncated"] is False
        raw = data(
            await client.call_tool(
                "session_read_file",
                {"session_id": sid, "path": "data/notes.txt", "encoding": "base64", "max_bytes": 3},
            )
        )
        assert raw["content"] == "aMOp" and raw["truncated"] is True
        listed = data(await client.call_tool("session_list_files", {"session_id": sid, "path": "data"}))
        assert [e["name"] for e in listed["entries"]] == ["notes.txt"]
        ran = data(
            await client.call_tool("session_exec", {"session_id": sid, "argv": ["cat", "data/notes.txt"]})
        )
        assert ran["stdout"] == "héllo\nworld\n"
        status = data(await client.call_tool("session_status", {}))
        assert [s["id"] for s in status["sessions"]] == [sid] and status["provider"]["kind"] == "local"
        assert data(await client.call_tool("session_status", {"session_id": sid}))["id"] == sid
        assert data(await client.call_tool("session_destroy", {"session_id": sid}))["destroyed"] is True
        gone = refusal(await client.call_tool("session_status", {"session_id": sid}))
        assert gone["error"] == "SandboxNotFoundError"
    by_tool = {r["tool"]: r for r in audit}
    assert by_tool["session_create"] == {
        "user": "alice",
        "tool": "session_create",
        "session": sid,
        "outcome": "ok",
    }
    assert by_tool["session_exec"]["session"] == sid and by_tool["session_exec"]["outcome"].startswith(
        "ok exit_code="
    )
    assert audit[-1]["outcome"] == "error SandboxNotFoundError"
    assert "s3cret-value" not in json.dumps(audit)


async def test_long_output_is_cut_with_a_marker_and_counts(url, as_user, jp_serverapp):
    sandbox_app(jp_serverapp).mcp_door.max_output_bytes = 1000
    async with mcp_client(url, as_user("alice")) as client:
        sid = data(await client.call_tool("session_create", {}))["id"]
        ran = data(
            await client.call_tool(
                "session_exec",
                {"session_id": sid, "script": "i=0; while [ $i -lt 500 ]; do echo line$i; i=$((i+1)); done"},
            )
        )
        assert ran["truncated"] is True and ran["stdout_truncated"] is True
        assert ran["stdout_bytes"] > 3000 and "bytes truncated" in ran["stdout"]
        assert ran["stdout"].startswith("line0\n") and ran["stdout"].endswith("line499\n")
        await client.call_tool("session_destroy", {"session_id": sid})


async def test_a_preset_runs_for_the_admin_and_the_fence_refuses_others(url, as_user, audit):
    async with mcp_client(url, as_user("admin")) as client:
        ran = data(await client.call_tool("word_count", {"text": "one two three"}))
        assert ran["exit_code"] == 0 and ran["stdout"].strip() == "3"
        ran = data(await client.call_tool("sandbox_exec", {"argv": ["echo", "base"], "timeout_seconds": 10}))
        assert ran["stdout"] == "base\n"
    async with mcp_client(url, as_user("alice")) as client:
        refused = refusal(await client.call_tool("word_count", {"text": "one two"}))
        assert (
            refused["error"] == "ToolAccessDeniedError" and "jupyter_tai_sandbox:admin" in refused["message"]
        )
        assert (
            refusal(await client.call_tool("sandbox_exec", {"argv": ["id"], "timeout_seconds": 5}))["error"]
            == "ToolAccessDeniedError"
        )
        assert data(await client.call_tool("sandbox_status", {}))["kind"] == "local"  # the open tier
    assert [r["outcome"] for r in audit if r["tool"] == "word_count"] == [
        "ok exit_code=0",
        "error ToolAccessDeniedError",
    ]


async def test_authoring_is_fenced_and_the_tool_list_follows(url, as_user, jp_serverapp):
    async with mcp_client(url, as_user("alice")) as client:
        refused = refusal(await client.call_tool("preset_put", {"name": "shout", "definition": WORD_COUNT}))
        assert refused["error"] == "ToolAccessDeniedError"
        assert refusal(await client.call_tool("preset_remove", {"name": "word_count"}))["error"] in (
            "ToolAccessDeniedError",
            "PresetConflictError",
        )
    assert "shout" not in sandbox_app(jp_serverapp).tools.presets()

    notified = asyncio.Event()

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            notified.set()

    async with mcp_client(url, as_user("bob"), message_handler=on_message) as watcher:
        await watcher.list_tools()
        async with mcp_client(url, as_user("admin")) as admin:
            made = data(
                await admin.call_tool(
                    "preset_put",
                    {
                        "name": "shout",
                        "definition": {
                            "description": "Upper-case a text.",
                            "input_schema": {
                                "type": "object",
                                "properties": {"text": {"type": "string"}},
                                "required": ["text"],
                            },
                            "binding": {
                                "argv": ["tr", "a-z", "A-Z"],
                                "stdin": {"field": "text"},
                                "timeout_seconds": 10,
                            },
                        },
                    },
                )
            )
            assert made["name"] == "shout" and made["source"] == "store"
            await asyncio.wait_for(notified.wait(), 10)
            tools = {t.name: t for t in (await watcher.list_tools()).tools}
            assert tools["shout"].input_schema["required"] == ["text"]
            assert data(await admin.call_tool("shout", {"text": "hey"}))["stdout"] == "HEY"
            notified.clear()
            assert data(await admin.call_tool("preset_remove", {"name": "shout"}))["removed"] is True
            await asyncio.wait_for(notified.wait(), 10)
            assert "shout" not in {t.name for t in (await watcher.list_tools()).tools}


async def test_another_users_session_is_not_found(url, as_user):
    async with mcp_client(url, as_user("alice")) as alice, mcp_client(url, as_user("bob")) as bob:
        sid = data(await alice.call_tool("session_create", {}))["id"]
        for tool, args in (
            ("session_exec", {"argv": ["true"]}),
            ("session_read_file", {"path": "x"}),
            ("session_write_file", {"path": "planted", "content": "x"}),
            ("session_list_files", {}),
            ("session_status", {}),
            ("session_destroy", {}),
            ("session_exec_start", {"argv": ["true"]}),
        ):
            theirs = refusal(await bob.call_tool(tool, {"session_id": sid, **args}))
            unknown = refusal(await bob.call_tool(tool, {"session_id": "sbx-0000000000000000", **args}))
            assert theirs["error"] == unknown["error"] == "SandboxNotFoundError", (tool, theirs)
        assert sid not in [s["id"] for s in data(await bob.call_tool("session_status", {}))["sessions"]]
        started = data(
            await alice.call_tool("session_exec_start", {"session_id": sid, "argv": ["sleep", "5"]})
        )
        stolen = refusal(await bob.call_tool("session_exec_poll", {"handle": started["handle"]}))
        assert stolen["error"] == "SandboxNotFoundError"
        assert refusal(await bob.call_tool("session_exec_kill", {"handle": started["handle"]}))["error"] == (
            "SandboxNotFoundError"
        )
        await alice.call_tool("session_destroy", {"session_id": sid})


async def test_each_tool_asks_the_authorizer_for_its_action(url, as_user):
    async with mcp_client(url, as_user("reader")) as client:
        assert "sessions" in data(await client.call_tool("session_status", {}))
        refused = refusal(await client.call_tool("session_create", {}))
        assert refused["error"] == "SandboxForbiddenError" and "'write'" in refused["message"]


async def test_a_long_command_is_polled_to_its_exit(url, as_user):
    async with mcp_client(url, as_user("alice")) as client:
        sid = data(await client.call_tool("session_create", {}))["id"]
        started = data(
            await client.call_tool(
                "session_exec_start",
                {
                    "session_id": sid,
                    "script": "for i in 1 2 3; do echo out$i; sleep 0.4; done; echo bad >&2; exit 7",
                    "timeout_seconds": 20,
                },
            )
        )
        handle, offset, seen, polls = started["handle"], 0, [], 0
        while True:
            polls += 1
            answer = data(
                await client.call_tool(
                    "session_exec_poll", {"handle": handle, "offset": offset, "wait_seconds": 5}
                )
            )
            assert answer["offset"] == offset
            seen.extend(answer["output"])
            offset = answer["next_offset"]
            if not answer["running"] and not answer["more"]:
                break
        assert polls >= 2  # it was polled while it ran
        text = {s: "".join(o["text"] for o in seen if o["stream"] == s) for s in ("stdout", "stderr")}
        assert text == {"stdout": "out1\nout2\nout3\n", "stderr": "bad\n"}
        assert answer["exit_code"] == 7 and "error" not in answer and answer["stdout_bytes"] == 15
        # polling again from 0 replays the kept output
        again = data(await client.call_tool("session_exec_poll", {"handle": handle, "max_bytes": 5}))
        assert again["output"] == [{"stream": "stdout", "text": "out1\n"}] and again["more"] is True
        await client.call_tool("session_destroy", {"session_id": sid})


async def test_a_started_command_dies_with_its_deadline_its_handle_and_its_session(url, as_user, tmp_path):
    async with mcp_client(url, as_user("alice")) as client:
        sid = data(await client.call_tool("session_create", {}))["id"]
        # the command's own deadline
        started = data(
            await client.call_tool(
                "session_exec_start", {"session_id": sid, "argv": ["sleep", "30"], "timeout_seconds": 0.5}
            )
        )
        answer = data(
            await client.call_tool("session_exec_poll", {"handle": started["handle"], "wait_seconds": 10})
        )
        assert not answer["running"] and answer["error"]["error"] == "SandboxExecTimeoutError"
        # a handle nobody polls (the agent went away) is killed (SandboxApp.live_command_grace_seconds = 1.5)
        marker = "idle-marker"
        started = data(
            await client.call_tool(
                "session_exec_start",
                {"session_id": sid, "script": f"sleep 20; touch {marker}", "timeout_seconds": 25},
            )
        )
        t0 = time.monotonic()
        await asyncio.sleep(3.5)
        answer = data(
            await client.call_tool("session_exec_poll", {"handle": started["handle"], "wait_seconds": 0})
        )
        assert not answer["running"] and answer["error"]["error"] == "HandleExpired"
        assert time.monotonic() - t0 < 10
        # destroying the session kills what runs in it
        started = data(
            await client.call_tool(
                "session_exec_start", {"session_id": sid, "argv": ["sleep", "25"], "timeout_seconds": 25}
            )
        )
        data(await client.call_tool("session_destroy", {"session_id": sid}))
        answer = data(
            await client.call_tool("session_exec_poll", {"handle": started["handle"], "wait_seconds": 5})
        )
        assert not answer["running"] and answer["error"]["error"] == "SandboxSessionGoneError", (
            answer
        )  # says why


async def test_bad_input_answers_an_error_naming_the_field(url, as_user):
    async with mcp_client(url, as_user("admin")) as client:
        bad = refusal(await client.call_tool("word_count", {"text": 5}))
        assert (bad["error"], bad["field"]) == ("ToolInputError", "text")
        bad = refusal(await client.call_tool("word_count", {}))
        assert (bad["error"], bad["field"]) == ("ToolInputError", "text")
        bad = refusal(await client.call_tool("session_exec", {"argv": ["true"]}))
        assert (bad["error"], bad["field"]) == ("ToolInputError", "session_id")
        sid = data(await client.call_tool("session_create", {}))["id"]
        bad = refusal(
            await client.call_tool("session_exec", {"session_id": sid, "argv": ["true"], "nope": 1})
        )
        assert bad["field"] == "nope"
        bad = refusal(
            await client.call_tool(
                "session_exec", {"session_id": sid, "argv": ["true"], "timeout_seconds": 31}
            )
        )
        assert bad["field"] == "timeout_seconds" and "max_timeout_seconds" in bad["message"]
        bad = refusal(await client.call_tool("session_create", {"network": "everywhere"}))
        assert bad["field"] == "network"
        bad = refusal(
            await client.call_tool(
                "session_write_file", {"session_id": sid, "path": "x", "content": "%", "encoding": "base64"}
            )
        )
        assert bad["field"] == "content"
        bad = refusal(
            await client.call_tool("session_read_file", {"session_id": sid, "path": "../../etc/passwd"})
        )
        assert bad["error"] in ("SandboxPathError", "SandboxNotFoundError")
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no_such_tool", {})
        assert "no_such_tool" in unknown.value.message
        await client.call_tool("session_destroy", {"session_id": sid})


INIT = initialize()


async def test_unauthenticated_and_cross_origin_requests_are_refused(url, jp_auth_header, jp_http_port):
    async with httpx2.AsyncClient(timeout=30) as http:
        # no credential at all
        answer = await http.post(url, json=INIT, headers=MCP_HEADERS)
        assert answer.status_code == 403 and "mcp-session-id" not in answer.headers
        # the API's error body, inside a JSON-RPC error (what MCP clients show): says how to pass the token
        assert answer.json()["error"]["data"]["error"] == "SandboxAuthenticationError", answer.text
        assert "access-control-allow-origin" not in answer.headers
        # a wrong token
        answer = await http.post(url, json=INIT, headers={**MCP_HEADERS, "Authorization": "token wrong"})
        assert answer.status_code == 403
        assert answer.json()["error"]["data"]["error"] == "SandboxAuthenticationError"
        assert "token is missing or wrong" in answer.json()["error"]["message"]
        assert "Authorization: token <TOKEN>" in answer.json()["error"]["message"]
        # a browser page elsewhere: refused even with the token (MCP's DNS-rebinding rule), no CORS grant
        for origin in ("http://evil.example", f"http://attacker.localhost:{jp_http_port}"):
            answer = await http.post(
                url, json=INIT, headers={**MCP_HEADERS, **jp_auth_header, "Origin": origin}
            )
            assert answer.status_code in (403, 404), origin
            assert (
                "access-control-allow-origin" not in answer.headers and "mcp-session-id" not in answer.headers
            )
        answer = await http.get(
            url, headers={**jp_auth_header, "Origin": "http://evil.example", "Accept": "text/event-stream"}
        )
        assert answer.status_code in (403, 404)
        # the same request from the server's own origin (or no Origin, as CLI agents send) is served
        same = {**MCP_HEADERS, **jp_auth_header, "Origin": f"http://localhost:{jp_http_port}"}
        answer = await http.post(url, json=INIT, headers=same)
        assert answer.status_code == 200 and answer.headers["mcp-session-id"]
        assert "access-control-allow-origin" not in answer.headers
        # a preflight grants nothing without allow_origin
        answer = await http.options(
            url, headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
        )
        assert "access-control-allow-origin" not in answer.headers


async def test_cookie_authentication_needs_the_xsrf_token(url, jp_serverapp, jp_http_port, jp_base_url):
    """A browser session (the login cookie) may POST only with the XSRF token, as on every Jupyter API."""
    base = f"http://localhost:{jp_http_port}{jp_base_url}"
    async with httpx2.AsyncClient(timeout=30) as http:
        xsrf = (await http.get(base + "login")).cookies.get("_xsrf")
        # a visit with ?token= logs the browser in (the login cookie)
        await http.get(base + "api/status", params={"token": jp_serverapp.identity_provider.token})
        assert any(name.startswith("username-") for name in http.cookies), dict(http.cookies)
        assert xsrf
        headers = {**MCP_HEADERS, "X-Test-User": "alice"}
        without = await http.post(url, json=INIT, headers=headers)
        assert without.status_code == 403 and "mcp-session-id" not in without.headers
        with_xsrf = await http.post(url, json=INIT, headers={**headers, "X-XSRFToken": xsrf})
        assert with_xsrf.status_code == 200, with_xsrf.text
        assert with_xsrf.headers["mcp-session-id"]


async def test_an_mcp_session_id_is_bound_to_its_user(url, as_user):
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(url, json=INIT, headers={**MCP_HEADERS, **as_user("alice")})
        mcp_session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        hijack = await http.post(
            url,
            json=listing,
            headers={
                **MCP_HEADERS,
                **as_user("bob"),
                "Mcp-Session-Id": mcp_session,
                "Mcp-Protocol-Version": "2025-06-18",
            },
        )
        assert hijack.status_code == 404


async def test_the_sdks_default_mode_works_too(url, as_user):
    """The SDK client's default (mode="auto": server/discover, then the 2026 per-request era)."""
    async with mcp_client(url, as_user("alice"), mode="auto") as client:
        assert "session_create" in {t.name for t in (await client.list_tools()).tools}
        sid = data(await client.call_tool("session_create", {}))["id"]
        ran = data(await client.call_tool("session_exec", {"session_id": sid, "argv": ["echo", "modern"]}))
        assert ran["stdout"] == "modern\n"
        await client.call_tool("session_destroy", {"session_id": sid})
