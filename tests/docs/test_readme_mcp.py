"""The MCP page (docs/users/mcp.md): its Python client example, found by its label, runs as written against
a live server with the pinned `mcp` SDK, and the tools it lists are the ones the door registers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from jupyter_tai_sandbox.magics.options import DEFAULT_TIMEOUT, DEFAULT_TTL
from jupyter_tai_sandbox.mcp_door.tool_specs import DOOR_TOOLS
from jupyter_tai_sandbox.tools import BASE_TOOLS
from tests.support.doc_blocks import block, passage
from tests.support.live_server import LOCAL_ARGS, LiveServer

pytest.importorskip("mcp")

MCP_PAGE = "users/mcp.md"


def mcp_example() -> str:
    """The page's Python client (``<!-- example: mcp-python -->``)."""
    return block(MCP_PAGE, "mcp-python")


def page_tool_names() -> set[str]:
    """The tools the page lists (``<!-- begin: mcp-tools -->``), presets aside."""
    bullets = passage(MCP_PAGE, "mcp-tools")
    assert bullets.startswith("- "), bullets
    return set(re.findall(r"`((?:session|sandbox|preset)_[a-z_]+)`", bullets))


def test_the_pages_tool_list_is_the_tools_the_door_registers():
    assert page_tool_names() == set(DOOR_TOOLS) | set(BASE_TOOLS)
    assert "session_fork" in page_tool_names()


def test_the_pages_mcp_python_example_runs_as_written_against_a_live_server(tmp_path):
    live = LiveServer(tmp_path, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}")).start()
    try:
        script = tmp_path / "mcp_example.py"
        script.write_text(mcp_example())
        env = {**os.environ, "JUPYTER_URL": live.url, "JUPYTER_TOKEN": live.token}
        ran = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert ran.returncode == 0, ran.stderr
        listed, executed = ran.stdout.splitlines()
        assert set(listed.split()) == page_tool_names()  # what the live door lists is what the page says
        assert executed == "0 hello"
        assert live.session_ids() == set()  # the example destroyed its session
        # the same example with a wrong token: the SDK's exception names the reason
        env["JUPYTER_TOKEN"] = "wrong"
        refused = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert refused.returncode != 0
        assert (
            "MCPError: SandboxAuthenticationError: the server's token is missing or wrong" in refused.stderr
        )
    finally:
        live.stop()


def test_the_page_says_to_restart_the_server_after_installing_the_extra():
    said = " ".join(passage(MCP_PAGE, "mcp-install").split())
    assert 'pip install -e ".[mcp]"' in said and "restart the Jupyter server" in said


def test_the_magics_page_gives_the_magics_default_ttl_and_timeout():
    options = " ".join(passage("users/magics.md", "magics-options").split())
    assert f"lives {DEFAULT_TTL / 3600:g} h unless `--ttl`" in options
    assert DEFAULT_TIMEOUT == 3600 and "the command's deadline (default one hour)" in options


def test_the_pages_agent_host_config_is_json_naming_the_door_and_the_token_header():
    config = json.loads(block(MCP_PAGE, "mcp-claude-code"))
    (server,) = config["mcpServers"].values()
    assert server["type"] == "http" and server["url"].endswith("/api/sandbox/mcp"), server
    assert server["headers"] == {"Authorization": "token ${JUPYTER_TOKEN}"}, server
