"""A command the kernel's OOM killer ends in a docker session with a memory limit says so (issue 48): "killed: out
of memory (the session's limit is N MiB)" as the one-shot's ``reason`` (REST and the Python client), the websocket's
exit message and the MCP tool's result, on a real engine; a SIGKILL that is not the OOM killer's says nothing more."""

from __future__ import annotations

import json

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from tests.support.mcp import data, mcp_client, mcp_url
from tests.support.server import call, exec_call, read_all, server_config

pytestmark = pytest.mark.docker

LIMIT_MB = 32
#: one process that grows past a 32 MiB limit (no swap: memswap_limit is the same) until the OOM killer takes
#: it (a pipeline's smaller member could be taken first, leaving the shell to go on)
HOG = ["sh", "-c", "x=a; while :; do x=$x$x; done; echo survived"]
REASON = f"killed: out of memory (the session's limit is {LIMIT_MB} MiB)"


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("docker", tmp_path / "sandboxes")


async def limited_session(jp_fetch) -> str:
    status, info = await call(
        jp_fetch,
        "sessions",
        method="POST",
        body={"ttl_seconds": 300, "memory_mb": LIMIT_MB, "network": "none"},
    )
    assert status == 201, info
    assert info["spec"]["memory_mb"] == LIMIT_MB, info
    return info["id"]


async def test_an_out_of_memory_kill_says_so_in_the_one_shot_result_and_the_websocket_exit(
    jp_fetch, jp_ws_fetch
):
    session_id = await limited_session(jp_fetch)
    try:
        status, result = await exec_call(jp_fetch, session_id, HOG, 60)
        assert status == 200, result
        assert result["exit_code"] == 137 and result["reason"] == REASON, result
        assert "survived" not in result["stdout"]

        ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws")
        await ws.write_message(json.dumps({"type": "start", "argv": HOG, "timeout_seconds": 60}))
        _, _, final, _ = await read_all(ws, 60)
        assert final == {"type": "exit", "exit_code": 137, "reason": REASON}, final

        # a SIGKILL that is not the OOM killer's: the status alone, no reason
        status, result = await exec_call(jp_fetch, session_id, ["sh", "-c", "kill -9 $$"], 30)
        assert status == 200 and result["exit_code"] == 137 and "reason" not in result, result
        status, result = await exec_call(jp_fetch, session_id, ["sh", "-c", "echo fine"], 30)
        assert result == {"exit_code": 0, "encoding": "utf-8", "stdout": "fine\n", "stderr": ""}, result
    finally:
        await call(jp_fetch, "sessions", session_id, method="DELETE")


async def test_the_python_client_carries_the_out_of_memory_reason(
    jp_fetch, jp_serverapp, jp_http_port, jp_base_url, jp_auth_header
):
    session_id = await limited_session(jp_fetch)
    token = jp_auth_header["Authorization"].split()[-1]
    client = SandboxClient(f"http://localhost:{jp_http_port}{jp_base_url}", token=token)
    try:
        result = await client.exec(session_id, HOG, timeout_seconds=60)
        assert (result.exit_code, result.reason) == (137, REASON), result
    finally:
        await client.aclose()
        await call(jp_fetch, "sessions", session_id, method="DELETE")


async def test_an_out_of_memory_kill_says_so_in_the_mcp_tool_result(
    jp_serverapp, http_server, jp_http_port, jp_base_url, jp_auth_header
):
    url = mcp_url(jp_http_port, jp_base_url)
    async with mcp_client(url, jp_auth_header) as client:
        info = data(await client.call_tool("session_create", {"network": "none", "memory_mb": LIMIT_MB}))
        sid = info["id"]
        try:
            ran = data(
                await client.call_tool(
                    "session_exec", {"session_id": sid, "argv": HOG, "timeout_seconds": 60}
                )
            )
            assert (ran["exit_code"], ran["reason"]) == (137, REASON), ran
        finally:
            data(await client.call_tool("session_destroy", {"session_id": sid}))
