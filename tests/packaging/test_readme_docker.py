"""README's docker commands, typed literally, give a working docker session.

The two commands are README's block labelled ``<!-- example: docker-commands -->`` (the same block as the
quickstart page's, which a test checks) and run by bash as written, in a ``git clone`` of this checkout's HEAD, with a fresh venv's bin first
on PATH (a user who made and activated one) and no Go on PATH at all (Node.js stays: README says the panel's
build needs it). What the test adds, and only to place the server, by one rule: after the second command's
``jupyter lab`` it appends ``--no-browser``, ``--ip=127.0.0.1``, a free ``--port`` (with
``--ServerApp.port_retries=0``), a known ``--IdentityProvider.token``, and ``--allow-root`` when the test runs
as root (README says to add it then). Jupyter's config, data and runtime folders are temporary ones
(``JUPYTER_CONFIG_DIR``...), and the run's ``TAI_SANDBOX_DEPLOYMENT`` is in the environment, so the server
stays apart from others on the shared engine. Then a session is created over REST, runs a command and is
destroyed, and JupyterLab is stopped with SIGTERM, as Ctrl-C would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.doc_blocks import README, block
from tests.support.live_server import LiveServer
from tests.support.packaging import clean_clone, docker_session_runs_a_command, fresh_venv, without_go

pytestmark = [pytest.mark.docker, pytest.mark.slow(170), pytest.mark.timeout(600)]


def readme_docker_commands() -> list[str]:
    """README's labelled docker block (``<!-- example: docker-commands -->``): its command lines."""
    lines = [line for line in block(README, "docker-commands").splitlines() if line.strip()]
    assert any(".[docker]" in line for line in lines), lines
    return lines


def test_the_quickstart_page_gives_readmes_commands():
    for label in ("docker-commands", "local-command"):
        assert block("users/quickstart.md", label) == block(README, label), label


def test_readme_has_two_docker_commands_install_then_images_and_lab():
    install, run = readme_docker_commands()
    assert install.startswith("pip install ") and '".[docker]"' in install and "jupyterlab" in install
    assert "jupyter tai-sandbox build-image" in run and re.search(r"(^|&& )jupyter lab [^&|;]*$", run), run
    assert "--SandboxApp.provider=docker" in run


def _get(server: LiveServer, path: str) -> bytes:
    request = urllib.request.Request(server.url + path, headers={"Authorization": f"token {server.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200, (path, response.status)
        return response.read()


class TypedLab(LiveServer):
    """README's second command line run by bash, with the placement options appended to its ``jupyter lab``."""

    def __init__(self, tmp: Path, line: str, *, cwd: Path, env: dict[str, str]) -> None:
        super().__init__(tmp, env=env, keep_sandbox_env=True, log_name="lab.log")
        placement = ["--no-browser", "--ip=127.0.0.1", f"--port={self.port}", "--ServerApp.port_retries=0",
                     f"--IdentityProvider.token={self.token}"]  # fmt: skip
        if os.geteuid() == 0:
            placement.append("--allow-root")
        self.line = f"{line} {' '.join(placement)}"
        self.cwd = cwd

    def start(self, wait: float = 180) -> TypedLab:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            ["bash", "-c", self.line], env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.close_log()
                raise AssertionError(f"`{self.line}` exited {self.process.returncode}:\n{self.log()}")
            try:
                self.request("GET", "api/status")
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"`{self.line}` did not answer within {wait} s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.close_log()


def test_readme_docker_commands_typed_literally_give_a_working_docker_session(tmp_path):
    from tests.support.docker import docker_client

    docker_client()  # an engine that answers, as README's commands assume (skips without one, fails in CI)
    install, run = readme_docker_commands()
    clone = clean_clone(tmp_path / "clone")
    venv_bin = fresh_venv(tmp_path / "venv")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "GO", "JUPYTER"))
    }
    env.update(
        PATH=os.pathsep.join([str(venv_bin), without_go(os.environ["PATH"])]), VIRTUAL_ENV=str(venv_bin.parent),
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
    )  # fmt: skip
    probe = subprocess.run(
        ["bash", "-c", "command -v go; command -v pip"], env=env, capture_output=True, text=True
    )
    assert probe.stdout.strip() == str(venv_bin / "pip"), probe.stdout  # no go; the venv's pip

    installed = subprocess.run(
        ["bash", "-c", install], env=env, cwd=clone, capture_output=True, text=True, timeout=480
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]

    lab = TypedLab(tmp_path, run, cwd=clone, env=env).start()
    try:
        docker_session_runs_a_command(lab)
        # JupyterLab serves the panel: its page names the extension, whose entry point loads
        page = _get(lab, "lab").decode()
        config = re.search(
            r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S
        )
        assert config, page[:3000]
        (panel,) = [
            e
            for e in json.loads(config.group(1))["federated_extensions"]
            if e["name"] == "jupyter-tai-sandbox"
        ]
        assert b"jupyter-tai-sandbox" in _get(lab, f"lab/extensions/jupyter-tai-sandbox/{panel['load']}")
    finally:
        lab.stop()
    log = lab.log_path.read_text(errors="replace")
    assert re.search(r"^(built|jupyter-tai-sandbox/minimal:latest \(.*\) is up to date: kept)", log, re.M), (
        log[:2000]
    )
    assert "Traceback" not in log, lab.log()
