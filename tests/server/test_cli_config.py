"""The CLI door reads the Jupyter config the server reads, so its policy and presets apply there too."""

from __future__ import annotations

import json

from jupyter_tai_sandbox import cli

ECHO = {
    "description": "Echo a word.",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    "binding": {"argv": ["echo", {"field": "word"}], "timeout_seconds": 30},
}


def write_config(folder, text: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "jupyter_server_config.py").write_text(text)


def test_an_egress_ceiling_in_the_config_file_refuses_the_run(tmp_path, monkeypatch, capsys):
    config_dir = tmp_path / "config"
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(config_dir))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "")
    write_config(
        config_dir,
        "c.SandboxPolicy.isolation = 'none'\n"
        "c.SandboxPolicy.egress = 'none'\n"
        f"c.LocalSandbox.root = {str(tmp_path / 'sbx')!r}\n"
        f"c.SandboxApp.presets = {{'echo_word': {ECHO!r}}}\n",
    )
    code = cli.main(
        [
            "preset",
            "--store",
            str(tmp_path / "p.json"),
            "run",
            "echo_word",
            "--provider",
            "local",
            "--input",
            json.dumps({"word": "hi"}),
        ]
    )
    err = capsys.readouterr().err
    assert code == cli.RUN_FAILED and "egress ceiling" in err, err


def test_a_config_file_named_on_the_command_line_wins(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "")
    extra = tmp_path / "extra" / "site_config.py"
    extra.parent.mkdir()
    extra.write_text(
        "c.SandboxPolicy.isolation = 'none'\n"
        f"c.LocalSandbox.root = {str(tmp_path / 'sbx')!r}\n"
        "c.SandboxApp.provider = 'local'\n"
        f"c.SandboxApp.presets = {{'echo_word': {ECHO!r}}}\n"
    )
    code = cli.main(
        [
            "preset",
            "--config",
            str(extra),
            "--store",
            str(tmp_path / "p.json"),
            "run",
            "echo_word",
            "--input",
            json.dumps({"word": "hi"}),
        ]
    )
    captured = capsys.readouterr()
    assert (code, captured.out) == (0, "hi\n"), captured.err


def test_the_isolation_floor_can_be_lowered_for_a_local_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path / "sbx"))
    store = tmp_path / "p.json"
    (tmp_path / "echo.json").write_text(json.dumps(ECHO))
    assert (
        cli.main(["preset", "--store", str(store), "add", str(tmp_path / "echo.json"), "--name", "echo_word"])
        == 0
    )
    run = [
        "preset",
        "--store",
        str(store),
        "run",
        "echo_word",
        "--provider",
        "local",
        "--input",
        '{"word": "x"}',
    ]
    assert cli.main(run) == cli.RUN_FAILED
    err = capsys.readouterr().err
    # the hint names this door's own flag, not the server's option (issue 25 point 8)
    assert "(--isolation none)" in err and "SandboxPolicy.isolation" not in err, err
    assert cli.main([*run, "--isolation", "none"]) == 0
