"""Sandboxed kernels for clients that run no event loop of their own, and for clients that die.

Each client is a separate process with no provider registered, as a user runs it:
``jupyter_client.manager.start_new_kernel`` in a plain script (a blocking KernelManager, which
runs a loop only inside its calls), and ``jupyter console`` on a pipe. The provider comes from
the kernelspec (``--provider``). A client killed with SIGKILL takes its kernel's session with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.kernels import install_spec

pytestmark = pytest.mark.timeout(300)

BLOCKING_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=sys.argv[1], startup_timeout=90)
    try:
        outputs = []
        for code in ("x = 6 * 7", "print(x)", "import os; print(os.getpid())"):
            reply = kc.execute_interactive(
                code, timeout=60, output_hook=lambda m: outputs.append(m["content"].get("text", ""))
            )
            assert reply["content"]["status"] == "ok", reply
            time.sleep(1.5)  # between calls no loop of the client runs: the kernel must stay reachable
        print("OUTPUT", "".join(outputs).split(), flush=True)
        if len(sys.argv) > 2:  # wait to be killed
            print("READY", flush=True)
            time.sleep(600)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    print("SHUTDOWN", flush=True)
    """
)


def local_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SANDBOX_LOCAL_ROOT": str(tmp_path / "root"),
        "TAI_MCP_SANDBOX_ISOLATION": "none",
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),  # no server config: the kernelspec names the provider
        "JUPYTER_CONFIG_PATH": str(tmp_path / "config"),
    }


def docker_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TAI_MCP_SANDBOX_ISOLATION": "container",
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_CONFIG_PATH": str(tmp_path / "config"),
    }


def run_blocking(name: str, env: dict[str, str], tmp_path: Path) -> str:
    script = tmp_path / "blocking.py"
    script.write_text(BLOCKING_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), name],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SHUTDOWN" in done.stdout, done.stdout + done.stderr
    return done.stdout


def local_kernel_sessions(root: Path) -> list[str]:
    async def listing() -> list[str]:
        sandbox = LocalSandbox(root=str(root))
        try:
            return [i.id for i in await sandbox.list() if i.consumer.startswith("kernel")]
        finally:
            await sandbox.close()

    return asyncio.run(listing())


def docker_kernel_sessions() -> list[str]:
    from jupyter_tai_sandbox.providers.docker import DockerSandbox

    async def listing() -> list[str]:
        sandbox = DockerSandbox()
        try:
            return [i.id for i in await sandbox.list() if i.consumer.startswith("kernel")]
        finally:
            await sandbox.close()

    return asyncio.run(listing())


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_a_blocking_kernel_manager_script_runs_cells_on_the_local_provider(tmp_path, monkeypatch):
    name = install_spec(tmp_path, monkeypatch, "--provider", "local")
    env = {**local_env(tmp_path), "JUPYTER_PATH": os.environ["JUPYTER_PATH"]}
    out = run_blocking(name, env, tmp_path)
    assert "OUTPUT ['42'," in out, out
    assert local_kernel_sessions(tmp_path / "root") == []  # shutdown destroyed the session


def test_a_blocking_kernel_manager_script_runs_cells_on_docker(tmp_path, monkeypatch):
    from tests.support.docker import python_image

    python_image().close()
    name = install_spec(tmp_path, monkeypatch, "--provider", "docker", "--network", "none")
    env = {**docker_env(tmp_path), "JUPYTER_PATH": os.environ["JUPYTER_PATH"]}
    out = run_blocking(name, env, tmp_path)
    assert "OUTPUT ['42'," in out, out
    assert docker_kernel_sessions() == []


def test_jupyter_console_runs_a_cell_on_a_sandboxed_kernel(tmp_path, monkeypatch):
    name = install_spec(tmp_path, monkeypatch, "--provider", "local")
    env = {**local_env(tmp_path), "JUPYTER_PATH": os.environ["JUPYTER_PATH"]}
    console = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_console",
            f"--kernel={name}",
            "--simple-prompt",
            "--ZMQTerminalInteractiveShell.kernel_timeout=90",
        ],
        input="print(6 * 7, 'from-the-sandbox')\nexit\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert "42 from-the-sandbox" in console.stdout, console.stdout + console.stderr
    wait_for(
        lambda: local_kernel_sessions(tmp_path / "root") == [],
        30,
        "jupyter console left its kernel's session",
    )


def test_a_killed_client_takes_its_kernel_and_session_with_it(tmp_path, monkeypatch):
    name = install_spec(tmp_path, monkeypatch, "--provider", "local")
    env = {**local_env(tmp_path), "JUPYTER_PATH": os.environ["JUPYTER_PATH"]}
    script = tmp_path / "blocking.py"
    script.write_text(BLOCKING_SCRIPT)
    client = subprocess.Popen(
        [sys.executable, str(script), name, "wait"], env=env, stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        lines = []
        while "READY" not in "".join(lines):
            line = client.stdout.readline()
            assert line, "the client ended before its kernel was ready"
            lines.append(line)
        kernel_pid = int("".join(lines).split("OUTPUT")[1].split("]")[0].split(",")[-1].strip(" '\""))
        assert list(
            (tmp_path / "root" / ".sessions").glob("*.json")
        )  # (a live client's session: its sidecar)
        os.kill(client.pid, signal.SIGKILL)
        client.wait(10)

        def kernel_gone() -> bool:
            try:
                os.kill(kernel_pid, 0)
            except ProcessLookupError:
                return True
            state = Path(f"/proc/{kernel_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            return state == "Z"

        wait_for(kernel_gone, 30, "the kernel outlived its killed client")
        wait_for(
            lambda: local_kernel_sessions(tmp_path / "root") == [],
            30,
            "the session outlived its killed client",
        )
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
