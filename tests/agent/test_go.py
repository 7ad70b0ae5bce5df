"""The session agent's own Go checks (``agent/*_test.go``), so README's test command covers them: ``go test``
runs its unit tests (frame codec, rings, credit windows, file confinement, command lifecycle) and every fuzz
target over its committed seed corpus (``agent/testdata/fuzz/``); ``go vet`` and ``gofmt -l`` keep it clean.
CI's ``.ci/agent-go`` runs the same and then fuzzes each target for a bounded time."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from jupyter_tai_sandbox.agent import AgentBinaryMissing
from jupyter_tai_sandbox.agent.binary import go_command

AGENT_SRC = Path(__file__).resolve().parents[2] / "agent"
# offline, like the build: the agent uses the standard library only
GO_ENV = {**os.environ, "GOPROXY": "off", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}


@pytest.fixture(scope="module")
def go() -> list[str]:
    try:
        return go_command()
    except AgentBinaryMissing as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(str(e))
        pytest.skip(f"{e}: the dev extra installs it")


def run_go(go: list[str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*go, *args], cwd=AGENT_SRC, env=GO_ENV, capture_output=True, text=True, timeout=timeout
    )


def test_agent_go_tests_and_fuzz_seeds_pass(go):
    done = run_go(go, "test", "-count=1", "./...")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok  \ttai-agent" in done.stdout


def test_agent_go_vet_is_clean(go):
    done = run_go(go, "vet", "./...")
    assert done.returncode == 0, done.stdout + done.stderr


def test_agent_go_sources_are_gofmt_formatted(go):
    goroot = run_go(go, "env", "GOROOT").stdout.strip()
    done = subprocess.run(
        [os.path.join(goroot, "bin", "gofmt"), "-l", "."],
        cwd=AGENT_SRC,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", f"gofmt -l lists: {done.stdout}"
