"""What the vm tests need: QEMU (Debian's qemu-system-x86) and its guest, from .ci/vm-up; the vm conformance
classes' provider and their check after each check."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import pytest

from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_DEPLOYMENT
from jupyter_tai_sandbox.providers.vm import VmSandbox
from jupyter_tai_sandbox.providers.vm.guest.build import CACHE_ENV, cache_dir
from jupyter_tai_sandbox.providers.vm.guest.qemu import QEMU
from tests.support import RUN_PREFIX
from tests.support.docker import docker_client, in_ci

#: the machine's guest cache, read before any test moves HOME (pytest-jupyter's servers run with a HOME of
#: their own, where a guest and its golden snapshots would be made again, test after test)
MACHINE_CACHE = cache_dir()


def need_qemu() -> None:
    """Skip (fail with ``CI=true``) where QEMU is missing."""
    if shutil.which(QEMU) is None:
        missing(f"{QEMU} (Debian's qemu-system-x86) and its guest")


def missing(what: str) -> None:
    """Skip, saying the vm tests need ``what`` (fail with ``CI=true``: CI installs it all)."""
    message = f"the vm tests need {what} (bash .ci/vm-up)"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def keep_machine_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guests and golden snapshots from the machine's cache, whatever HOME the test gives its server."""
    monkeypatch.setenv(CACHE_ENV, str(MACHINE_CACHE))


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
