"""Issue 25 point 8: the hint that lowers the isolation floor is valid for the door it is shown in.

The server's doors (REST, the panel's status, the server's log) name the server's option
(``--SandboxPolicy.isolation=none`` or ``TAI_MCP_SANDBOX_ISOLATION=none``); ``jupyter tai-sandbox
preset run`` names its own flag (``--isolation none``), which is all that command takes; a sandboxed
kernel a client starts outside any server (a blocking KernelManager script, ``jupyter console``)
names what that client reads (the environment, a jupyter_server_config file), never a server flag.
The panel's door is tested in a browser (tests/panel/test_panel_browser.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jupyter_tai_sandbox import cli, sandboxes
from jupyter_tai_sandbox.contract import ISOLATION_FLOOR_HINTS, SandboxSpecRejectedError, SessionSpec
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support import REPO

PACKAGE = REPO / "jupyter_tai_sandbox"
SERVER_HINT = "--SandboxPolicy.isolation=none or TAI_MCP_SANDBOX_ISOLATION=none"
ECHO = {
    "description": "Echo a word.",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    "binding": {"argv": ["echo", {"field": "word"}], "timeout_seconds": 30},
}


def test_the_floor_hints_are_made_in_one_table():
    """No other module spells a hint of its own (each would have to be checked for its door)."""
    makers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "--SandboxPolicy.isolation=" in path.read_text()
        or "TAI_MCP_SANDBOX_ISOLATION=" in path.read_text()
    )
    assert makers == ["contract/errors.py"], makers
    assert set(ISOLATION_FLOOR_HINTS) == {"server", "cli", "kernel"}


def test_the_server_door_names_the_server_option(tmp_path):
    gated = sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=SandboxPolicy(isolation="container")
    )
    with pytest.raises(SandboxSpecRejectedError) as caught:
        asyncio.run(gated.create(SessionSpec(ttl_seconds=60)))
    assert f"({SERVER_HINT})" in str(caught.value), str(caught.value)
    assert "--isolation none" not in str(caught.value)

    # the status the panel reads says it before any create, in the server's words
    status = sandboxes.status_info()
    assert SERVER_HINT in status["create_refused"], status
    assert "restart the server" in status["create_refused"]
    sandboxes.use_policy(SandboxPolicy(isolation="none"))
    assert "create_refused" not in sandboxes.status_info()


def test_the_server_log_names_the_server_option():
    message = sandboxes.floor_refusal("local", "container", "none")
    assert message is not None and SERVER_HINT in message, message
    assert sandboxes.floor_refusal("local", "none", "none") is None
    assert sandboxes.floor_refusal("docker", "container", "container") is None


def test_the_cli_door_names_its_own_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path / "sbx"))
    store = tmp_path / "p.json"
    (tmp_path / "echo.json").write_text(json.dumps(ECHO))
    assert (
        cli.main(["preset", "--store", str(store), "add", str(tmp_path / "echo.json"), "--name", "echo"]) == 0
    )
    capsys.readouterr()
    run = ["preset", "--store", str(store), "run", "echo", "--provider", "local", "--input", '{"word": "hi"}']
    assert cli.main(run) == cli.RUN_FAILED
    err = capsys.readouterr().err
    assert "(--isolation none)" in err, err
    assert "SandboxPolicy.isolation=" not in err and "TAI_MCP_SANDBOX_ISOLATION" not in err, err
    # and the hint works there as it says
    assert cli.main([*run, "--isolation", "none"]) == 0
    assert capsys.readouterr().out == "hi\n"


START_OUTSIDE_A_SERVER = textwrap.dedent(
    """
    import sys
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name=sys.argv[1])
    try:
        km.start_kernel()
    except Exception as e:
        print("FAILED", type(e).__name__)
        print(str(e))
    else:
        km.shutdown_kernel(now=True)
        print("STARTED")
    """
)


def test_a_kernel_started_outside_a_server_names_what_its_client_reads(tmp_path):
    """A blocking KernelManager in a script of its own: no server option could lower its floor."""
    prefix = tmp_path / "prefix"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAI_MCP_", "SANDBOX_", "JUPYTER_"))}
    env.update(
        JUPYTER_PATH=str(prefix / "share" / "jupyter"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_CONFIG_PATH=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        SANDBOX_LOCAL_ROOT=str(tmp_path / "root"),
    )
    install = subprocess.run(
        [sys.executable, "-m", "jupyter_tai_sandbox.cli", "kernelspec", "install", "--name", "floor-hint",
         "--prefix", str(prefix), "--provider", "local"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    script = tmp_path / "start.py"
    script.write_text(START_OUTSIDE_A_SERVER)
    done = subprocess.run(
        [sys.executable, str(script), "floor-hint"], env=env, capture_output=True, text=True, timeout=180
    )
    out = done.stdout
    assert out.startswith("FAILED"), out + done.stderr
    text = " ".join(out.split())  # the kernel's error comes in lines of 72 characters
    assert "TAI_MCP_SANDBOX_ISOLATION=none" in text and "jupyter_server_config" in text, out
    assert "--SandboxPolicy.isolation" not in text and "--isolation none" not in text, out
    assert all(len(line) <= 72 for line in out.splitlines()[1:]), out
