"""Sandboxed kernels on the local provider: nbclient runs a notebook on the provisioner's kernel.

The kernelspec is written by the CLI into a temporary prefix on JUPYTER_PATH; the kernel
runs with this Python in a local session (no isolation), reached through the tunnel.
tests/kernels/test_kernel_docker.py runs the same notebook in a container with network none.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.cli import main as cli
from jupyter_tai_sandbox.kernels.provisioner import PROVISIONER_NAME, SandboxProvisioner
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.kernels import (
    INTERRUPT_LIMIT,
    SECRET,
    check_notebook,
    install_spec,
    notebook,
    run_notebook,
    started_kernel,
    stdout,
)

pytestmark = pytest.mark.timeout(240)


def test_kernelspec_install_list_remove(tmp_path, monkeypatch, capsys):
    name = install_spec(
        tmp_path, monkeypatch, "--display-name", "Py (sbx)", "--network", "none", "--persistent", "nb-work",
        "--cpu", "1.5", "--memory", "512",
    )  # fmt: skip
    folder = tmp_path / "prefix" / "share" / "jupyter" / "kernels" / name
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["interrupt_mode"] == "message"
    assert spec["display_name"] == "Py (sbx)"
    assert "{connection_file}" in spec["argv"]
    provisioner = spec["metadata"]["kernel_provisioner"]
    assert provisioner["provisioner_name"] == PROVISIONER_NAME
    assert provisioner["config"] == {
        "image": "jupyter-tai-sandbox/python:latest",
        "network": "none",
        "workspace_key": "nb-work",
        "cpu": 1.5,
        "memory_mb": 512,
    }
    assert (folder / "logo-64x64.png").exists()  # the launcher's icon
    capsys.readouterr()
    assert cli(["kernelspec", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert list(listed) == [name]
    assert cli(["kernelspec", "list"]) == 0
    assert "Py (sbx)" in capsys.readouterr().out
    # a bad setting is refused before anything is written
    assert (
        cli(
            [
                "kernelspec",
                "install",
                "--name",
                "bad",
                "--prefix",
                str(tmp_path / "p2"),
                "--persistent",
                "a b",
            ]
        )
        == 1
    )
    assert "workspace_key" in capsys.readouterr().err
    # the provisioner is found through its entry point
    from jupyter_client.provisioning import KernelProvisionerFactory

    assert KernelProvisionerFactory.instance().is_provisioner_available(
        type("Spec", (), {"metadata": spec["metadata"], "display_name": "x"})()
    )
    assert cli(["kernelspec", "remove", name]) == 0
    assert not folder.exists()
    assert cli(["kernelspec", "remove", name]) == 1
    assert "no kernelspec" in capsys.readouterr().err


def test_kernelspec_install_without_flags_goes_into_the_running_environment(tmp_path, monkeypatch, capsys):
    env = tmp_path / "venv"
    monkeypatch.setattr(sys, "prefix", str(env))
    monkeypatch.setenv("JUPYTER_PATH", str(env / "share" / "jupyter"))
    assert cli(["kernelspec", "install", "--name", "sbx-env"]) == 0
    folder = env / "share" / "jupyter" / "kernels" / "sbx-env"
    assert (folder / "kernel.json").exists()
    assert str(folder) in capsys.readouterr().out  # it says where it went
    assert cli(["kernelspec", "remove", "sbx-env"]) == 0


def test_kernelspec_install_warns_that_an_image_has_no_effect_on_local(tmp_path, monkeypatch, capsys):
    capsys.readouterr()
    install_spec(tmp_path, monkeypatch, "--provider", "local", "--image", "python:3.12", name="sbx-local-img")
    assert "--image python:3.12 has no effect on the local provider" in capsys.readouterr().err
    install_spec(tmp_path, monkeypatch, "--provider", "local", name="sbx-local")
    assert "no effect" not in capsys.readouterr().err


def test_removing_a_foreign_kernelspec_is_refused(tmp_path, monkeypatch, capsys):
    prefix = tmp_path / "prefix"
    folder = prefix / "share" / "jupyter" / "kernels" / "plain"
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(
        json.dumps({"argv": ["python3"], "display_name": "plain", "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    assert cli(["kernelspec", "remove", "plain"]) == 1
    assert "not a sandboxed kernel" in capsys.readouterr().err
    assert folder.exists()


def test_notebook_on_the_local_provider(tmp_path, monkeypatch):
    name = install_spec(tmp_path, monkeypatch)
    monkeypatch.setenv(SECRET, "do-not-leak")
    sandbox = LocalSandbox(root=str(tmp_path / "root"))
    sandboxes.register_sandbox(sandbox, policy=SandboxPolicy(isolation="none"))

    async def main() -> dict[str, Any]:
        async def check_gone(first: str) -> None:
            assert first not in {info.id for info in await sandbox.list()}

        seen = await run_notebook(name, restart_check=check_gone)
        seen["left"] = [info for info in await sandbox.list() if info.consumer.startswith("kernel:")]
        return seen

    seen = asyncio.run(main())
    check_notebook(seen, in_container=False)
    assert seen["first_info"].isolation == "none"
    assert seen["left"] == []  # shutdown destroyed the session
    assert not Path(seen["first_info"].workspace).exists()


def test_a_refused_spec_fails_the_start_with_the_policy_message(tmp_path, monkeypatch):
    name = install_spec(tmp_path, monkeypatch)
    sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=SandboxPolicy(isolation="vm")
    )
    nb = notebook()
    started = time.monotonic()
    # a kernel-start error comes in lines of at most 72 characters: any whitespace between words
    with pytest.raises(
        Exception, match=r"gives\s+isolation\s+'none'\s+at\s+most;\s+isolation\s+'vm'\s+was\s+requested"
    ):
        NotebookClient(nb, kernel_name=name, startup_timeout=60).execute()
    assert time.monotonic() - started < 10


def test_no_provider_fails_the_start_saying_how_to_install_one(tmp_path, monkeypatch):
    name = install_spec(tmp_path, monkeypatch)
    sandboxes.disable_sandbox()  # as a server with SandboxApp.provider = off
    started = time.monotonic()
    with pytest.raises(Exception, match=r"no\s+sandbox\s+provider\s+is\s+installed"):
        NotebookClient(notebook(), kernel_name=name, startup_timeout=60).execute()
    assert time.monotonic() - started < 10


def test_the_kernelspec_provider_fills_an_unconfigured_slot(tmp_path, monkeypatch):
    """Outside a server (nbclient alone), --provider local is used when nothing else names one."""
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("TAI_MCP_SANDBOX_ISOLATION", "none")
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "config"))  # no server config here
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path / "config"))
    name = install_spec(tmp_path, monkeypatch, "--provider", "local")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import sys, os\nprint(sys.executable, os.getcwd())")]
    NotebookClient(nb, kernel_name=name, startup_timeout=90, timeout=60).execute()
    executable, cwd = stdout(nb.cells[0]).split()
    assert executable == sys.executable  # the local provider runs the server's own Python
    assert cwd.startswith(os.path.realpath(tmp_path / "root"))
    assert sandboxes.installed() is not None and sandboxes.installed().kind == "local"


def test_signals_cross_the_seam_and_a_dead_tunnel_ends_the_kernel(tmp_path, monkeypatch):
    """SIGINT through the seam (interrupt_mode signal works too); the relay's death ends the kernel."""
    import signal

    name = install_spec(tmp_path, monkeypatch)
    sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=SandboxPolicy(isolation="none")
    )

    async def main() -> None:
        async with started_kernel(name) as (km, kc):
            msg_id = kc.execute("import time; time.sleep(60)")
            await asyncio.sleep(1.0)
            started = time.monotonic()
            await km.signal_kernel(signal.SIGINT)
            while True:
                reply = await kc.get_shell_msg(timeout=10)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            assert reply["content"]["ename"] == "KeyboardInterrupt"
            assert time.monotonic() - started < INTERRUPT_LIMIT
            assert await km.is_alive()
            await km.provisioner.tunnel.handle.kill()  # the relay dies: the kernel cannot be reached
            deadline = time.monotonic() + 10
            while await km.is_alive():
                assert time.monotonic() < deadline, "the kernel outlived its tunnel"
                await asyncio.sleep(0.1)
        assert [i for i in await sandboxes.require_sandbox().list() if i.consumer.startswith("kernel:")] == []

    asyncio.run(main())


def test_a_kernel_life_over_the_command_ceiling_is_refused_not_clamped(tmp_path, monkeypatch):
    """The kernel and its relay run for the kernel's whole life: a --ttl past the operator's command
    ceiling fails the start at once, naming both settings (it used to be cut to the ceiling silently)."""
    name = install_spec(tmp_path, monkeypatch, "--ttl", "100")
    sandbox = LocalSandbox(root=str(tmp_path / "root"))
    sandboxes.register_sandbox(sandbox, policy=SandboxPolicy(isolation="none", max_timeout_seconds=50))
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        NotebookClient(notebook(), kernel_name=name, startup_timeout=60).execute()
    words = " ".join(
        str(raised.value).split()
    )  # a kernel-start error comes in lines of at most 72 characters
    assert "ttl_seconds 100 (SandboxProvisioner.ttl_seconds, `kernelspec install --ttl`)" in words
    assert "over the operator's maximum command deadline of 50 s (SandboxPolicy.max_timeout_seconds" in words
    assert time.monotonic() - started < 10
    assert asyncio.run(sandbox.list()) == []  # refused before any session was made


def test_a_kernels_default_life_is_the_longest_both_maxima_allow(tmp_path, monkeypatch):
    assert SandboxProvisioner()._life(SandboxPolicy(max_ttl_seconds=7200, max_timeout_seconds=600)) == 600
    assert SandboxProvisioner()._life(SandboxPolicy(max_ttl_seconds=300, max_timeout_seconds=600)) == 300
    assert SandboxProvisioner()._life(SandboxPolicy(max_ttl_seconds=0, max_timeout_seconds=0)) == 24 * 3600
    assert SandboxProvisioner(ttl_seconds=600)._life(SandboxPolicy(max_timeout_seconds=600)) == 600
    name = install_spec(tmp_path, monkeypatch)
    policy = SandboxPolicy(isolation="none", max_ttl_seconds=7200, max_timeout_seconds=600)
    sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "root")), policy=policy)

    async def main() -> None:
        async with started_kernel(name) as (km, _):
            info = await km.provisioner.session.info()
            assert info.expires_at - info.created_at == pytest.approx(600, abs=1)

    asyncio.run(main())


def test_a_kernelspec_egress_list_is_written_and_refused_by_local_at_start(tmp_path, monkeypatch):
    name = install_spec(
        tmp_path,
        monkeypatch,
        "--egress-allow",
        "PyPI.org",
        "--egress-allow",
        "*.github.com",
        "--egress-deny",
        "x.test",
    )
    spec = json.loads(
        (tmp_path / "prefix" / "share" / "jupyter" / "kernels" / name / "kernel.json").read_text()
    )
    config = spec["metadata"]["kernel_provisioner"]["config"]
    assert config["egress_allow"] == ["PyPI.org", "*.github.com"] and config["egress_deny"] == ["x.test"]
    sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=SandboxPolicy(isolation="none")
    )
    started = time.monotonic()
    with pytest.raises(Exception, match=r"cannot\s+enforce\s+an\s+egress\s+allow-list"):
        NotebookClient(notebook(), kernel_name=name, startup_timeout=60).execute()
    assert time.monotonic() - started < 10


def test_a_kernelspec_egress_list_needs_network_egress(tmp_path, monkeypatch, capsys):
    prefix = tmp_path / "prefix"
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    argv = ["kernelspec", "install", "--name", "sbx-x", "--prefix", str(prefix), "--network", "none"]
    assert cli([*argv, "--egress-allow", "pypi.org"]) == 1
    assert "needs network egress" in capsys.readouterr().err
    assert cli([*argv[:-2], "--egress-allow", "10.0.0.1"]) == 1  # an address is no host name
    assert "10.0.0.1" in capsys.readouterr().err
    assert not (prefix / "share" / "jupyter" / "kernels" / "sbx-x").exists()
