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


CHILD_SIGNALS = """
import os, signal, subprocess, sys
from jupyter_tai_sandbox.providers.local.posix import spawn_kwargs

assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # as the shell left it
kwargs = spawn_kwargs(0)
print("preexec_fn" in kwargs)
os.kill(os.getpid(), signal.SIGINT)  # still of no effect on this process
os.kill(os.getpid(), signal.SIGQUIT)
child = subprocess.run(["grep", "^SigIgn", "/proc/self/status"], capture_output=True, text=True, **kwargs)
print(child.stdout.split()[1])
"""


def test_a_background_server_goes_on_ignoring_sigint_and_its_commands_start_by_the_fast_path():
    # a preexec_fn makes Popen fork the whole server (milliseconds per command in a large one): the
    # signals a shell left ignored are caught and dropped instead, and exec resets them in the child
    run = subprocess.run(
        ["sh", "-c", '"$1" -c "$2" & wait $!', "sh", sys.executable, CHILD_SIGNALS],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    uses_preexec, child_ignored = run.stdout.split()
    assert uses_preexec == "False"
    mask = int(child_ignored, 16)
    assert not mask & (1 << (2 - 1)) and not mask & (1 << (3 - 1)), child_ignored  # SIGINT, SIGQUIT
