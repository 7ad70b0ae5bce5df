"""The demo notebooks, executed end to end with nbclient against a live `jupyter server`.

The kernel is started by that server (REST), so the notebooks run exactly as in
JupyterLab: the kernel finds the sandbox API through the environment the
extension exports. The Binder test installs from binder/ into a fresh venv and
runs the getting-started notebook against a server from that venv.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from tests.support.docker import RUN_FILTER, docker_client, in_ci, server_args
from tests.support.live_server import ANSI, LOCAL_ARGS, REPO, LiveServer, ServerKernelManager

pytestmark = [pytest.mark.slow(176)]

NOTEBOOKS = REPO / "notebooks"


def execute(server: LiveServer, name: str, timeout: int = 180) -> dict[str, Any]:
    """Run notebooks/<name> in a kernel the server starts; return {cell id: outputs}."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    kernel_id = server.request("POST", "api/kernels", {"name": "python3"})["id"]
    km = ServerKernelManager(server, kernel_id)
    try:
        NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3").execute()
    finally:
        server.request("DELETE", f"api/kernels/{kernel_id}")
    nbformat.validate(nb)
    return {cell.get("id"): cell.get("outputs", []) for cell in nb.cells if cell.cell_type == "code"}


def text(outputs: list[dict[str, Any]], name: str | None = None) -> str:
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream" and name in (None, o["name"]))


def errors(outputs: list[dict[str, Any]]) -> list[str]:
    return [ANSI.sub("", "".join(o["traceback"])) for o in outputs if o["output_type"] == "error"]


def data(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["data"] for o in outputs if o["output_type"] in ("display_data", "execute_result")]


def check_getting_started(out: dict[str, list[dict[str, Any]]], provider: str = "local") -> None:
    for cell, outputs in out.items():
        if cell != "interrupted":
            assert not errors(outputs), (cell, errors(outputs))
    assert f"provider  {provider}" in text(out["status"])
    first = text(out["first"], "stdout")
    assert first.startswith("hello from the sandbox, in /") and "tick 1\ntick 2\ntick 3\n" in first
    # streamed: one stream message per tick at least (not one block at the end)
    assert sum("tick" in o.get("text", "") for o in out["first"]) >= 3
    assert "this line goes to stderr" in text(out["first"], "stderr")
    assert re.match(r"python 3\.\d+\.\d+ in the sandbox\n", text(out["python"], "stdout"))
    assert "sandbox: exit status 3" in text(out["python"], "stderr")
    assert text(out["handoff"]) == ""  # captured by --out
    assert text(out["report"]).split() == ["GRACE", "9.00", "ADA", "8.67", "LINUS", "7.00"]
    shown = data(out["outputs"])
    # inert by default: the SVG as an <img> of a data URL, the Markdown as its text
    assert [sorted(d) for d in shown] == [["text/html", "text/plain"], ["text/plain"]]
    prefix = '<img src="data:image/svg+xml;base64,'
    assert shown[0]["text/html"].startswith(prefix)
    svg = base64.b64decode(shown[0]["text/html"][len(prefix) :].split('"', 1)[0]).decode()
    assert svg.count("<rect") == 3
    assert "| grace | 9.00 |" in shown[1]["text/plain"]
    assert "cities.csv -> default:data/cities.csv" in text(out["put"])
    assert "3 data/by-size.csv" in text(out["sort"])
    assert text(out["read-back"]).splitlines()[:3] == ["Nantes,320732", "Lyon,522250", "Paris,2102650"]
    assert "session 'notes' started" in text(out["new-notes"])
    written = text(out["write-notes"]).splitlines()
    assert written and written[-1].startswith("a line written at")
    survived = text(out["read-notes"]).splitlines()
    assert survived[0] == "journal.txt survived the session:" and survived[1:] == written
    assert "removed" in text(out["cleanup-notes"])
    assert text(out["timeout"], "stdout") == "starting something slow\n"
    assert "deadline" in text(out["timeout"], "stderr")
    assert text(out["interrupted"], "stdout") == "working... (interrupt me)\n"
    [interrupt] = errors(out["interrupted"])
    assert interrupt.startswith("KeyboardInterrupt: the command was killed in session 'default'"), interrupt
    assert text(out["nothing-left"]) == "nothing left running\n"
    listing = text(out["sessions"])
    assert re.search(r"^default \*\s", listing, re.M) and "notes" not in listing


def test_getting_started_notebook(tmp_path):
    server = LiveServer(tmp_path, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}")).start()
    try:
        check_getting_started(execute(server, "getting-started.ipynb"))
        assert (server.root / "by-size.csv").exists()  # `get` wrote next to the kernel
    finally:
        server.stop()


def test_getting_started_notebook_on_docker_with_the_default_image(tmp_path):
    docker_client()  # skips without an engine (fails in CI)
    server = LiveServer(tmp_path, args=server_args(image=None)).start()
    try:
        check_getting_started(execute(server, "getting-started.ipynb"), provider="docker")
        assert (server.root / "by-size.csv").exists()
    finally:
        server.stop()


def test_docker_isolation_notebook(tmp_path):
    client = docker_client()  # skips without an engine (fails in CI)
    server = LiveServer(tmp_path, args=server_args()).start()
    try:
        out = execute(server, "docker-isolation.ipynb")
    finally:
        server.stop()
    for cell, outputs in out.items():
        assert not errors(outputs), (cell, errors(outputs))
    assert "provider  docker" in text(out["status"])
    host = text(out["host-files"])
    assert "inside: /workspace" in host and "is not here" in host and "only the host" not in host
    assert "No such file" in text(out["host-files"], "stderr")
    assert "eth0" in text(out["default-net"]) and "default" in text(out["default-net"])
    no_net = text(out["no-net"])
    assert "eth0" not in no_net and "routes: 0" in no_net and "no way out" in no_net
    assert "Network is unreachable" in text(out["no-net"], "stderr")
    memory = text(out["memory"])
    assert "holding 100 MB" in memory and "still here" not in memory
    assert "sandbox: exit status 137" in text(out["memory"], "stderr")
    after = text(out["memory-after"], "stdout")
    assert "still answers" in after and str(32 * 1024 * 1024) in after
    mine = {"label": RUN_FILTER}
    assert not client.containers.list(all=True, filters=mine)  # server shutdown removed them


def _binder_requirements() -> list[str]:
    env = yaml.safe_load((REPO / "binder" / "environment.yml").read_text())
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    return [r for group in pips for r in group]


@pytest.mark.skipif(
    not in_ci() and not os.environ.get("TAI_SANDBOX_BINDER_TEST"),
    reason="installs into a fresh venv (a minute or two): runs in CI, or set TAI_SANDBOX_BINDER_TEST=1",
)
@pytest.mark.timeout(900)
def test_binder_setup_runs_the_getting_started_notebook(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    # environment.yml's `pip` is conda-forge's newest: the venv gets the newest from PyPI (this pip installs
    # it with --python), not the older one ensurepip bundles, whose resolver takes 2.5 times the CPU on
    # jupyterlab's dependencies. --no-compile: byte-compiling all of them costs more than compiling, on
    # import, what the server and the kernel load.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", "pip"],
        check=True,
        env=env,
    )
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-compile", *_binder_requirements()], check=True, env=env
    )
    # postBuild runs from the repository root (as repo2docker does), on a copy of the checkout. The copy keeps
    # the built panel (jupyter_tai_sandbox/labextension/): its static/style.js is the build's skip-if-exists,
    # so postBuild's `pip install .` does not run node. jlpm's cache (.yarn, 66 MB) is left out: only a node
    # build reads it.
    checkout = tmp_path / "repo"
    shutil.copytree(
        REPO,
        checkout,
        ignore=shutil.ignore_patterns(
            ".git",
            "node_modules",
            ".yarn",
            ".venv",
            "__pycache__",
            "*.egg-info",
            "build",
            "dist",
            "artifacts",
            "results",
            ".pytest_cache",
            ".ruff_cache",
            ".hypothesis",
        ),
    )
    subprocess.run(["bash", "binder/postBuild"], check=True, cwd=checkout, env=env)
    # the server comes from the venv; provider and isolation come from binder's config only
    server = LiveServer(tmp_path / "server", python=python, env={"PATH": env["PATH"]}).start()
    try:
        status = server.request("GET", "api/sandbox/status")
        assert status["kind"] == "local" and status["policy"]["isolation"] == "none"
        check_getting_started(execute(server, "getting-started.ipynb"))
    finally:
        server.stop()
