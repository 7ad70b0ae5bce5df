"""The MCP door over the docker provider: one session, a command and a file, through the real client."""

from __future__ import annotations

import pytest

from tests.support.mcp import data, mcp_client, mcp_url, refusal
from tests.support.server import server_config

pytestmark = [pytest.mark.docker]


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("docker", tmp_path / "sandboxes", SandboxPolicy={"isolation": "container"})


async def test_a_docker_session_over_mcp(
    jp_serverapp, http_server, jp_http_port, jp_base_url, jp_auth_header
):
    url = mcp_url(jp_http_port, jp_base_url)
    async with mcp_client(url, jp_auth_header) as client:
        info = data(await client.call_tool("session_create", {"network": "none"}))
        assert info["kind"] == "docker" and info["isolation"] == "container"
        sid = info["id"]
        try:
            data(
                await client.call_tool(
                    "session_write_file", {"session_id": sid, "path": "in.txt", "content": "inside\n"}
                )
            )
            ran = data(await client.call_tool("session_exec", {"session_id": sid, "argv": ["cat", "in.txt"]}))
            assert (ran["exit_code"], ran["stdout"]) == (0, "inside\n")
            started = data(
                await client.call_tool(
                    "session_exec_start",
                    {"session_id": sid, "script": "echo a; sleep 0.5; echo b", "timeout_seconds": 20},
                )
            )
            offset, text = 0, ""
            while True:
                answer = data(
                    await client.call_tool(
                        "session_exec_poll",
                        {"handle": started["handle"], "offset": offset, "wait_seconds": 5},
                    )
                )
                text += "".join(o["text"] for o in answer["output"])
                offset = answer["next_offset"]
                if not answer["running"] and not answer["more"]:
                    break
            assert (text, answer["exit_code"]) == ("a\nb\n", 0)
            assert data(await client.call_tool("session_pause", {"session_id": sid}))["paused"] is True
            refused = refusal(await client.call_tool("session_exec", {"session_id": sid, "argv": ["true"]}))
            assert refused["error"] == "SandboxConflictError" and "paused" in refused["message"]
            assert data(await client.call_tool("session_resume", {"session_id": sid}))["paused"] is False
            fork = data(await client.call_tool("session_fork", {"session_id": sid}))["id"]
            try:  # a docker fork keeps the workspace's files
                ran = data(
                    await client.call_tool("session_exec", {"session_id": fork, "argv": ["cat", "in.txt"]})
                )
                assert (ran["exit_code"], ran["stdout"]) == (0, "inside\n") and fork != sid
            finally:
                data(await client.call_tool("session_destroy", {"session_id": fork}))
            ran = data(await client.call_tool("session_exec", {"session_id": sid, "argv": ["cat", "in.txt"]}))
            assert ran["stdout"] == "inside\n"
        finally:
            data(await client.call_tool("session_destroy", {"session_id": sid}))
