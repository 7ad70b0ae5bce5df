"""The container base's session, commands and files on a real agent in a real container.

The session is the engine-neutral :class:`ContainerSession`; its engine here is the ``docker`` CLI
(the agent's ``connect`` relay over ``docker exec -i``), its workspace ``/data`` of the test image.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time

import pytest

from jupyter_tai_sandbox.agent import AgentClient
from jupyter_tai_sandbox.contract import (
    ExitItem,
    OutputChunk,
    SandboxConflictError,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxPathError,
    SessionSpec,
)
from jupyter_tai_sandbox.providers.container import KILL_LIMIT_SECONDS, ContainerSession, ContainerSite
from tests.support.agent import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]


async def _inspect(container: str) -> dict:
    proc = await asyncio.create_subprocess_exec(
        "docker", "inspect", container, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    if proc.returncode:
        raise SandboxNotFoundError(f"no container {container}")
    return {"raw": out}


def make_session(s, *, opened: list | None = None) -> ContainerSession:
    async def open_agent(container: str) -> AgentClient:
        if opened is not None:
            opened.append(container)
        return await AgentClient.docker_exec(container)

    async def teardown(session, remove_workspace):
        return None

    site = ContainerSite(
        kind="test",
        isolation="container",
        open_agent=open_agent,
        inspect=_inspect,
        teardown=teardown,
        log=logging.getLogger("test"),
        memory_limit=1 << 20,
        workspace="/data",
    )
    now = time.time()
    return ContainerSession(site, s.name, "sbx-test", SessionSpec(), now, now + 600, env={"GREETING": "hi"})


async def _items(handle) -> list:
    return [item async for item in handle.output]


def test_exec_env_stdin_and_status(session):
    async def go():
        sess = make_session(session)
        try:
            r = await sess.exec(
                ["sh", "-c", 'echo "$GREETING $SANDBOX_WORKSPACE $PWD"; exit 3'], timeout_seconds=30
            )
            assert (r.exit_code, r.stdout) == (3, b"hi /data /data\n")
            big = bytes(range(256)) * (12 << 12)  # 12 MiB: far larger than any buffer
            r = await sess.exec(["cat"], stdin=big, timeout_seconds=60)
            assert r.exit_code == 0 and r.stdout == big
            start = time.monotonic()
            r = await sess.exec(["head", "-c", "1"], stdin=big, timeout_seconds=30)
            assert r.stdout == big[:1] and time.monotonic() - start < 10
            r = await sess.exec(["sh", "-c", "kill -9 $$"], timeout_seconds=30)
            assert r.exit_code == 137
            with pytest.raises(SandboxError, match="no such program"):
                await sess.exec(["no-such-program"], timeout_seconds=30)
        finally:
            await sess.destroy()

    run(go())


def test_one_connection_serves_every_call_and_is_reopened_when_dropped(session):
    async def go():
        opened: list = []
        sess = make_session(session, opened=opened)
        try:
            results = await asyncio.gather(
                *(sess.exec(["echo", str(i)], timeout_seconds=30) for i in range(20))
            )
            assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(20)]
            await sess.put_file("f.txt", b"x")
            assert len(opened) == 1
            client = await sess._channel.client()
            client.process.kill()  # the relay dies: the next call opens a new connection
            await client.process.wait()
            await asyncio.sleep(0.1)
            assert (await sess.exec(["echo", "again"], timeout_seconds=30)).stdout == b"again\n"
            assert len(opened) == 2
        finally:
            await sess.destroy()

    run(go())


def test_deadline_kill_and_group_stops(session):
    async def go():
        sess = make_session(session)
        try:
            # the deadline kills a command nothing reads, with the byte counts of what it gave
            start = time.monotonic()
            with pytest.raises(SandboxExecTimeoutError) as e:
                await sess.exec(["sh", "-c", "printf abc; sleep 30"], timeout_seconds=1)
            assert e.value.stdout_bytes == 3 and e.value.note is None
            assert time.monotonic() - start < 1 + KILL_LIMIT_SECONDS
            # a process that left the group holds the output: the timeout says so
            with pytest.raises(SandboxExecTimeoutError) as e:
                await sess.exec(["sh", "-c", "setsid sleep 30 & echo x; wait"], timeout_seconds=1)
            assert e.value.note and "held" in e.value.note
            # kill(): the output received before it is still read, then one exit item (137)
            h = await sess.exec_start(["sh", "-c", "echo ready; sleep 30"], timeout_seconds=60)
            first = await h.output.__anext__()
            assert first == OutputChunk("stdout", b"ready\n")
            await h.kill()
            rest = await _items(h)
            assert rest == [ExitItem(137)]
            await h.kill()  # again, after the exit: never raises
            # a kill after the exit stops what the command left in its group while it holds the output
            h = await sess.exec_start(
                ["sh", "-c", "(sleep 31; echo late) & echo started"], timeout_seconds=60
            )
            assert await h.output.__anext__() == OutputChunk("stdout", b"started\n")
            await asyncio.sleep(0.3)
            await h.kill()
            items = await _items(h)
            assert items[-1] == ExitItem(0)
            left = await sess.exec(["sh", "-c", "ps | grep -c '[s]leep 31' || true"], timeout_seconds=30)
            assert left.stdout.strip() == b"0"
        finally:
            await sess.destroy()

    run(go())


def test_interactive_write_after_exit_late_reads_and_pty(session):
    async def go():
        sess = make_session(session)
        try:
            h = await sess.exec_start(["cat"], timeout_seconds=30)
            await h.write(b"hello\n")
            await h.close_stdin()
            assert await _items(h) == [OutputChunk("stdout", b"hello\n"), ExitItem(0)]
            with pytest.raises(SandboxError):
                await h.write(b"more")
            # a command that ended within its deadline returns its whole output, however late it is read
            h = await sess.exec_start(["sh", "-c", "yes 0123456789 | head -c 5000000"], timeout_seconds=30)
            await asyncio.sleep(3)
            data = b"".join(i.data for i in await _items(h) if isinstance(i, OutputChunk))
            assert len(data) == 5_000_000
            await h.kill()
            # a terminal: its size, and ^D at close_stdin
            h = await sess.exec_start(
                ["sh", "-c", "stty size; cat"], timeout_seconds=30, pty=True, rows=7, cols=33
            )
            out = b""
            while b"7 33" not in out:
                out += (await h.output.__anext__()).data
            await h.resize(10, 40)
            await h.close_stdin()
            items = await _items(h)
            assert items[-1] == ExitItem(0)
        finally:
            await sess.destroy()

    run(go())


def test_files_are_confined_by_the_agent(session):
    async def go():
        sess = make_session(session)
        try:
            await sess.put_file("a/b/c.txt", b"data")
            assert await sess.get_file("/data/a/b/c.txt") == b"data"

            async def chunks():
                for i in range(5):
                    yield bytes([i]) * (700 << 10)

            await sess.put_file("big.bin", chunks())
            got = [c async for c in sess.iter_file("big.bin", chunk_size=1 << 20)]
            assert b"".join(got) == b"".join(bytes([i]) * (700 << 10) for i in range(5)) and len(got) == 4
            names = {e["name"]: e["type"] for e in await sess.list_files(".")}
            assert names["a"] == "directory" and names["big.bin"] == "file"
            assert await sess.resolve_path("a/b") == "/data/a/b"
            assert sess.resolve("a/x") == "/data/a/x"
            await sess.exec(["ln", "-s", "/etc", "/data/escape"], timeout_seconds=30)
            for bad in ("../etc/passwd", "/etc/passwd"):
                with pytest.raises(SandboxPathError):
                    await sess.get_file(bad)
            with pytest.raises(SandboxPathError):
                await sess.get_file("escape/passwd")
            with pytest.raises(SandboxPathError):
                await sess.put_file("escape/x", b"no")
            with pytest.raises(SandboxPathError):
                sess.resolve("escape/x")
            with pytest.raises(SandboxPathError):
                await sess.exec(["true"], cwd="escape", timeout_seconds=30)
            with pytest.raises(SandboxNotFoundError):
                await sess.get_file("missing")
            await sess.make_folder("m/n")
            with pytest.raises(SandboxConflictError):
                await sess.make_folder("big.bin")
            await sess.move_path("a/b/c.txt", "m/n/c.txt")
            with pytest.raises(SandboxConflictError):
                await sess.move_path("big.bin", "m/n/c.txt")
            await sess.remove_path("m")
            with pytest.raises(SandboxNotFoundError):
                await sess.remove_path("m")
            r = await sess.exec(["ls", "/data"], cwd="a", timeout_seconds=30)
            assert sorted(r.stdout.split()) == [b"a", b"big.bin", b"escape"]
        finally:
            await sess.destroy()

    run(go())


def test_a_dead_agent_fails_every_call_promptly(session):
    async def go():
        sess = make_session(session)
        try:
            h = await sess.exec_start(["sleep", "60"], timeout_seconds=120)
            subprocess.run(["docker", "kill", session.name], check=True, capture_output=True)
            start = time.monotonic()
            with pytest.raises(SandboxError) as e:
                await _items(h)
            assert not isinstance(e.value, SandboxExecTimeoutError)  # never an invented status
            for call in (sess.exec(["true"], timeout_seconds=30), sess.get_file("x"), sess.list_files()):
                with pytest.raises(SandboxError):
                    await call
            assert time.monotonic() - start < 15
        finally:
            await sess.destroy()

    run(go())
