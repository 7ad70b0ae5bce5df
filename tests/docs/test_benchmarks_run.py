"""The benchmark entry point runs end to end and writes its table, JSON and chart (a smoke run: no timing asserts)."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO
from tests.support.docker import docker_client

pytestmark = [pytest.mark.docker, pytest.mark.slow(91)]

RUN = REPO / "benchmarks" / "run.py"


#: the vm group's rows measured against docker's in the same run
VM_ROWS = (
    "vm create to first command: restored",
    "vm create to first command: restored, the docker image",
    "vm one-shot",
    "vm pause + resume",
    "vm fork",
    # a vm session on an egress bridge needs a server running as root (CI)
    *(("vm create to first command: restored, egress",) if os.geteuid() == 0 else ()),
)


@pytest.mark.timeout(600)
def test_one_command_measures_every_group_against_its_baseline(tmp_path):
    docker_client()  # skips without an engine (fails in CI)
    pytest.importorskip("matplotlib", reason="the bench extra: pip install -e '.[bench]'")
    if not os.environ.get("CI"):
        pytest.importorskip("llm_sandbox", reason="the bench extra: pip install -e '.[bench]'")
    try:
        done = subprocess.run(
            [sys.executable, "-u", str(RUN), "--quick", "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=540,
        )
    except subprocess.TimeoutExpired as e:  # where it was: the groups print as they go
        said = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the benchmarks took over {e.timeout:g} s; their output's tail:\n{said[-3000:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "latest.json").read_text())
    assert not [n for n in report["notes"] if "did not complete" in n], report["notes"]
    rows = {row["name"]: row for row in report["rows"]}
    for name in (
        "local exec true: ours",
        "docker exec: ours",
        "docker create to first command: ours, pool on",
        # a smoke run streams 32 MiB of stdout and echoes 8 MiB of stdin (the full run 256 and 64)
        "local stdout 32 MiB: ours",
        "docker stdin echo 8 MiB through cat: ours",
        "local exec true: REST",
        "local stdout 32 MiB: websocket",
        "ours exec (vs peer)",
        "peer llm-sandbox on a user-defined bridge, create to first command",
        "agent stdout 32 MiB: through the agent",
        "agent stdin echo 8 MiB: through the agent",
        "kernel: sandboxed on docker (network none) 1+1",
        "kernel: sandboxed on docker (network none) print 64 MiB",
        "local one-shot exec: audit + metrics",
        "docker one-shot exec: audit + metrics",
        *(name for name in rows if name.startswith(VM_ROWS)),
    ):
        assert rows[name]["baseline"] and rows[name]["ratio"] > 0, rows.get(name)
    assert all(any(name.startswith(prefix) for name in rows) for prefix in VM_ROWS), sorted(rows)
    # every group's targets are there (the agent group's exec transport has rows, not targets: its channel is an
    # exec stream, which bounds it; its targets are the session's memory and threads)
    names = [t["name"] for t in report["targets"]]
    for part in (
        "local exec overhead",
        "docker one-shot exec",
        "with the warm pool",
        "pool off, <= 1.1x the engine's floor",
        "pool off, <= 1.0x llm-sandbox's",
        "REST exec adds",
        "REST exec on docker adds",
        "websocket streaming >= 0.8x a raw localhost TCP relay",
        "server RSS growth",
        "sandboxed kernel on docker: 1+1",
        "sandboxed kernel on docker: 64 MiB printed",
        "to first command p50 <=",
        "from a warm pool",
        "local one-shot exec overhead of audit + metrics",
        "docker one-shot exec overhead of audit + metrics",
        "after 400 one-shots",
        "threads",
    ):
        assert any(part in name for name in names), (part, names)
    assert all(isinstance(t["passed"], bool) for t in report["targets"])
    assert "PASS" in done.stdout or "MISS" in done.stdout
    assert (tmp_path / "latest.png").stat().st_size > 10_000
