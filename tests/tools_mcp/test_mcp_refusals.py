"""The MCP door's refusals reach the official `mcp` client with their reason, not the SDK's
"Server returned an error response": a wrong token, the Authorizer, the door switched off."""

from __future__ import annotations

import os

import pytest

from tests.support import REPO
from tests.support.live_server import LOCAL_ARGS, LiveServer
from tests.support.mcp import (
    MCP_HEADERS,
    AdminOnlyAdmin,
    HeaderUsers,
    MCPError,
    data,
    httpx2,
    initialize,
    mcp_client,
    mcp_url,
)
from tests.support.server import sandbox_app, server_config

INIT = initialize(7)


class OutsiderRefused(AdminOnlyAdmin):
    """As AdminOnlyAdmin, and 'outsider' may do nothing at all (not even reach the door)."""

    def is_authorized(self, handler, user, action, resource):
        return user.username != "outsider" and super().is_authorized(handler, user, action, resource)


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": OutsiderRefused},
    )


@pytest.fixture
def url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return mcp_url(jp_http_port, jp_base_url)


async def refused(url: str, headers: dict[str, str], mode: str) -> MCPError:
    """The MCPError the SDK's client raises on connecting (initialize) with these headers."""
    with pytest.raises(BaseException) as caught:
        async with mcp_client(url, headers, mode=mode) as client:
            await client.list_tools()
    error = caught.value
    while getattr(error, "exceptions", None) and len(error.exceptions) == 1:  # the SDK's task groups wrap it
        error = error.exceptions[0]
    assert isinstance(error, MCPError), repr(caught.value)
    assert "Server returned an error response" not in str(error)
    return error


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_wrong_token_reaches_the_mcp_client_with_the_reason(url, mode):
    error = await refused(url, {"Authorization": "token wrong"}, mode)
    assert str(error).startswith("SandboxAuthenticationError: the server's token is missing or wrong")
    assert "Authorization: token <TOKEN>" in str(error) and "(HTTP 403)" in str(error)
    assert error.data["error"] == "SandboxAuthenticationError" and error.data["status"] == 403


async def test_no_token_at_all_reaches_the_mcp_client_with_the_reason(url):
    error = await refused(url, {}, "legacy")
    assert "token is missing or wrong" in str(error)


async def test_a_user_the_authorizer_refuses_reads_why_in_the_mcp_client(url, jp_auth_header):
    error = await refused(url, {**jp_auth_header, "X-Test-User": "outsider"}, "legacy")
    assert error.data["status"] == 403
    assert "not authorized" in str(error) and "jupyter_tai_sandbox:sessions" in str(error), str(error)


async def test_the_door_switched_off_reads_why_in_the_mcp_client(url, jp_serverapp, jp_auth_header):
    door = sandbox_app(jp_serverapp).mcp_door
    door.enabled = False
    try:
        error = await refused(url, {**jp_auth_header, "X-Test-User": "alice"}, "auto")
    finally:
        door.enabled = True
    assert str(error).startswith("SandboxUnavailableError: the MCP door is off on this server")
    assert "SandboxMCP.enabled" in str(error) and error.data["status"] == 503
    async with mcp_client(url, {**jp_auth_header, "X-Test-User": "alice"}) as client:  # on again: served
        assert "sessions" in data(await client.call_tool("session_status", {}))


async def test_a_refusal_is_a_json_rpc_error_answering_the_request_id_with_the_http_status(url):
    async with httpx2.AsyncClient(timeout=30) as http:
        answer = await http.post(url, json=INIT, headers={**MCP_HEADERS, "Authorization": "token wrong"})
        assert answer.status_code == 403 and answer.headers["content-type"].startswith("application/json")
        body = answer.json()
        assert body["jsonrpc"] == "2.0" and body["id"] == 7 and body["error"]["code"] == -32600
        assert body["error"]["data"]["error"] == "SandboxAuthenticationError"
        assert (
            "www-authenticate" not in answer.headers
        )  # no 401 challenge: OAuth clients would start discovery
        # a body that is not JSON-RPC: the error still is, answering id null
        answer = await http.post(
            url, content=b"{not json", headers={**MCP_HEADERS, "Authorization": "token wrong"}
        )
        assert answer.status_code == 403 and answer.json()["id"] is None


async def test_without_the_mcp_package_the_client_reads_what_to_install(tmp_path):
    """A server whose Python cannot import `mcp` (hidden by a package of that name that fails to import):
    the SDK client, here, reads the 503's reason, which names the extra to install."""
    shadow = tmp_path / "shadow" / "mcp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("mcp is hidden from this server by the test")\n')
    live = LiveServer(
        tmp_path,
        args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}"),
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent), str(REPO)]))},
    ).start()
    try:
        error = await refused(f"{live.url}api/sandbox/mcp", {"Authorization": f"token {live.token}"}, "auto")
    finally:
        live.stop()
    assert str(error).startswith("SandboxUnavailableError: the MCP door needs the `mcp` package"), str(error)
    assert "pip install 'jupyter-tai-sandbox[mcp]'" in str(error) and error.data["status"] == 503
