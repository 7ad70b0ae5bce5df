"""What the vm tests need: QEMU (Debian's qemu-system-x86) and its guest, from .ci/vm-up."""

from __future__ import annotations

import shutil

import pytest

from jupyter_tai_sandbox.vm.qemu import QEMU
from tests.support.docker import in_ci


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
