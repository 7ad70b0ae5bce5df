"""The MCP door's egress: session_set_egress changes a running session's policy through the gate (over the
operator's ceiling: refused naming the entry; a provider without a gateway: refused in its words; another
user's session: not found), and session_create takes an egress policy but never a secret. Driven by the
official `mcp` client against a live jupyter_server (local provider, users by header)."""

from __future__ import annotations

import pytest

from tests.support.mcp import AdminOnlyAdmin, HeaderUsers, data, mcp_client, mcp_url, refusal
from tests.support.server import sandbox_app, server_config

pytest.importorskip("mcp")


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={"egress_audit_path": ""},
    )


@pytest.fixture
def url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return mcp_url(jp_http_port, jp_base_url)


@pytest.fixture
def as_user(jp_auth_header):
    return lambda name: {**jp_auth_header, "X-Test-User": name}


async def test_set_egress_goes_through_the_gate(url, as_user, jp_serverapp):
    async with mcp_client(url, as_user("alice")) as alice, mcp_client(url, as_user("bob")) as bob:
        tools = {tool.name: tool for tool in (await alice.list_tools()).tools}
        assert tools["session_set_egress"].input_schema["required"] == ["session_id"]
        sid = data(await alice.call_tool("session_create", {}))["id"]
        refused = refusal(
            await alice.call_tool("session_set_egress", {"session_id": sid, "allow": ["pypi.org"]})
        )
        assert refused["error"] == "SandboxSpecRejectedError"
        assert "the local provider cannot change a session's egress policy" in refused["message"]
        sandbox_app(jp_serverapp).policy.egress_rules = {"*": {"allow": ["pypi.org"]}}
        over = refusal(
            await alice.call_tool("session_set_egress", {"session_id": sid, "allow": ["github.com"]})
        )
        assert "egress allow entry 'github.com' is over the operator's ceiling" in over["message"]
        bad = refusal(await alice.call_tool("session_set_egress", {"session_id": sid, "deny": ["10.0.0.1"]}))
        assert "IP literal" in bad["message"]
        theirs = refusal(
            await bob.call_tool("session_set_egress", {"session_id": sid, "allow": ["pypi.org"]})
        )
        assert theirs["error"] == "SandboxNotFoundError"


async def test_create_takes_a_policy_but_never_a_secret(url, as_user):
    async with mcp_client(url, as_user("alice")) as alice:
        refused = refusal(await alice.call_tool("session_create", {"egress": {"allow": ["pypi.org"]}}))
        assert "the local provider runs on the host's network" in refused["message"]
        secret = refusal(await alice.call_tool("session_create", {"egress": {"secrets": [{"name": "x"}]}}))
        assert secret["error"] in ("ToolInputError", "SandboxSpecRejectedError"), secret
