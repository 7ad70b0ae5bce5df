"""Docker stops at the contract's edges (issue 15, points 1-3), against the real engine.

* every stop also stops the command's own process when it left its group (setsid);
* a kill has one 5 s bound for the whole stop, even against a frozen engine;
* an exit status that cannot be read is a SandboxError, never an invented one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest

from jupyter_tai_sandbox.contract import (
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
)
from jupyter_tai_sandbox.providers.docker import KILL_LIMIT_SECONDS
from tests.support.docker import disturbs_engine, freeze_engine, provider, running_in, spec, wait_stopped_in

pytestmark = [pytest.mark.docker]

#: the command itself leaves its group, records its own pid, says it is ready, then sleeps
ESCAPE = ["setsid", "sh", "-c", "echo $$ > own.pid; echo ready; exec sleep 30"]


async def pid_file(session, name: str = "own.pid", seconds: float = 10.0) -> int:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(SandboxError):
            text = (await session.get_file(name)).decode().strip()
            if text:
                return int(text)
        assert time.monotonic() < deadline, f"{name} never appeared"
        await asyncio.sleep(0.05)


async def read_until(handle, marker: bytes, seconds: float = 10.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while marker not in seen:
        item = await asyncio.wait_for(handle.output.__anext__(), max(0.01, deadline - time.monotonic()))
        assert isinstance(item, OutputChunk), f"ended before {marker!r}: {seen!r}"
        seen += item.data
    return seen


def in_session(scenario, **traits):
    """Run ``scenario(sandbox, session)`` in a fresh session, destroyed (and the provider closed) after."""

    async def main() -> None:
        sandbox = provider(**traits)
        session = await sandbox.create(spec())
        try:
            await scenario(sandbox, session)
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(asyncio.wait_for(main(), 90))


# ------------------------------------------------------- point 1: setsid


def test_the_deadline_stops_a_command_that_called_setsid(client):
    async def scenario(sandbox, session):
        started = time.monotonic()
        with pytest.raises(SandboxExecTimeoutError) as raised:
            await session.exec(["setsid", "sh", "-c", "echo $$ > own.pid; exec sleep 8"], timeout_seconds=1)
        took = time.monotonic() - started
        assert took < 3.0, f"the deadline answered after {took:.1f} s"
        assert raised.value.note is None  # the command itself ended: its output was not held
        assert await wait_stopped_in(session, await pid_file(session))

    in_session(scenario)


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_kill_stops_an_interactive_command_that_called_setsid(client, pty):
    async def scenario(sandbox, session):
        handle = await session.exec_start(ESCAPE, timeout_seconds=60, pty=pty)
        await read_until(handle, b"ready")
        pid = await pid_file(session)
        started = time.monotonic()
        await handle.kill()
        items = [item async for item in handle.output]
        assert time.monotonic() - started < 3.0
        assert items[-1] == ExitItem(137)
        assert await wait_stopped_in(session, pid)

    in_session(scenario)


def test_a_cancelled_one_shot_stops_a_command_that_called_setsid(client):
    async def scenario(sandbox, session):
        task = asyncio.ensure_future(session.exec(ESCAPE, timeout_seconds=60))
        pid = await pid_file(session)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_stopped_in(session, pid)

    in_session(scenario)


def test_close_stops_interactive_commands_that_called_setsid(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        later = provider()
        try:
            handle = await session.exec_start(ESCAPE, timeout_seconds=60)
            await read_until(handle, b"ready")
            pid = await pid_file(session)
            await sandbox.close()  # the server's shutdown: its interactive commands are stopped
            assert await wait_stopped_in(await later.get(session.id), pid)
        finally:
            await (await later.get(session.id)).destroy()
            await later.close()
            await sandbox.close()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_a_process_the_command_started_that_left_the_group_keeps_running(client):
    script = 'setsid sh -c "echo \\$\\$ > kid.pid; exec sleep 30" </dev/null >/dev/null 2>&1 & echo ready; exec sleep 30'

    async def scenario(sandbox, session):
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=60)
        await read_until(handle, b"ready")
        kid = await pid_file(session, "kid.pid")
        await handle.kill()
        assert [item async for item in handle.output][-1] == ExitItem(137)
        assert await running_in(session, kid)  # exempt: the command started it and it left the group
        await session.exec(["kill", "-9", str(kid)], timeout_seconds=10)

    in_session(scenario)


# ------------------------------------------------ point 2: one 5 s bound


def dockerd_pid() -> int:
    found = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True, check=False).stdout.split()
    if len(found) != 1:
        pytest.skip(f"needs exactly one local dockerd to freeze (pidof found {found or 'none'})")
    return int(found[0])


@disturbs_engine
@pytest.mark.parametrize("transport", ["exec", "auto"])
def test_a_kill_against_a_frozen_engine_raises_within_its_fixed_limit(client, transport):
    """``kill -STOP`` the engine for about 7 s: through the relay ('exec') the kill raises SandboxError at its
    5 s limit, saying what the stop reported, and once the engine is back a kill works; over the direct
    connection ('auto') the kill needs no engine and is done at once. The engine is always resumed."""
    pid = dockerd_pid()

    def resume() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    async def scenario(sandbox, session):
        handle = await session.exec_start(["sleep", "60"], timeout_seconds=60)
        took = None
        timer = threading.Timer(7.0, resume)  # resumes the engine even if the kill hangs
        freeze_engine(pid)
        try:
            timer.start()
            started = time.monotonic()
            if transport == "auto":
                await asyncio.wait_for(handle.kill(), KILL_LIMIT_SECONDS)
                assert [item async for item in handle.output][-1] == ExitItem(137)
                return
            with pytest.raises(SandboxError) as raised:
                await asyncio.wait_for(handle.kill(), KILL_LIMIT_SECONDS + 3)
            took = time.monotonic() - started
        finally:
            resume()
            timer.cancel()
        assert KILL_LIMIT_SECONDS - 0.5 < took < KILL_LIMIT_SECONDS + 1.0, (
            f"the kill raised after {took:.1f} s"
        )
        message = str(raised.value)
        assert f"{KILL_LIMIT_SECONDS:g} s" in message and "reported" in message, message
        await handle.kill()  # the engine answers again: the stop goes through
        assert [item async for item in handle.output][-1] == ExitItem(137)

    try:
        in_session(scenario, agent_transport=transport)
    finally:
        resume()


# ------------------------------------------ point 3: no invented status


@disturbs_engine
def test_a_status_that_cannot_be_read_is_an_error_not_an_invented_exit(client):
    """The session is destroyed while the engine is frozen: the command's output ends at once (the
    provider stops taking it in), the engine cannot give its status, and the output ends with a
    SandboxError -- no exit item."""
    pid = dockerd_pid()

    def resume() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    async def scenario(sandbox, session):
        handle = await session.exec_start(["sh", "-c", "echo ready; exec sleep 30"], timeout_seconds=60)
        await read_until(handle, b"ready")
        timer = threading.Timer(5.0, resume)
        freeze_engine(pid)
        try:
            timer.start()
            destroying = asyncio.ensure_future(session.destroy())
            started = time.monotonic()
            with pytest.raises(SandboxError, match="exit status could not be read") as raised:
                async for item in handle.output:
                    assert not isinstance(item, ExitItem), f"an exit status was invented: {item}"
            took = time.monotonic() - started
        finally:
            resume()
            timer.cancel()
        assert took < 4.0, f"the output ended {took:.1f} s after the destroy"
        assert "destroyed" in str(raised.value)
        await destroying
        await handle.kill()  # nothing left to stop: no error

    try:
        in_session(scenario)
    finally:
        resume()
