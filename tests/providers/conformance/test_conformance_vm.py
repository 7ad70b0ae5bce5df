"""The vm provider through the conformance suite's pytest face, one test per check, under TCG (this host has
no hardware KVM: see tests/vm). Needs QEMU and the guest (.ci/vm-up): without them the checks skip, and with
``CI=true`` they fail instead."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support.vm import NothingLeftOfTheCheck, need_qemu, vm_sandbox

pytestmark = [pytest.mark.docker, pytest.mark.slow(220)]


@pytest.fixture(scope="module", autouse=True)
def qemu():
    need_qemu()


class TestVmConformance(NothingLeftOfTheCheck, SandboxConformance):
    def make_sandbox(self, tmp_path):
        return vm_sandbox(tmp_path)
