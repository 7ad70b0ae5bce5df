"""Durations a person types (5s, 10m, 1h, 1h30m; a bare number is seconds), read by one parser everywhere:
the magics, the CLI's --ttl and the policy's TAI_MCP_SANDBOX_MAX_*_SECONDS variables."""

from __future__ import annotations

import json

import pytest

from jupyter_tai_sandbox import cli
from jupyter_tai_sandbox.contract import SandboxRequestError
from jupyter_tai_sandbox.contract.durations import DURATION_FORMS, format_duration, parse_duration
from jupyter_tai_sandbox.policy import SandboxPolicy


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [
        ("90", 90),
        ("1.5", 1.5),
        ("5s", 5),
        ("10m", 600),
        ("1h", 3600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("2d12h", 216000),
        (" 1h 30m ", 5400),
        (".5m", 30),
        ("1H30M", 5400),
        ("1m30s", 90),
        ("8h", 28800),
        (42, 42),
        (2.5, 2.5),
    ],
)
def test_a_duration_with_units_or_bare_seconds_is_read(typed, seconds):
    assert parse_duration(typed) == seconds


@pytest.mark.parametrize(
    "typed", ["soon", "", "5x", "1h30", "h", "1e3", "inf", "nan", "-5s", "5 s s", "1,5h", True]
)
def test_anything_else_is_a_request_error_naming_the_value_and_the_forms(typed):
    with pytest.raises(SandboxRequestError) as refused:
        parse_duration(typed, "--ttl", field="ttl")
    assert str(refused.value).startswith(f"--ttl: {typed!r} is not a duration: give {DURATION_FORMS}")
    assert "1h30m" in str(refused.value) and refused.value.field == "ttl"


@pytest.mark.parametrize("typed", ["30m1h", "1h1h", "5s1m"])
def test_units_out_of_order_or_twice_are_refused(typed):
    with pytest.raises(SandboxRequestError, match="out of order or twice"):
        parse_duration(typed, "--ttl")


def test_zero_and_negative_are_refused_unless_zero_is_allowed():
    for typed in ("0", "0s", "-5", -1.0, float("inf")):
        with pytest.raises(SandboxRequestError, match="is not a duration of more than 0 seconds"):
            parse_duration(typed, "--timeout")
    assert parse_duration("0", "a maximum", allow_zero=True) == 0
    with pytest.raises(SandboxRequestError, match="0 or more"):
        parse_duration(-1, "a maximum", allow_zero=True)


@pytest.mark.parametrize("seconds", [28800, 3600, 5400, 90, 2.5, 86400 + 1, 1])
def test_format_duration_is_read_back(seconds):
    assert parse_duration(format_duration(seconds)) == seconds
    assert format_duration(28800) == "8h" and format_duration(5400) == "1h30m"


def test_the_policys_maximum_ttl_and_timeout_variables_take_units(monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX_MAX_TTL_SECONDS", "1d12h")
    monkeypatch.setenv("TAI_MCP_SANDBOX_MAX_TIMEOUT_SECONDS", "90")
    policy = SandboxPolicy()
    assert (policy.max_ttl_seconds, policy.max_timeout_seconds) == (129600, 90)
    monkeypatch.setenv("TAI_MCP_SANDBOX_MAX_TIMEOUT_SECONDS", "0")
    assert SandboxPolicy().max_timeout_seconds == 0  # no limit
    monkeypatch.setenv("TAI_MCP_SANDBOX_MAX_TTL_SECONDS", "a day")
    with pytest.raises(
        ValueError, match=r"TAI_MCP_SANDBOX_MAX_TTL_SECONDS='a day': 'a day' is not a duration"
    ):
        SandboxPolicy().max_ttl_seconds  # noqa: B018


def test_the_cli_kernelspec_ttl_takes_units(tmp_path, capsys):
    assert (
        cli.main(
            [
                "kernelspec",
                "install",
                "--name",
                "brief",
                "--ttl",
                "1h30m",
                "--provider",
                "local",
                "--prefix",
                str(tmp_path),
            ]
        )
        == 0
    )
    spec = json.loads((tmp_path / "share/jupyter/kernels/brief/kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["config"]["ttl_seconds"] == 5400
    with pytest.raises(SystemExit):
        cli.main(["kernelspec", "install", "--ttl", "soon", "--prefix", str(tmp_path)])
    err = capsys.readouterr().err
    assert "argument --ttl: 'soon' is not a duration: give seconds" in err and "1h30m" in err
