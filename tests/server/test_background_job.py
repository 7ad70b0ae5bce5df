"""The suite started as a background job of a non-interactive shell (``cmd &``, as nohup, CI
runners and process managers start it): the process, and so the server and its providers,
inherit SIGINT and SIGQUIT ignored, and local commands must still start with default signals."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO

ROOT = REPO


@pytest.mark.timeout(240)
def test_local_terminals_work_when_the_suite_runs_as_a_background_job():
    selection = "pty_ctrl_c or pty_window_and_resize or default_signals"
    script = f'"$1" -m pytest -q -n 0 -p no:cacheprovider tests/providers/conformance/test_conformance_local.py -k "{selection}" & wait $!'
    run = subprocess.run(
        ["sh", "-c", script, "sh", sys.executable],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]
