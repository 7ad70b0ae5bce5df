"""What the packaging tests share: a clean clone of this checkout, a fresh venv, a PATH without Go or
Node.js, and one docker session driven over a live server's REST API."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.docker import in_ci
from tests.support.live_server import LiveServer


def clean_clone(dest: Path) -> Path:
    """``git clone`` of this checkout's HEAD into ``dest``: committed files only, no build output, no
    node_modules, no agent binaries."""
    if not (REPO / ".git").exists():
        if in_ci():
            pytest.fail(f"{REPO} is not a git checkout: the packaging tests build from a clean clone of it")
        pytest.skip(f"{REPO} is not a git checkout: the packaging tests build from a clean clone of it")
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True, timeout=120
    )
    built = [
        p
        for p in ("jupyter_tai_sandbox/agent/bin", "jupyter_tai_sandbox/labextension")
        if (dest / p).exists()
    ]
    assert not built, f"a clean clone holds build output: {built}"
    return dest


def fresh_venv(dest: Path) -> Path:
    """A new virtual environment (this Python's, with its own pip and nothing else); its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True, timeout=180)
    return dest / "bin"


def only_these_tools(folder: Path, tools: Iterable[str], *first: Path) -> str:
    """A PATH of ``first`` then ``folder``, which holds symlinks to these tools of this machine only;
    asserts it finds neither ``go`` nor ``node``."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        found = shutil.which(tool)
        assert found, f"{tool} is not on this machine's PATH"
        (folder / tool).symlink_to(found)
    path = os.pathsep.join([*map(str, first), str(folder)])
    assert shutil.which("go", path=path) is None and shutil.which("node", path=path) is None, path
    return path


def without_go(path: str) -> str:
    """``path`` without its folders that hold a ``go`` command (a user with no Go installed)."""
    return os.pathsep.join(
        d for d in path.split(os.pathsep) if d and not os.path.exists(os.path.join(d, "go"))
    )


def installed_agent_binary(venv_bin: Path, env: dict[str, str], cwd: Path) -> str:
    """Where the venv's package finds its agent binary (run by the venv's own Python, under ``env``)."""
    where = subprocess.run(
        [str(venv_bin / "python"), "-c", "from jupyter_tai_sandbox.agent import agent_binary; print(agent_binary())"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert where.returncode == 0, where
    return where.stdout.strip()


def serve_one_docker_session(tmp_path: Path, venv_bin: Path, env: dict[str, str], *args: str) -> LiveServer:
    """A server of the venv's package, on the docker provider and under ``env`` only (no Python, Go or Node.js
    variables of this process), runs one session (:func:`docker_session_runs_a_command`); stopped after."""
    server = LiveServer(
        tmp_path, python=str(venv_bin / "python"), keep_sandbox_env=True, env=env,
        args=("--SandboxApp.provider=docker", *args),
    )  # fmt: skip
    server.env = {
        k: v for k, v in server.env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "GO", "NODE"))
    }
    server.start(wait=120)
    try:
        docker_session_runs_a_command(server)
    finally:
        server.stop()
    return server


def docker_session_runs_a_command(server: LiveServer) -> None:
    """Over ``server``'s REST API (a LiveServer): the provider is docker and ready, a session is created, runs
    a command whose output comes back, and is destroyed."""
    status, body = server.call("GET", "status")
    assert status == 200, (status, body, server.log())
    assert body["kind"] == "docker", body
    status, session = server.call("POST", "sessions", {"ttl_seconds": 300})
    assert status == 201, (status, session, server.log())
    assert session["kind"] == "docker", session
    sid = session["id"]
    try:
        status, result = server.call(
            "POST", f"sessions/{sid}/exec",
            {"argv": ["sh", "-c", "echo hello from $(uname -s) in $PWD; exit 3"], "timeout_seconds": 60},
        )  # fmt: skip
        assert status == 200, (status, result, server.log())
        assert (result["exit_code"], result["stdout"], result["stderr"]) == (
            3,
            "hello from Linux in /workspace\n",
            "",
        )
    finally:
        status, body = server.call("DELETE", f"sessions/{sid}")
    assert status == 204, (status, body)
    status, body = server.call("GET", f"sessions/{sid}")
    assert status == 404 and sid in body["message"], (status, body)  # gone, whichever 404 says so
