"""README's MCP section: its Python client example runs as written against a live server with the pinned
`mcp` SDK, and the tools it lists are the ones the door registers."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from jupyter_tai_sandbox.magics.options import DEFAULT_TIMEOUT, DEFAULT_TTL
from jupyter_tai_sandbox.mcp_door.tool_specs import DOOR_TOOLS
from jupyter_tai_sandbox.tools import BASE_TOOLS
from tests.support import REPO
from tests.support.live_server import LOCAL_ARGS, LiveServer

pytest.importorskip("mcp")

README = REPO / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def mcp_example() -> str:
    """The one Python block of README's MCP section."""
    blocks = re.findall(r"```python\n(.*?)```", section("The MCP door"), flags=re.S)
    assert len(blocks) == 1, blocks
    return blocks[0]


def readme_tool_names() -> set[str]:
    """The tools README's MCP section lists (the bullets after 'Agents get:'), presets aside."""
    door = section("The MCP door")
    after = door[door.index("Agents get:") + len("Agents get:") :].lstrip("\n")
    bullets = after[: after.index("\n\n")]
    assert bullets.startswith("- "), bullets
    return set(re.findall(r"`((?:session|sandbox|preset)_[a-z_]+)`", bullets))


def test_readmes_tool_list_is_the_tools_the_door_registers():
    assert readme_tool_names() == set(DOOR_TOOLS) | set(BASE_TOOLS)
    assert "session_fork" in readme_tool_names()


def test_readmes_mcp_python_example_runs_as_written_against_a_live_server(tmp_path):
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
        assert set(listed.split()) == readme_tool_names()  # what the live door lists is what README says
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


def test_readmes_mcp_section_says_to_restart_the_server_after_installing_the_extra():
    door = section("The MCP door")
    assert 'pip install -e ".[mcp]"' in door and "restart\nthe Jupyter server" in door


def test_readme_gives_the_magics_default_ttl_and_timeout():
    magics = section("Notebook magics")
    assert f"lives {DEFAULT_TTL / 3600:g} h unless `--ttl`" in magics
    assert DEFAULT_TIMEOUT == 3600 and "the command's deadline (default one hour)" in magics
