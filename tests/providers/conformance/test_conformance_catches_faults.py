"""The suite must fail a provider that breaks the contract: each planted fault is reported."""

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest

from jupyter_tai_sandbox.conformance import NOT_A_CERTIFICATION, run_sandbox_conformance
from jupyter_tai_sandbox.providers.local import LocalCommand, LocalSandbox, LocalSession
from tests.support.conformance import accept_everything

pytestmark = [pytest.mark.slow(16)]


class KillSparesTheGroup(LocalCommand):
    """Its kill signals nothing: the command and what it started keep running (the holder is still reaped)."""

    leaked_groups: list[int] = []

    def _kill_group(self) -> None:
        if self._group_held and self._pgid not in KillSparesTheGroup.leaked_groups:
            KillSparesTheGroup.leaked_groups.append(self._pgid)


class InventsExitStatus(LocalCommand):
    def _read_status(self) -> int | None:
        return 0


class FollowsPathsOut(LocalSession):
    def _host_path(self, path: str) -> Path:
        return self.workspace / path


def provider(tmp_path, **classes):
    return type("BrokenLocalSandbox", (LocalSandbox,), classes)(root=str(tmp_path))


def failed_checks(failures: list[str]) -> set[str]:
    """The checks that failed; a run of a subset also says it is no certification."""
    assert failures and failures[-1].startswith(f"{NOT_A_CERTIFICATION}: only "), failures
    return {f.split(":", 1)[0] for f in failures[:-1]}


@pytest.fixture
def leaked_groups():
    yield KillSparesTheGroup.leaked_groups
    for pgid in KillSparesTheGroup.leaked_groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    KillSparesTheGroup.leaked_groups.clear()


#: each check waits on a group that never stops (its limit, then the suite's bounded closing destroy): one unit
#: each, so they wait side by side
KILL_CHECKS = [
    pytest.param(
        check, says, marks=[pytest.mark.xdist_group(f"catches-faults-{check}"), pytest.mark.slow(30)]
    )
    for check, says in (
        ("group_stopped_after_exit", "still running"),
        ("deadline_kills_unread_command", "still running"),
        ("output_before_kill", "did not finish within"),
    )
]


@pytest.mark.parametrize(("check", "says"), KILL_CHECKS)
def test_suite_reports_a_kill_that_leaves_the_group_running(tmp_path, leaked_groups, check, says):
    sandbox = provider(tmp_path, command_class=KillSparesTheGroup)
    # the check waits on a group that never stops: a short check limit reports it sooner
    failures = asyncio.run(run_sandbox_conformance(sandbox, only=[check], check_timeout=15))
    # a command the broken kill left running holds up the suite's closing destroy too: reported, not waited for
    assert failed_checks(failures) - {"cleanup"} == {check}, failures
    assert says in failures[0], failures


def test_suite_reports_an_invented_exit_status(tmp_path):
    sandbox = provider(tmp_path, command_class=InventsExitStatus)
    failures = asyncio.run(
        run_sandbox_conformance(
            sandbox, only=["streams_and_status", "output_before_kill", "kill_past_deadline"]
        )
    )
    assert failed_checks(failures) == {"streams_and_status", "output_before_kill", "kill_past_deadline"}
    assert any("expected exit status 137, got 0" in f for f in failures), failures


def test_suite_reports_paths_that_escape_the_workspace(tmp_path):
    sandbox = provider(tmp_path, session_class=FollowsPathsOut)
    failures = asyncio.run(run_sandbox_conformance(sandbox, only=["workspace_paths"]))
    assert failed_checks(failures) == {"workspace_paths"} and len(failures) == 2, failures


def test_suite_reports_a_provider_that_accepts_what_it_cannot_honour(tmp_path):
    sandbox = provider(tmp_path)
    accept_everything(sandbox)  # never rejects anything
    failures = asyncio.run(run_sandbox_conformance(sandbox, only=["rejects_what_it_cannot_honour"]))
    assert failed_checks(failures) == {"rejects_what_it_cannot_honour"}
    assert "was accepted" in failures[0], failures
    assert asyncio.run(sandbox.list()) == []  # the suite cleaned up what the fault let through


def test_suite_reports_a_terminal_that_ignores_a_resize(tmp_path):
    sandbox = LocalSandbox(root=str(tmp_path))

    async def ignore(self, rows: int, cols: int) -> None:
        pass

    sandbox.pty_command_class = type("IgnoresResize", (sandbox.pty_command_class,), {"resize": ignore})
    failures = asyncio.run(run_sandbox_conformance(sandbox, only=["pty_window_and_resize", "pty_ctrl_c"]))
    assert failed_checks(failures) == {"pty_window_and_resize"}, failures
    assert "stty size after resize(40, 120)" in failures[0], failures
