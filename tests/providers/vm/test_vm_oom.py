"""A vm session's command the guest kernel's OOM killer ends says so, as a docker session's does (issue 48): the
session agent, as the guest's PID 1, counts the guest's OOM kills (/proc/vmstat). Real QEMU under TCG."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

import pytest

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.providers.vm import VmSandbox
from tests.support.vm import need_qemu

pytestmark = [pytest.mark.slow(60), pytest.mark.timeout(300)]

LIMIT_MB = 160
# one process that grows until the OOM killer takes it (a pipeline's smaller member could be taken first,
# leaving the shell to go on)
HOG = ["sh", "-c", "x=a; while :; do x=$x$x; done; echo survived"]


def test_an_out_of_memory_kill_in_a_vm_session_says_so():
    need_qemu()
    state_dir = tempfile.mkdtemp(prefix="tai-vmo-", dir="/tmp")

    async def main():
        sandbox = VmSandbox(accel="tcg", state_dir=state_dir, deployment="vm-oom-tests")
        try:
            session = await sandbox.create(SessionSpec(memory_mb=LIMIT_MB, network="none"))
            try:
                result = await session.exec(HOG, timeout_seconds=120)
                assert result.exit_code == 137, result
                assert result.reason == f"killed: out of memory (the session's limit is {LIMIT_MB} MiB)", (
                    result
                )
                fine = await session.exec(["sh", "-c", "echo fine"], timeout_seconds=30)
                assert (fine.exit_code, fine.stdout, fine.reason) == (0, b"fine\n", None)
            finally:
                await session.destroy()
        finally:
            await sandbox.close()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
