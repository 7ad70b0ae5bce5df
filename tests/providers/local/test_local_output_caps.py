"""The two output caps on the local provider: a one-shot's output limit and the unread-output disk cap."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.contract import ExecRequest, OutputChunk, SessionSpec
from jupyter_tai_sandbox.errors import OutputTooLargeError
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.spool import OutputSpool
from tests.support.aio import run


async def with_session(tmp_path, action, **traits):
    sandbox = LocalSandbox(root=str(tmp_path), **traits)
    session = await sandbox.create(SessionSpec(isolation="none"))
    try:
        return await action(session)
    finally:
        await session.destroy()
        await sandbox.close()


def test_a_one_shot_past_its_output_limit_is_stopped_with_the_counts(tmp_path):
    async def action(session):
        started = time.monotonic()
        with pytest.raises(OutputTooLargeError) as refused:
            await session.run(ExecRequest(["yes"], 30, output_limit=1 << 20))
        return refused.value, time.monotonic() - started

    error, took = run(with_session(tmp_path, action))
    assert error.stdout_bytes > 1 << 20 and error.stderr_bytes == 0
    assert took < 10 and "max_output_bytes" in str(error)


def test_unread_output_past_the_disk_cap_stops_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(OutputSpool, "default_disk_limit", 4 << 20)

    async def action(session):
        handle = await session.exec_start(["yes"], timeout_seconds=60)
        await asyncio.sleep(2)  # nobody reads: memory fills, then the disk cap
        received = 0
        started = time.monotonic()
        with pytest.raises(OutputTooLargeError) as stopped:
            async for item in handle.output:
                if isinstance(item, OutputChunk):
                    received += len(item.data)
        await handle.kill()
        return stopped.value, received, time.monotonic() - started

    error, received, took = run(with_session(tmp_path, action, output_memory_bytes=1 << 20))
    assert "max_spill_bytes" in str(error) and took < 10
    # what was kept (memory and disk) is read first, then the error; never more than the caps
    assert 0 < received <= (1 << 20) + (4 << 20) + (1 << 16)
