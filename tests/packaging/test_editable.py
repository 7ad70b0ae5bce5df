"""`pip install -e ".[docker]"` on a clean clone builds the session agent (and the panel) in the checkout, and
the editable install runs docker sessions with them, on a PATH with no Go and no Node.js at run time.

(`python -m build` is tests/packaging/test_wheel.py's; `pip install .` is README's, in
tests/packaging/test_readme_docker.py.)
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.packaging import (
    clean_clone,
    fresh_venv,
    installed_agent_binary,
    only_these_tools,
    serve_one_docker_session,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow(90), pytest.mark.timeout(600)]


def test_an_editable_install_of_a_clean_clone_builds_the_agent_and_runs_docker_sessions(tmp_path):
    from tests.support.docker import docker_client

    docker_client()
    clone = clean_clone(tmp_path / "clone")
    venv_bin = fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    installed = subprocess.run(
        [str(venv_bin / "pip"), "install", "--quiet", "-e", f"{clone}[docker]"],
        env=env, capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-4000:]
    bin_dir = clone / "jupyter_tai_sandbox" / "agent" / "bin"
    for arch in ("amd64", "arm64"):
        assert (bin_dir / f"tai-agent-linux-{arch}").read_bytes()[:4] == b"\x7fELF"
        assert (bin_dir / f"tai-agent-linux-{arch}.sha256").is_file()
    assert (clone / "jupyter_tai_sandbox" / "labextension" / "static" / "style.js").is_file()

    path = only_these_tools(tmp_path / "tools", (), venv_bin)
    run_env = {"PATH": path, "HOME": str(tmp_path / "home")}
    # the checkout's binary, built in place
    assert installed_agent_binary(venv_bin, run_env, tmp_path) == str(bin_dir / "tai-agent-linux-amd64")
    serve_one_docker_session(tmp_path, venv_bin, run_env)
