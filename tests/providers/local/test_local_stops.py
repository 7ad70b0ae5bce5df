"""sandbox-local stops the command's own process on every stop, and never invents an exit status.

A command is not its group's leader, so it may call setsid; every stop (deadline,
kill, failed or cancelled one-shot, cancelled start, teardown) still stops it. Real
processes throughout; "stopped" is read from /proc (a zombie is stopped).
"""

import asyncio
import contextlib
import errno
import os
import secrets
import time

import pytest

from jupyter_tai_sandbox.contract import (
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
    SessionSpec,
)
from tests.support.aio import run
from tests.support.processes import kill_quietly, pids_running, running, wait_stopped


def unique_sleep() -> tuple[str, str]:
    """A ``sleep`` argument no other process has, to find the command by its command line."""
    seconds = f"29.{secrets.randbelow(10**6):06d}"
    return seconds, f"sleep\x00{seconds}"


async def first_pid(handle) -> int:
    item = await asyncio.wait_for(handle.output.__anext__(), 10)
    assert isinstance(item, OutputChunk), item
    return int(item.data)


ESCAPES = ["setsid", "sh", "-c", "echo $$; exec sleep 30"]


def test_deadline_stops_a_one_shot_that_called_setsid_at_the_deadline(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        script = "echo $$ > cmd.pid; exec sleep 8"
        start = time.monotonic()
        try:
            with pytest.raises(SandboxExecTimeoutError, match="killed"):
                await session.exec(["setsid", "sh", "-c", script], timeout_seconds=1)
            assert time.monotonic() - start < 3, "the deadline waited for the command's own end"
            pid = int(await session.get_file("cmd.pid"))
            assert await wait_stopped(pid, 1)
        finally:
            await session.destroy()

    run(scenario())


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_interactive_deadline_stops_a_command_that_called_setsid(sandbox, pty):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(ESCAPES, timeout_seconds=1, pty=pty)
        pid = await first_pid(handle)
        start = time.monotonic()
        try:
            with pytest.raises(SandboxExecTimeoutError):
                async for _ in handle.output:
                    pass
            assert time.monotonic() - start < 3
            assert await wait_stopped(pid, 1)
        finally:
            kill_quietly(pid)
            await handle.kill()
            await session.destroy()

    run(scenario())


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_kill_stops_an_interactive_command_that_called_setsid_promptly(sandbox, pty):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(ESCAPES, timeout_seconds=60, pty=pty)
        pid = await first_pid(handle)
        try:
            start = time.monotonic()
            await asyncio.wait_for(handle.kill(), 3)
            assert time.monotonic() - start < 2
            items = [item async for item in handle.output]
            # the real wait status of a process killed by SIGKILL: 128 + 9
            assert items[-1] == ExitItem(137)
            assert await wait_stopped(pid, 1), "kill() left the command itself running"
        finally:
            kill_quietly(pid)
            await session.destroy()

    run(scenario())


def test_cancelled_one_shot_stops_a_command_that_called_setsid(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        task = asyncio.create_task(
            session.exec(["setsid", "sh", "-c", "echo $$ > cmd.pid; exec sleep 30"], timeout_seconds=60)
        )
        pid = None
        try:
            for _ in range(200):
                with contextlib.suppress(SandboxError, ValueError):
                    pid = int(await session.get_file("cmd.pid"))
                    break
                await asyncio.sleep(0.02)
            assert pid is not None
            await asyncio.sleep(0.1)  # past the exec of sleep
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 3)
            assert await wait_stopped(pid, 1)
        finally:
            kill_quietly(pid)
            await session.destroy()

    run(scenario())


def test_failed_one_shot_stops_a_command_that_called_setsid(sandbox):
    """A child holding the stdin with input unwritten fails the one-shot: the command itself is stopped."""

    async def scenario():
        session = await sandbox.create(SessionSpec())
        # the command leaves its group, starts a child holding its stdin, then exits: it fails;
        # here the command's own process outlives that by being the child's parent
        script = (
            "exec 3<&0; sleep 30 <&3 >/dev/null 2>&1 3<&- & echo $! > child.pid; "
            "exec 0<&- 3<&- >/dev/null 2>&1; echo $$ > cmd.pid; exec sleep 30"
        )
        try:
            with pytest.raises(SandboxError):
                await asyncio.wait_for(
                    session.exec(["setsid", "sh", "-c", script], stdin=b"x" * (4 << 20), timeout_seconds=2),
                    10,
                )
            pid = int(await session.get_file("cmd.pid"))
            assert await wait_stopped(pid, 1)
        finally:
            with contextlib.suppress(SandboxError, ValueError):
                kill_quietly(int(await session.get_file("child.pid")))
            await session.destroy()

    run(scenario())


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_cancelled_start_stops_a_command_that_called_setsid(sandbox, pty):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        seconds, marker = unique_sleep()
        task = asyncio.create_task(
            session.exec_start(["setsid", "sh", "-c", f"exec sleep {seconds}"], timeout_seconds=60, pty=pty)
        )
        try:
            await asyncio.sleep(0)  # the start has spawned the command and waits for its pipes
            assert not task.done()
            time.sleep(0.5)  # the loop is held: the command leaves its group meanwhile
            assert pids_running(marker), "the command did not start"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if not pids_running(marker):
                    break
                await asyncio.sleep(0.02)
            assert pids_running(marker) == []
        finally:
            for pid in pids_running(marker):
                kill_quietly(pid)
            await session.destroy()

    run(scenario())


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_teardown_stops_interactive_commands_that_called_setsid(sandbox, pty):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(ESCAPES, timeout_seconds=60, pty=pty)
        pid = await first_pid(handle)
        try:
            await asyncio.wait_for(session.destroy(), 3)
            assert await wait_stopped(pid, 1)
        finally:
            kill_quietly(pid)

    run(scenario())


def test_what_the_command_started_outside_its_group_stays_exempt(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        # the escaped child prints its own pid once it has left the group
        script = "setsid sh -c 'echo $$; exec sleep 30' & wait"
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=60)
        pid = await first_pid(handle)
        try:
            await handle.kill()
            await asyncio.sleep(0.2)
            assert running(pid), "a process the command started that left the group is not stopped"
        finally:
            kill_quietly(pid)
            await session.destroy()

    run(scenario())


def test_an_exit_status_that_cannot_be_read_raises_instead_of_255(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(["sh", "-c", "echo $$; exec sleep 0.3"], timeout_seconds=30)
        pid = await first_pid(handle)
        os.waitpid(pid, 0)  # reaped behind the provider's back (blocking its loop): the status is gone
        try:
            with pytest.raises(SandboxError, match="exit status could not be read"):
                async for item in handle.output:
                    assert not isinstance(item, ExitItem), f"invented {item}"
        finally:
            await handle.kill()
            await session.destroy()

    run(scenario())


def test_a_pty_whose_status_never_arrives_raises_instead_of_a_made_up_one(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(
            ["sh", "-c", "echo $PPID $$; exec sleep 30"], timeout_seconds=30, pty=True
        )
        seen = b""
        while b"\n" not in seen:
            seen += (await asyncio.wait_for(handle.output.__anext__(), 10)).data
        holder, pid = map(int, seen.split())  # the pty holder is the command's parent
        os.kill(holder, 9)  # it can no longer report the command's status
        try:
            with pytest.raises(SandboxError, match="exit status could not be read"):
                async for item in handle.output:
                    assert not isinstance(item, ExitItem), f"invented {item}"
            await asyncio.wait_for(handle.kill(), 3)
            assert await wait_stopped(pid, 1)  # the terminal hung up on it
        finally:
            kill_quietly(pid)
            await session.destroy()

    run(scenario())


def test_a_command_killed_at_its_deadline_after_its_status_was_read_keeps_it(sandbox):
    """kill() after the exit: the status stays the command's own, not 137."""

    async def scenario():
        session = await sandbox.create(SessionSpec())
        for pty in (False, True):
            handle = await session.exec_start(["sh", "-c", "exit 7"], timeout_seconds=30, pty=pty)
            await asyncio.sleep(0.3)
            await handle.kill()
            assert [item async for item in handle.output][-1] == ExitItem(7)
        await session.destroy()

    run(scenario())


def test_setsid_command_is_stopped_where_the_kernel_has_no_pidfd(sandbox, monkeypatch):
    def no_pidfd(pid, flags=0):
        raise OSError(errno.ENOSYS, "pidfd_open is not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)

    async def scenario():
        session = await sandbox.create(SessionSpec())
        start = time.monotonic()
        with pytest.raises(SandboxExecTimeoutError):
            await session.exec(["setsid", "sh", "-c", "echo $$ > cmd.pid; exec sleep 8"], timeout_seconds=1)
        assert time.monotonic() - start < 3
        assert await wait_stopped(int(await session.get_file("cmd.pid")), 1)
        for pty in (False, True):
            handle = await session.exec_start(ESCAPES, timeout_seconds=60, pty=pty)
            pid = await first_pid(handle)
            try:
                await asyncio.wait_for(handle.kill(), 3)
                assert [item async for item in handle.output][-1] == ExitItem(137)
                assert await wait_stopped(pid, 1)
            finally:
                kill_quietly(pid)
        await session.destroy()

    run(scenario())
