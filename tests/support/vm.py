"""What the vm tests need: QEMU (Debian's qemu-system-x86) and its guest, from .ci/vm-up."""

from __future__ import annotations

import shutil

import pytest

from jupyter_tai_sandbox.providers.vm.guest.build import CACHE_ENV, cache_dir
from jupyter_tai_sandbox.providers.vm.guest.qemu import QEMU
from tests.support.docker import in_ci

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
