"""The MCP door's session_port_url: a session port's preview URL (a path on the server with its base URL, no
token) and whether something listens there, by the REST door's rules (another user's session: not found; a
local session: refused, typed). Driven by the official `mcp` client against a live jupyter_server."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from tests.support.mcp import AdminOnlyAdmin, HeaderUsers, data, mcp_client, mcp_url, refusal
from tests.support.server import server_config

pytest.importorskip("mcp")

USERS = {"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin}


@pytest.fixture
def url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return mcp_url(jp_http_port, jp_base_url)


@pytest.fixture
def as_user(jp_auth_header):
    return lambda name: {**jp_auth_header, "X-Test-User": name}


@pytest.mark.docker
class TestDocker:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        from tests.support.docker import python_image

        python_image().close()
        return server_config(
            "docker",
            tmp_path / "sandboxes",
            ServerApp=USERS,
            DockerSandbox={"allowed_images": [PYTHON_IMAGE]},
        )

    async def test_the_url_of_a_port_and_whether_it_listens(self, url, as_user, jp_base_url):
        async with mcp_client(url, as_user("alice")) as alice, mcp_client(url, as_user("bob")) as bob:
            tools = {tool.name: tool for tool in (await alice.list_tools()).tools}
            assert tools["session_port_url"].input_schema["required"] == ["session_id", "port"]
            sid = data(await alice.call_tool("session_create", {"network": "none", "image": PYTHON_IMAGE}))[
                "id"
            ]
            try:
                before = data(await alice.call_tool("session_port_url", {"session_id": sid, "port": 8000}))
                path = f"{jp_base_url.rstrip('/')}/api/sandbox/sessions/{sid}/ports/8000/"
                assert before == {
                    "session_id": sid,
                    "port": 8000,
                    "url": path,
                    "listening": False,
                    "address": None,
                }
                started = data(
                    await alice.call_tool(
                        "session_exec",
                        {
                            "session_id": sid,
                            "script": "setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &",
                        },
                    )
                )
                assert started["exit_code"] == 0, started
                give_up = time.monotonic() + 30
                while True:
                    answer = data(
                        await alice.call_tool(
                            "session_port_url",
                            {"session_id": sid, "port": 8000, "path": "/a?b=1", "absolute": True},
                        )
                    )
                    if answer["listening"] or time.monotonic() > give_up:
                        break
                    await asyncio.sleep(0.3)
                assert answer["listening"] is True and answer["address"] == "0.0.0.0", answer
                assert answer["url"] == path.replace("/ports/", "/absolute-ports/") + "a?b=1"
                assert "token" not in str(answer)
                theirs = refusal(await bob.call_tool("session_port_url", {"session_id": sid, "port": 8000}))
                assert theirs["error"] == "SandboxNotFoundError", theirs
                bad = refusal(await alice.call_tool("session_port_url", {"session_id": sid, "port": 70000}))
                assert bad["error"] == "ToolInputError", bad
            finally:
                await alice.call_tool("session_destroy", {"session_id": sid})


class TestLocal:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("local", tmp_path / "sandboxes", ServerApp=USERS)

    async def test_a_local_session_is_refused_typed(self, url, as_user):
        async with mcp_client(url, as_user("alice")) as alice:
            sid = data(await alice.call_tool("session_create", {}))["id"]
            refused = refusal(await alice.call_tool("session_port_url", {"session_id": sid, "port": 8000}))
            assert refused["error"] == "SandboxUnsupportedError" and refused["operation"] == "ports", refused
            assert "server's own host" in refused["message"]
