"""An interactive command whose reader reads, only slower than it writes, is paced (its pipes wait), not
spilled to disk; a reader that stops reading is not waited for (the output spills as before)."""

from __future__ import annotations

import asyncio

from jupyter_tai_sandbox import spool as spool_module
from jupyter_tai_sandbox.contract import ExitItem, OutputChunk, SessionSpec
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.providers.local import command as command_module
from jupyter_tai_sandbox.providers.local.command import LocalCommand
from jupyter_tai_sandbox.spool import PACE_IDLE_SECONDS
from tests.support.aio import run

MEMORY = 1 << 20
TOTAL = 32 << 20


async def in_session(tmp_path, action):
    sandbox = LocalSandbox(root=str(tmp_path), output_memory_bytes=MEMORY)
    session = await sandbox.create(SessionSpec(isolation="none"))
    try:
        return await action(session)
    finally:
        await session.destroy()
        await sandbox.close()


def test_a_slow_reader_paces_the_command_without_a_spill_file(tmp_path, monkeypatch):
    # a loaded machine may hold the reader back longer than the pacing waits: not what this test is about
    monkeypatch.setattr(command_module, "PACE_IDLE_SECONDS", 60.0)
    monkeypatch.setattr(spool_module, "PACE_IDLE_SECONDS", 60.0)

    async def action(session):
        handle = await session.exec_start(["head", "-c", str(TOTAL), "/dev/zero"], timeout_seconds=60)
        assert isinstance(handle, LocalCommand)
        command, spool = handle, handle._spool
        received, ahead, exit_code = 0, 0, None
        async for item in handle.output:
            if isinstance(item, ExitItem):
                exit_code = item.exit_code
                continue
            assert isinstance(item, OutputChunk)
            received += len(item.data)
            assert spool._file is None  # never spilled: the command waited for its reader
            ahead = max(ahead, command._counts["stdout"] - received)
            await asyncio.sleep(0.001)  # slower than head writes
        return received, ahead, exit_code

    received, ahead, exit_code = run(in_session(tmp_path, action), timeout=60)
    assert received == TOTAL and exit_code == 0
    # what the command wrote beyond what was read: the spool's memory and a read or two, never the rest
    assert ahead <= MEMORY + (1 << 20)


def test_a_reader_that_stops_reading_is_not_waited_for(tmp_path):
    async def action(session):
        handle = await session.exec_start(["head", "-c", str(TOTAL), "/dev/zero"], timeout_seconds=60)
        assert isinstance(handle, LocalCommand)
        command, received = handle, 0
        output = handle.output.__aiter__()
        while received < 2 * MEMORY:  # reads a little, then takes a pause longer than the pacing waits
            item = await output.__anext__()
            assert isinstance(item, OutputChunk)
            received += len(item.data)
        for _ in range(100):
            await asyncio.sleep(PACE_IDLE_SECONDS)
            if command._exited.done():
                break
        finished_unread = command._exited.done()  # head wrote everything meanwhile: it went to disk
        async for item in output:
            if isinstance(item, OutputChunk):
                received += len(item.data)
        return finished_unread, received

    finished_unread, received = run(in_session(tmp_path, action), timeout=90)
    assert finished_unread and received == TOTAL
