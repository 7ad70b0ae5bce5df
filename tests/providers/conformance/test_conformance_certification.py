"""Certification means every check ran at full strength and passed: a subset, an unknown check
name or a weakened run never returns a bare ``[]``, and the CLI never says "certified" then."""

from __future__ import annotations

import functools

import pytest

from jupyter_tai_sandbox import conformance
from jupyter_tai_sandbox.conformance import (
    FULL_STRENGTH,
    NOT_A_CERTIFICATION,
    check_names,
    run_checks,
    run_sandbox_conformance,
)
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.testing import ConformanceWeakenedWarning, SandboxConformance
from tests.support import aio
from tests.support.conformance import accept_everything

CHEAP = "consumer_label"  # a check that takes a fraction of a second


@pytest.fixture
def sandbox(tmp_path):
    return LocalSandbox(root=str(tmp_path))


#: each coroutine of these tests is bounded to 60 s
run = functools.partial(aio.run, timeout=60)


def notices(entries: list[str]) -> list[str]:
    return [e for e in entries if e.startswith(f"{NOT_A_CERTIFICATION}: ")]


@pytest.mark.parametrize("only", [["typo"], [CHEAP, "typo"], [], "lifecycle"])
def test_an_unknown_or_empty_selection_raises_and_runs_nothing(sandbox, only):
    with pytest.raises(ValueError) as raised:
        run(run_sandbox_conformance(sandbox, only=only))
    if only and isinstance(only, list):
        assert "typo" in str(raised.value) and "lifecycle" in str(raised.value)  # names the known checks
    assert run(sandbox.list()) == []


def test_a_subset_that_passes_is_not_a_certification(sandbox):
    entries = run(run_sandbox_conformance(sandbox, only=[CHEAP]))
    assert entries, "a subset returned a bare [] (a certification)"
    (notice,) = entries
    assert notice.startswith(f"{NOT_A_CERTIFICATION}: only 1 of the {len(check_names())} checks ran")


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"big_stdin_bytes": 1024}, "big_stdin_bytes=1024 is below"),
        ({"big_output_bytes": FULL_STRENGTH["big_output_bytes"] - 1}, "big_output_bytes="),
        ({"timeout_scale": 50.0}, "timeout_scale=50 stretches"),
    ],
)
def test_a_weakened_run_is_not_a_certification(sandbox, options, said):
    entries = run(run_sandbox_conformance(sandbox, only=[CHEAP], **options))
    assert any(said in n for n in notices(entries)), entries
    assert len(notices(entries)) == 2 == len(entries)  # the weakening and the subset, no failure


@pytest.mark.parametrize(
    "options", [{"timeout_scale": 0}, {"timeout_scale": float("nan")}, {"big_stdin_bytes": 0}]
)
def test_options_the_suite_cannot_run_with_raise(sandbox, options):
    with pytest.raises(ValueError):
        run(run_sandbox_conformance(sandbox, **options))


def test_failures_come_first_and_the_notice_still_follows(sandbox):
    accept_everything(sandbox)  # accepts what it cannot honour
    entries = run(run_sandbox_conformance(sandbox, only=["rejects_what_it_cannot_honour", CHEAP]))
    assert entries[0].startswith("rejects_what_it_cannot_honour: "), entries
    assert notices(entries) == entries[1:] and len(entries) == 2


def test_run_checks_reports_only_failures_and_certifies_nothing(sandbox):
    assert run(run_checks(sandbox, [CHEAP])) == []
    with pytest.raises(ValueError):
        run(run_checks(sandbox, ["typo"]))


def test_the_cli_never_says_certified_for_a_typo(capsys):
    with pytest.raises(SystemExit) as exited:
        conformance.main(["local", "--only", "typo"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert "certified" not in out and "invalid choice: 'typo'" in err


@pytest.mark.parametrize("extra", [[], ["--timeout-scale", "50"]])
def test_the_cli_says_a_subset_or_a_stretched_run_is_not_a_certification(
    capsys, monkeypatch, tmp_path, extra
):
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path))
    assert conformance.main(["local", "--only", CHEAP, *extra]) == 2
    out, _ = capsys.readouterr()
    assert "certified" not in out and "FAIL" not in out
    assert f"this run is {NOT_A_CERTIFICATION}" in out
    assert ("timeout_scale=50" in out) == bool(extra)


def test_the_cli_refuses_a_timeout_scale_it_cannot_run_with(capsys):
    with pytest.raises(SystemExit) as exited:
        conformance.main(["local", "--timeout-scale", "0"])
    assert exited.value.code == 2
    assert "certified" not in capsys.readouterr().out


def test_the_pytest_face_has_one_test_per_check():
    tests = sorted(name for name in dir(SandboxConformance) if name.startswith("test_"))
    assert tests == sorted(f"test_{name}" for name in check_names())
    assert SandboxConformance.test_pty_ctrl_c.__doc__.startswith("^C written to a pty")


class BrokenLocal(SandboxConformance):
    """A provider that accepts every spec, through the pytest face (not collected: no Test prefix)."""

    def make_sandbox(self, tmp_path):
        sandbox = LocalSandbox(root=str(tmp_path))
        return accept_everything(sandbox)


def test_the_pytest_face_fails_a_check_with_what_the_suite_saw(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"rejects_what_it_cannot_honour: .*was accepted"):
        BrokenLocal().test_rejects_what_it_cannot_honour(None, tmp_path)
    BrokenLocal().test_consumer_label(None, tmp_path)  # the checks the fault does not touch still pass


def test_the_pytest_face_warns_when_it_runs_weakened(tmp_path):
    weakened = type("Weakened", (BrokenLocal,), {"conformance_options": {"big_output_bytes": 10}})
    with pytest.warns(ConformanceWeakenedWarning, match="big_output_bytes=10"):
        weakened().test_consumer_label(None, tmp_path)
