"""The lines only a door sees, or another sink feeds: an MCP tool call refused (door mcp), and each egress
gateway line (through the policy's egress audit, as a provider's pump hands it over) as an egress line."""

from __future__ import annotations

import pytest

from tests.audit.conftest import flushed_lines
from tests.support.server import call, sandbox_app
from tests.support.users import as_user


@pytest.fixture
def provider() -> str:
    return "local"


async def test_an_mcp_refusal_is_logged_with_its_door(
    jp_serverapp, http_server, jp_http_port, jp_base_url, jp_auth_header
):
    from tests.support.mcp import data, mcp_client, mcp_url, refusal

    url = mcp_url(jp_http_port, jp_base_url)
    async with mcp_client(url, {**jp_auth_header, **as_user("alice")}) as alice:
        sid = data(await alice.call_tool("session_create", {}))["id"]
        async with mcp_client(url, {**jp_auth_header, **as_user("bob")}) as bob:
            refused = refusal(await bob.call_tool("session_exec", {"session_id": sid, "argv": ["true"]}))
            assert refused["error"] == "SandboxNotFoundError"
        await alice.call_tool("session_destroy", {"session_id": sid})
    lines = flushed_lines(jp_serverapp)
    refusal_line = next(line for line in lines if line["kind"] == "refusal")
    assert refusal_line["owner"] == "bob" and refusal_line["session"] == sid
    assert refusal_line["data"]["door"] == "mcp" and refusal_line["data"]["request"] == "tool session_exec"
    kinds = [line["kind"] for line in lines if line["session"] == sid]
    assert kinds[0] == "session.create" and kinds[-1] == "session.destroy"


async def test_an_egress_gateway_line_is_an_egress_line_and_the_egress_audit_route_still_answers(
    jp_fetch, jp_serverapp
):
    app = sandbox_app(jp_serverapp)
    record = {
        "time": "2026-12-05T10:00:00Z",
        "deployment": "d",
        "owner": "alice",
        "session": "sbx-1234567890abcdef",
        "kind": "http",
        "host": "pypi.org",
        "port": 443,
        "decision": "refuse",
        "reason": "not in the allow list",
    }
    app.policy.egress_audit.audit(record)  # what a provider's pump does with each gateway line
    lines = [line for line in flushed_lines(jp_serverapp) if line["kind"] == "egress"]
    assert len(lines) == 1
    assert lines[0]["owner"] == "alice" and lines[0]["session"] == "sbx-1234567890abcdef"
    assert lines[0]["data"]["record"] == record
    status, body = await call(jp_fetch, "egress", "audit", headers=as_user("alice"))
    assert status == 200 and body["lines"] == [record]
    status, body = await call(jp_fetch, "audit", params={"kind": "egress"}, headers=as_user("alice"))
    assert status == 200 and [line["data"]["record"] for line in body["lines"]] == [record]


async def test_an_admins_websocket_on_another_users_session_is_an_admin_line(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    import json

    from tests.support.server import read_all

    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60}, headers=as_user("alice")
    )
    assert status == 201, info
    ws = await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws", headers=as_user("admin"))
    await ws.write_message(json.dumps({"type": "start", "argv": ["true"], "timeout_seconds": 10}))
    assert (await read_all(ws))[2] == {"type": "exit", "exit_code": 0}
    lines = [line for line in flushed_lines(jp_serverapp) if line["session"] == info["id"]]
    admin = next(line for line in lines if line["kind"] == "admin")
    assert (
        admin["owner"] == "alice" and admin["actor"] == "admin" and admin["data"]["action"].startswith("GET ")
    )
    opened = next(line for line in lines if line["kind"] == "terminal.open")
    assert opened["owner"] == "alice" and opened["actor"] == "admin"
