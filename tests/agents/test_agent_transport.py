"""AgentProcess: a session's command as the ACP connection's process (stdin writer, stdout reader), on real
sessions: the local provider (its commands are real host processes) and a docker session (its commands
held by the session agent, so a detached one runs on)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from jupyter_tai_sandbox.agents.transport import STDERR_TAIL_BYTES, AgentProcess
from jupyter_tai_sandbox.contract import ExecRequest, SessionSpec
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.aio import run

ECHO_LINES = [sys.executable, "-u", "-c", "import sys\nfor line in sys.stdin: sys.stdout.write(line.upper())"]


@pytest.fixture
def sandbox(tmp_path):
    return LocalSandbox(root=str(tmp_path))


def test_stdin_and_stdout_carry_lines_in_order_and_drain_waits_for_the_write(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        try:
            proc = AgentProcess(await session.exec_start(ECHO_LINES, timeout_seconds=60))
            assert isinstance(proc.stdin, asyncio.StreamWriter) and isinstance(
                proc.stdout, asyncio.StreamReader
            )
            assert proc.pid is None and proc.returncode is None
            for i in range(200):  # many small writes queued before one drain: one pump, in order
                proc.stdin.write(f"line {i}\n".encode())
            assert proc.stdin.transport.get_write_buffer_size() > 0
            await proc.stdin.drain()
            assert proc.stdin.transport.get_write_buffer_size() == 0
            got = [await proc.stdout.readline() for _ in range(200)]
            assert got == [f"LINE {i}\n".encode() for i in range(200)]
            proc.stdin.close()
            await proc.stdin.wait_closed()
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            assert await proc.stdout.read() == b""
        finally:
            await session.destroy()

    run(scenario(), 60)


def test_exit_status_reason_stderr_tail_and_a_write_after_the_exit_is_a_broken_pipe(sandbox):
    code = "import sys\nsys.stderr.write('x' * 20000 + '\\nlast words\\n')\nsys.exit(7)"

    async def scenario():
        session = await sandbox.create(SessionSpec())
        try:
            proc = AgentProcess(await session.exec_start([sys.executable, "-c", code], timeout_seconds=60))
            assert await asyncio.wait_for(proc.wait(), 20) == 7
            assert proc.returncode == 7
            tail = proc.stderr_tail()
            assert tail.endswith("last words\n") and len(tail) <= STDERR_TAIL_BYTES
            assert await proc.stdout.read() == b""  # stderr never reaches the ACP stream
            with pytest.raises(BrokenPipeError):
                proc.stdin.write(b"{}\n")
                await proc.stdin.drain()
        finally:
            await session.destroy()

    run(scenario(), 60)


def test_stderr_is_logged_line_by_line_with_long_lines_cut(sandbox, caplog):
    code = "import sys\nsys.stderr.write('hello from the agent\\n' + 'y' * 50000 + '\\n')"

    async def scenario():
        session = await sandbox.create(SessionSpec())
        try:
            proc = AgentProcess(await session.exec_start([sys.executable, "-c", code], timeout_seconds=60))
            await asyncio.wait_for(proc.wait(), 20)
        finally:
            await session.destroy()

    with caplog.at_level("INFO", logger="jupyter_tai_sandbox.agents.transport"):
        run(scenario(), 60)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("agent stderr:")]
    assert lines[0] == "agent stderr: hello from the agent"
    assert lines[1].endswith("[line cut]") and len(lines[1]) < 2100


def test_a_flood_of_stdout_is_held_back_not_buffered(sandbox):
    """The agent writes 40 MB while nobody reads: the reader's buffer stays at 2 * limit + one piece, and
    once read, every byte arrives in order."""
    limit = 64 << 10
    lines, width = 4000, 10_000
    code = f"import sys\nfor i in range({lines}): sys.stdout.write(str(i).rjust({width - 1}) + '\\n')"

    async def scenario():
        session = await sandbox.create(SessionSpec())
        try:
            proc = AgentProcess(
                await session.exec_start([sys.executable, "-c", code], timeout_seconds=120),
                stdout_limit=limit,
            )
            await asyncio.sleep(1.5)  # the command writes on; nothing reads
            most = len(proc.stdout._buffer)
            assert most <= 2 * limit + (64 << 10), most
            for i in range(lines):
                line = await proc.stdout.readline()
                assert line == str(i).rjust(width - 1).encode() + b"\n"
                most = max(most, len(proc.stdout._buffer))
                if i % 500 == 0:
                    await asyncio.sleep(0.05)  # a slow consumer: the feeding waits for it
            assert most <= 2 * limit + (64 << 10), most
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_kill_ends_the_command_even_when_nobody_reads_its_output(sandbox):
    code = "import sys\nwhile True: sys.stdout.write('z' * 65536)"

    async def scenario():
        session = await sandbox.create(SessionSpec())
        try:
            proc = AgentProcess(
                await session.exec_start([sys.executable, "-c", code], timeout_seconds=120), stdout_limit=4096
            )
            await asyncio.sleep(0.5)
            assert proc.returncode is None
            await proc.kill()
            status = await asyncio.wait_for(proc.wait(), 10)
            assert status != 0
            assert len(proc.stdout._buffer) <= 2 * 4096 + 4096
        finally:
            await session.destroy()

    run(scenario(), 60)


def test_detach_stops_reading_and_leaves_the_local_command_running_until_killed(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        try:
            handle = await session.exec_start(ECHO_LINES, timeout_seconds=60)
            proc = AgentProcess(handle)
            proc.stdin.write(b"one\n")
            assert await proc.stdout.readline() == b"ONE\n"
            await proc.detach()
            assert proc.detached and proc.returncode is None
            assert await proc.stdout.read() == b""  # the reader's stream ended here
            with pytest.raises(BrokenPipeError):
                proc.stdin.write(b"two\n")
            await handle.write(b"still there\n")  # the command itself still reads its stdin
            await handle.kill()
        finally:
            await session.destroy()

    run(scenario(), 60)


# ------------------------------------------------------------------ docker


@pytest.mark.docker
def test_docker_a_detached_agent_runs_on_in_its_session_and_a_new_process_attaches_to_it():
    """A line-echo program in a docker session: AgentProcess talks to it, detaches (the server's stop), the
    session still holds it running (held_commands), and an AgentProcess over attach_command talks on."""
    docker_support = pytest.importorskip("tests.support.docker")
    from jupyter_tai_sandbox.images import PYTHON_IMAGE

    docker_support.python_image().close()
    echo = ["python3", "-u", "-c", "import sys\nfor line in sys.stdin: sys.stdout.write(line.upper())"]

    async def scenario():
        sandbox = docker_support.provider()
        session = await sandbox.create(
            docker_support.spec("agents-transport", image=PYTHON_IMAGE, ttl_seconds=300)
        )
        try:
            request = ExecRequest(echo, 240, label="acp:test")
            first = AgentProcess(await session.start(request))
            first.stdin.write(b"before\n")
            await first.stdin.drain()
            assert await asyncio.wait_for(first.stdout.readline(), 30) == b"BEFORE\n"
            await first.detach()
            held = [c for c in await session.held_commands() if c.label == "acp:test"]
            assert len(held) == 1 and held[0].running, held
            await asyncio.sleep(0.5)
            again = [c for c in await session.held_commands() if c.label == "acp:test"]
            assert again[0].running
            ends = {stream: end for stream, (_, end) in again[0].offsets.items()}
            second = AgentProcess(await session.attach_command(again[0].id, ends))
            second.stdin.write(b"after\n")
            await second.stdin.drain()
            assert await asyncio.wait_for(second.stdout.readline(), 30) == b"AFTER\n"
            await second.kill()
            assert await asyncio.wait_for(second.wait(), 20) != 0
        finally:
            await session.destroy()
            await sandbox.close()

    run(scenario(), 240)


@pytest.mark.docker
def test_docker_a_flood_from_a_session_command_is_held_back():
    docker_support = pytest.importorskip("tests.support.docker")
    from jupyter_tai_sandbox.images import PYTHON_IMAGE

    docker_support.python_image().close()
    code = "import sys\nfor i in range(2000): sys.stdout.write(str(i).rjust(9999) + '\\n')"
    limit = 32 << 10

    async def scenario():
        sandbox = docker_support.provider()
        session = await sandbox.create(
            docker_support.spec("agents-transport", image=PYTHON_IMAGE, ttl_seconds=300)
        )
        try:
            proc = AgentProcess(
                await session.exec_start(["python3", "-c", code], timeout_seconds=120), stdout_limit=limit
            )
            await asyncio.sleep(2)
            most = len(proc.stdout._buffer)
            count = 0
            while line := await proc.stdout.readline():
                assert json.loads(line) == count
                count += 1
                most = max(most, len(proc.stdout._buffer))
            assert count == 2000 and most <= 2 * limit + limit, most
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            await session.destroy()
            await sandbox.close()

    run(scenario(), 240)
