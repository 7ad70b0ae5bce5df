"""%%sandbox in a docker session with a memory limit: a cell the kernel's OOM killer ends says so (issue 48)."""

from __future__ import annotations

import pytest

from tests.support.live_server import docker_kernel

pytestmark = [pytest.mark.docker, pytest.mark.slow(20)]


def test_a_cell_killed_out_of_memory_says_so_with_the_sessions_limit(tmp_path):
    with docker_kernel(tmp_path) as k:
        # one process that grows until the OOM killer takes it
        run = k.run(
            "%%sandbox --session oom --memory 32\nx=a; while :; do x=$x$x; done; echo survived", timeout=120
        )
        last = (run.stderr.strip().splitlines() or [""])[-1]
        assert last == "sandbox: exit status 137 (killed: out of memory (the session's limit is 32 MiB))", (
            run.stdout,
            run.stderr,
            run.errors,
        )
        assert "survived" not in run.stdout
        # the next cell in the same session runs, and a plain failure says only its status
        run = k.run("%%sandbox --session oom\nexit 3", timeout=60)
        assert run.stderr.strip().splitlines()[-1] == "sandbox: exit status 3", run.stderr
        k.ok("%sandbox rm oom")
