"""Every docker session has a disk ceiling the kernel enforces: nothing it writes lands on the
engine host's disk without bound (issue 24, point 7).

The root filesystem is read-only; the ephemeral workspace and /tmp are tmpfs of at most
``DockerSandbox.disk_limit_mb``. A write past the ceiling fails with ENOSPC, from a command and
from an upload alike, and the container's writable layer stays empty.
"""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox.contract import ExecRequest, SandboxError, SessionSpec
from tests.support.docker import docker_client, provider

pytestmark = [pytest.mark.timeout(180), pytest.mark.docker]


async def sh(session, script: str) -> tuple[int, str]:
    result = await session.run(ExecRequest(["sh", "-c", script], timeout_seconds=60))
    return result.exit_code, (result.stdout + result.stderr).decode(errors="replace")


def written_to_engine_disk(container_id: str) -> int:
    """Bytes in the container's writable layer on the engine's storage."""
    client = docker_client()
    try:
        answer = client.api._result(
            client.api._get(client.api._url("/containers/{0}/json", container_id), params={"size": 1}), True
        )
        return answer.get("SizeRw") or 0
    finally:
        client.close()


def test_a_default_session_cannot_write_past_its_disk_ceiling():
    async def main() -> None:
        sandbox = provider(disk_limit_mb=16)
        session = await sandbox.create(SessionSpec())
        try:
            for where in ("/workspace", "/tmp"):
                code, out = await sh(session, f"dd if=/dev/zero of={where}/fill bs=1M count=64 2>&1")
                assert "No space left on device" in out, out
                code, out = await sh(session, f"du -m {where}/fill | cut -f1; rm {where}/fill")
                assert code == 0 and int(out.split()[0]) <= 16, out
            code, out = await sh(session, "echo x > /etc/planted 2>&1; echo x > /planted 2>&1")
            assert code != 0 and "Read-only file system" in out, out
            # what a session writes is not on the engine's disk
            await sh(session, "head -c 8000000 /dev/zero > /workspace/eight-mb; cp /workspace/eight-mb /tmp/")
            assert written_to_engine_disk(session.container_id) < 1 << 20
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_an_upload_past_the_ceiling_fails_and_leaves_the_session_usable():
    async def main() -> None:
        sandbox = provider(disk_limit_mb=8)
        session = await sandbox.create(SessionSpec())
        try:
            with pytest.raises(SandboxError):
                await session.put_file("big.bin", b"\0" * (12 << 20))
            await session.put_file("small.txt", b"still works")
            assert await session.get_file("small.txt") == b"still works"
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_the_default_ceiling_is_the_documented_size_and_commands_run_from_tmp():
    async def main() -> None:
        sandbox = provider()
        assert sandbox.disk_limit_mb == 2048
        session = await sandbox.create(SessionSpec())
        try:
            code, out = await sh(session, "df -m /workspace /tmp | tail -n 2")
            assert code == 0, out
            sizes = [int(line.split()[1]) for line in out.splitlines()]
            assert sizes == [2048, 2048], out
            code, out = await sh(
                session,
                "printf '#!/bin/sh\\necho ran-from-tmp\\n' > /tmp/run.sh; chmod +x /tmp/run.sh; /tmp/run.sh",
            )
            assert code == 0 and "ran-from-tmp" in out, out
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_no_ceiling_keeps_a_writable_root_when_the_operator_asks():
    async def main() -> None:
        sandbox = provider(disk_limit_mb=0)
        session = await sandbox.create(SessionSpec())
        try:
            code, out = await sh(session, "echo x > /etc/allowed && cat /etc/allowed")
            assert (code, out.strip()) == (0, "x")
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())
