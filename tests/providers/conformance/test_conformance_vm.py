"""The vm provider through the conformance suite's pytest face, one test per check, under TCG (this host has
no hardware KVM: see tests/vm). Needs QEMU and the guest (.ci/vm-up): without them the checks skip, and with
``CI=true`` they fail instead."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import pytest

from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_DEPLOYMENT
from jupyter_tai_sandbox.providers.vm import VmSandbox
from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support import RUN_PREFIX
from tests.support.docker import docker_client
from tests.support.vm import need_qemu

pytestmark = [pytest.mark.docker, pytest.mark.slow(220)]


@pytest.fixture(scope="module", autouse=True)
def qemu():
    need_qemu()


def vm_sandbox(tmp_path: Path) -> VmSandbox:
    """A provider of the check's own: its state in a short folder (the agent's sockets live there)."""
    state = Path("/tmp") / f"tai-vm-{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:10]}"
    return VmSandbox(accel="tcg", state_dir=str(state), deployment=f"{RUN_PREFIX}vmconf-{state.name[7:]}")


class NothingLeftOfTheCheck:
    """A vm conformance class's own check after each check."""

    @pytest.fixture(autouse=True)
    def nothing_is_left(self, tmp_path):
        """After every check: no session of the check's provider is listed, its folder holds none, and the
        engine holds no seat or bridge of its sessions on a network."""
        yield
        sandbox = vm_sandbox(tmp_path)
        try:
            assert asyncio.run(sandbox.list()) == []
            assert sandbox._machines.ids() == []
            client = docker_client()
            try:
                mine = {"label": f"{LABEL_DEPLOYMENT}={sandbox.scope.labels[LABEL_DEPLOYMENT]}"}
                assert client.containers.list(all=True, filters=mine) == []
                assert client.networks.list(filters=mine) == []
            finally:
                client.close()
        finally:
            shutil.rmtree(Path(sandbox.state_dir), ignore_errors=True)


class TestVmConformance(NothingLeftOfTheCheck, SandboxConformance):
    def make_sandbox(self, tmp_path):
        return vm_sandbox(tmp_path)
