"""The conformance package's layout: the checks keep their names and run order, each module stays
small, the package's modules import one another without a circle, and every public name of the
former single module is still importable from ``jupyter_tai_sandbox.conformance``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import jupyter_tai_sandbox.conformance as conformance
from jupyter_tai_sandbox.conformance import CHECK_MIXINS, ConformanceSuite, SuiteBase, check_names

PACKAGE = Path(conformance.__file__).parent

#: check_names() as the single-module suite gave it (the order of ``check_`` methods in its class
#: body), recorded before the split: a run takes the checks in this order.
CHECKS_BEFORE_THE_SPLIT = [
    "lifecycle",
    "credential_env",
    "streams_and_status",
    "big_stdin_through_cat",
    "head_of_big_stdin",
    "interactive_seam",
    "output_before_kill",
    "late_and_slow_reads",
    "kill_past_deadline",
    "deadline_kills_unread_command",
    "deadline_kills_command_that_closed_output",
    "timeout_byte_counts",
    "timeout_with_held_output",
    "group_stopped_after_exit",
    "file_transfer",
    "workspace_paths",
    "consumer_label",
    "ttl_reap",
    "rejects_what_it_cannot_honour",
    "pty_window_and_resize",
    "pty_ctrl_c",
    "commands_start_with_default_signals",  # added after the split (issue 30)
    "pty_stop_ends_the_terminal_session",
    "cancelled_one_shot_stops_its_group",
    "cancelled_start_leaves_nothing_running",
    "failed_stdin_write_is_one_error",
    "setsid_command_is_stopped",
    "unread_command_stalls_no_other",  # added with the session agent (issue 27)
    "absent_program_is_a_typed_error",
    "cut_upload_leaves_nothing_partial",
    "held_commands_are_listed_and_resumed_exactly",  # commands that outlive their server (issue 27)
    "a_detached_command_runs_on_and_is_attached_again",  # ExecHandle.detach: a command let go runs on (issue 53)
    "pause_freezes_and_resume_runs_on",  # the optional capabilities (issue 28)
    "fork_copies_the_session_or_is_refused",
]

#: Every public name the single module had (what tests, benchmarks, testing.py and the README use).
PUBLIC_NAMES_BEFORE_THE_SPLIT = {
    "FULL_STRENGTH",
    "INTERRUPTED",
    "KILLED",
    "MAX_CERTIFYING_TIMEOUT_SCALE",
    "NOT_A_CERTIFICATION",
    "CheckFailed",
    "ConformanceSuite",
    "check_doc",
    "check_names",
    "drain",
    "exit_items",
    "expect",
    "expect_one_exit",
    "expect_raises",
    "main",
    "run_checks",
    "run_sandbox_conformance",
    "selected_checks",
    "weakenings",
}


def test_the_checks_and_their_order_are_unchanged():
    assert check_names() == CHECKS_BEFORE_THE_SPLIT


def test_every_check_lives_in_exactly_one_mixin_of_the_suite():
    assert ConformanceSuite.__bases__ == CHECK_MIXINS
    assert all(issubclass(mixin, SuiteBase) for mixin in CHECK_MIXINS)
    owners: dict[str, list[str]] = {}
    for mixin in CHECK_MIXINS:
        for name in vars(mixin):
            if name.startswith("check_"):
                owners.setdefault(name, []).append(mixin.__name__)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}
    on_the_suite = {name for name in dir(ConformanceSuite) if name.startswith("check_")}
    assert on_the_suite == set(owners)  # no check outside the mixins (on SuiteBase or the suite itself)
    assert not [name for name in vars(ConformanceSuite) if name.startswith("check_")]
    assert not [name for name in vars(SuiteBase) if name.startswith("check_")]


def test_every_public_name_of_the_former_module_is_importable():
    missing = {name for name in PUBLIC_NAMES_BEFORE_THE_SPLIT if not hasattr(conformance, name)}
    assert missing == set()
    assert set(conformance.__all__) >= PUBLIC_NAMES_BEFORE_THE_SPLIT


def test_each_module_stays_small():
    sizes = {path.name: len(path.read_text().splitlines()) for path in PACKAGE.glob("*.py")}
    assert {name: lines for name, lines in sizes.items() if lines > 600} == {}


def package_imports() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports (relative imports)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        name = path.stem
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    graph[name].add(node.module.split(".")[0])
                else:
                    graph[name].update(alias.name for alias in node.names)
    return graph


def test_the_package_imports_without_a_circle():
    graph = package_imports()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import circle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for imported in graph.get(name, ()):
            visit(imported, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())
    # the checks lean on the base only; the suite assembles them; the runner runs the suite
    for checks in ("sessions", "execution", "deadlines", "terminals"):
        assert graph[checks] == {"base"}, (checks, graph[checks])
    assert graph["base"] == set()


def test_python_dash_m_runs_the_command_line():
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_tai_sandbox.conformance", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m jupyter_tai_sandbox.conformance")
    assert "setsid_command_is_stopped" in result.stdout
