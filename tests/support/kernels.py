"""Sandboxed kernels outside a server: a kernelspec the CLI installs, the notebook the provisioner tests
run through nbclient and what they check in it, and a local session for the tunnel tests."""

from __future__ import annotations

import contextlib
import queue
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client import AsyncKernelManager
from nbclient import NotebookClient

from jupyter_tai_sandbox.cli import main as cli
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.kernels.provisioner import SandboxProvisioner
from jupyter_tai_sandbox.providers.local import LocalSandbox


@contextlib.asynccontextmanager
async def local_session(tmp_path):
    sandbox = LocalSandbox(root=str(tmp_path / "root"))
    session = await sandbox.create(SessionSpec(isolation="none", consumer="tunnel-test"))
    try:
        yield session
    finally:
        await session.destroy()
        await sandbox.close()


@contextlib.asynccontextmanager
async def started_kernel(name: str) -> AsyncIterator[tuple[AsyncKernelManager, Any]]:
    """A kernel of kernelspec ``name`` started here (no server) and its client, ready; shut down at once after."""
    km = AsyncKernelManager(kernel_name=name)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


#: the interrupted cell's deadline in nbclient; the interrupt must land within INTERRUPT_LIMIT after it
SLEEP_CELL_TIMEOUT = 2


INTERRUPT_LIMIT = 5.0


SECRET = "TAI_TEST_SERVER_SECRET"


def notebook() -> Any:
    cells = [
        "x = 41",
        "import os, socket, sys\nx += 1\n"
        "print(x, os.path.exists('/.dockerenv'), socket.gethostname(), os.getcwd(), sep='|')",
        f"print(repr(os.environ.get({SECRET!r})))",
        "from IPython.display import HTML\nHTML('<b>rich</b>')",
        "import time\ntime.sleep(60)",
        "print('after the interrupt', x)",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.cells[4].metadata["tags"] = ["raises-exception"]
    return nb


def stdout(cell: Any) -> str:
    return "".join(
        o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout"
    )


def install_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str, name: str = "sbx-test") -> str:
    prefix = tmp_path / "prefix"
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    assert cli(["kernelspec", "install", "--name", name, "--prefix", str(prefix), *args]) == 0
    return name


async def drain_iopub(kc: Any, quiet_seconds: float = 0.3) -> int:
    """Take what waits in the client's IOPub queue until it stays quiet ``quiet_seconds``; how many."""
    taken = 0
    while True:
        try:
            await kc.get_iopub_msg(timeout=quiet_seconds)
        except queue.Empty:
            return taken
        taken += 1


async def run_notebook(kernel_name: str, *, restart_check: Any = None) -> dict[str, Any]:
    """Run notebook() cell by cell, then restart the kernel and run one more cell; return what was seen."""
    nb = notebook()
    client = NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=60,
        startup_timeout=90,
        interrupt_on_timeout=True,
        timeout_func=lambda cell: SLEEP_CELL_TIMEOUT if "sleep" in cell.source else 60,
    )
    seen: dict[str, Any] = {}
    started = time.monotonic()
    async with client.async_setup_kernel():
        seen["start_seconds"] = time.monotonic() - started
        provisioner = client.km.provisioner
        assert isinstance(provisioner, SandboxProvisioner)
        seen["first_session"] = provisioner.session.id
        seen["first_info"] = await provisioner.session.info()
        for index, cell in enumerate(nb.cells):
            t0 = time.monotonic()
            await client.async_execute_cell(cell, index)
            if "sleep" in cell.source:
                seen["sleep_cell_seconds"] = time.monotonic() - t0
        seen["cells"] = list(nb.cells)
        await client.km.restart_kernel()
        # the old kernel's last messages (its shutdown_reply and status) wait in the client's IOPub queue:
        # wait_for_ready takes any IOPub message as the new kernel's IOPub being connected, so a stale one
        # would let the next cell run before it is, and its output go unseen (jupyter_server nudges for this)
        await drain_iopub(client.kc)
        await client.kc.wait_for_ready(timeout=90)
        seen["second_session"] = provisioner.session.id
        if restart_check is not None:
            await restart_check(seen["first_session"])
        after = nbformat.v4.new_code_cell("import os\nprint('x' in globals(), os.getcwd(), sep='|')")
        nb.cells.append(after)
        await client.async_execute_cell(after, len(nb.cells) - 1)
        seen["after_restart"] = stdout(after)
    return seen


def check_notebook(seen: dict[str, Any], *, in_container: bool) -> str:
    cells = seen["cells"]
    x, dockerenv, hostname, cwd = stdout(cells[1]).strip().split("|")
    assert x == "42"
    assert cwd == seen["first_info"].workspace  # the kernel runs in its session's workspace
    if in_container:  # (this machine may be a container itself: compare hostnames too)
        assert dockerenv == "True" and hostname != socket.gethostname()
    else:
        assert hostname == socket.gethostname()
    assert stdout(cells[2]).strip() == "None"  # the server's environment does not reach the kernel
    rich = [o for o in cells[3].outputs if o.output_type == "execute_result"]
    assert rich and rich[0].data["text/html"] == "<b>rich</b>"
    errors = [o for o in cells[4].outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "KeyboardInterrupt"
    assert seen["sleep_cell_seconds"] < SLEEP_CELL_TIMEOUT + INTERRUPT_LIMIT, seen["sleep_cell_seconds"]
    assert stdout(cells[5]).strip() == "after the interrupt 42"  # the same kernel, its state kept
    assert seen["second_session"] != seen["first_session"]  # a restart is a fresh session
    assert seen["after_restart"].split("|")[0] == "False"
    info = seen["first_info"]
    assert info.consumer.startswith("kernel:")
    assert info.owner is None  # nbclient starts it outside any request: no user owns it (admins see it)
    return hostname
