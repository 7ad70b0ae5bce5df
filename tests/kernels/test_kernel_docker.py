"""Sandboxed kernels on docker: nbclient runs the notebook in a container with network none.

Needs the Python image (``jupyter tai-sandbox build-image --python``; .ci/docker-up builds it).
"""

from __future__ import annotations

import asyncio
import time

import nbformat
import pytest
from nbclient import NotebookClient

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.policy import SandboxPolicy
from tests.support.docker import RUN_FILTER, RUN_LABEL, leftovers, python_image
from tests.support.kernels import check_notebook, install_spec, notebook, run_notebook

pytestmark = [pytest.mark.timeout(300), pytest.mark.docker]


@pytest.fixture
def engine():
    client = python_image()
    try:
        yield client
    finally:
        # whatever happened, nothing of this run stays on the engine
        for container in client.containers.list(all=True, filters={"label": RUN_FILTER}):
            container.remove(force=True)
        client.close()


def docker_sandbox(**traits):
    from jupyter_tai_sandbox.providers.docker import DockerSandbox

    return DockerSandbox(image=PYTHON_IMAGE, extra_labels=RUN_LABEL, pool_size=0, **traits)


def test_notebook_in_a_container_with_network_none(tmp_path, monkeypatch, engine):
    name = install_spec(tmp_path, monkeypatch, "--network", "none")
    monkeypatch.setenv("TAI_TEST_SERVER_SECRET", "do-not-leak")

    async def main():
        sandbox = docker_sandbox()
        sandboxes.register_sandbox(sandbox, policy=SandboxPolicy(isolation="container"))

        async def check_gone(first: str) -> None:
            # the restart destroyed the first session's container
            assert first not in {info.id for info in await sandbox.list()}
            # one listing with the names (another run may remove a container between a listing and a look)
            assert all(first not in name for c in engine.api.containers(all=True) for name in c["Names"])

        try:
            return await run_notebook(name, restart_check=check_gone)
        finally:
            await sandbox.close()

    seen = asyncio.run(main())
    hostname = check_notebook(seen, in_container=True)
    info = seen["first_info"]
    assert info.isolation == "container" and info.spec.network == "none"
    assert info.image == PYTHON_IMAGE
    assert hostname
    assert leftovers(engine) == []  # shutdown removed the container


def test_a_vm_floor_fails_the_start_with_the_policy_message(tmp_path, monkeypatch, engine):
    name = install_spec(tmp_path, monkeypatch)
    sandboxes.register_sandbox(docker_sandbox(), policy=SandboxPolicy(isolation="vm"))
    started = time.monotonic()
    # a kernel-start error comes in lines of at most 72 characters: any whitespace between words
    with pytest.raises(
        Exception, match=r"gives\s+isolation\s+'container'\s+at\s+most;\s+isolation\s+'vm'\s+was\s+requested"
    ):
        NotebookClient(notebook(), kernel_name=name, startup_timeout=60).execute()
    assert time.monotonic() - started < 10
    assert leftovers(engine) == []


def test_an_egress_ceiling_refuses_a_kernel_asking_for_egress(tmp_path, monkeypatch, engine):
    name = install_spec(tmp_path, monkeypatch, "--network", "egress")
    sandboxes.register_sandbox(docker_sandbox(), policy=SandboxPolicy(isolation="container", egress="none"))
    with pytest.raises(Exception, match=r"exceeds\s+the\s+operator's\s+egress\s+ceiling"):
        NotebookClient(notebook(), kernel_name=name, startup_timeout=60).execute()
    assert leftovers(engine) == []


def test_a_kernelspec_allow_list_puts_the_kernel_behind_its_owners_egress_gateway(
    tmp_path, monkeypatch, engine
):
    name = install_spec(tmp_path, monkeypatch, "--egress-allow", "pypi.org")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import socket\n"
            "def lookup(name):\n"
            "    try:\n"
            "        return sorted({a[4][0] for a in socket.getaddrinfo(name, 443, socket.AF_INET)})\n"
            "    except socket.gaierror as e:\n"
            "        return 'refused: ' + type(e).__name__\n"
            "print(lookup('pypi.org'), lookup('example.com'), sep='|')"
        )
    ]

    async def main():
        sandbox = docker_sandbox()
        sandboxes.register_sandbox(sandbox, policy=SandboxPolicy(isolation="container"))
        try:
            client = NotebookClient(nb, kernel_name=name, startup_timeout=120)
            await client.async_execute()
        finally:
            await sandbox.close()

    asyncio.run(main())
    allowed, refused = "".join(o.get("text", "") for o in nb.cells[0].outputs).strip().split("|")
    # the allowed name answers the gateway's own address; the other is refused by the gateway's DNS
    assert allowed.startswith("['10.") and refused == "refused: gaierror", (allowed, refused)
    assert leftovers(engine) == []
