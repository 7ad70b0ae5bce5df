"""A misspelled provider name, wherever it is typed, is answered with the closest real one ("did you mean
'docker'?"): SandboxApp.provider (the server's status and every route), TAI_MCP_SANDBOX, the CLI."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox import cli, sandboxes
from jupyter_tai_sandbox.contract import SandboxUnavailableError
from jupyter_tai_sandbox.suggest import closest, did_you_mean
from tests.support.server import call, server_config


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("dokcer", tmp_path / "sandboxes")


async def test_a_misspelled_sandboxapp_provider_is_answered_did_you_mean_docker(jp_fetch):
    _, body = await call(jp_fetch, "status")  # the status route says why the provider did not start
    assert "unknown sandbox provider 'dokcer': did you mean 'docker'?" in body["message"], body
    status, body = await call(jp_fetch, "sessions", method="POST", body={})
    assert status == 503 and "did you mean 'docker'?" in body["message"], body


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("dokcer", "docker"),
        ("lcoal", "local"),
        ("Docker", "docker"),
        ("swram", "swarm"),
        ("remtoe", "remote"),
    ],
)
def test_a_misspelled_tai_mcp_sandbox_is_answered_did_you_mean(monkeypatch, typed, meant):
    monkeypatch.setenv("TAI_MCP_SANDBOX", typed)
    with pytest.raises(SandboxUnavailableError, match=f"did you mean '{meant}'\\?"):
        sandboxes.require_sandbox()


def test_a_name_close_to_nothing_gets_no_guess():
    with pytest.raises(SandboxUnavailableError) as raised:
        sandboxes.load_provider_class("kubernetes")
    assert "did you mean" not in str(raised.value) and "local, docker" in str(raised.value)
    assert (
        closest("kubernetes", sandboxes.BUILTIN_PROVIDERS) is None and did_you_mean("zzz", ["docker"]) == ""
    )


def test_the_cli_preset_run_answers_a_misspelled_provider_did_you_mean(capsys, tmp_path):
    status = cli.main(
        [
            "preset",
            "--store",
            str(tmp_path / "p.json"),
            "run",
            "sandbox_exec",
            "--provider",
            "dockr",
            "--input",
            '{"argv": ["true"]}',
        ]
    )
    assert status == cli.RUN_FAILED
    assert "unknown sandbox provider 'dockr': did you mean 'docker'?" in capsys.readouterr().err
