"""What the vm tests need: QEMU (Debian's qemu-system-x86) and its guest, from .ci/vm-up."""

from __future__ import annotations

import shutil

import pytest

from jupyter_tai_sandbox.vm.qemu import QEMU
from tests.support.docker import in_ci


def need_qemu() -> None:
    """Skip (fail with ``CI=true``) where QEMU is missing."""
    if shutil.which(QEMU) is None:
        message = f"the vm provider needs {QEMU} and its guest (bash .ci/vm-up)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
