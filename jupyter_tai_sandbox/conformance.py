"""The conformance suite: what certifies a provider.

``await run_sandbox_conformance(provider)`` runs every check against a live
provider and returns a list of failures, each naming the check and what was
seen; an empty list certifies the provider. Every session the suite creates is
destroyed before it returns (persistent test workspaces included). The checks
use only the commands the session image contract names, plus ``head``,
``printf`` and ``ln`` (checks needing ``ln`` are skipped when it is missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .contract import (
    ISOLATION_ORDER,
    NETWORK_ORDER,
    ExecHandle,
    ExitItem,
    OutputChunk,
    Sandbox,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxSpecRejectedError,
    SessionSpec,
    isolation_rank,
)

KILLED = 137


class CheckFailed(Exception):
    """One expectation of a check did not hold."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


async def expect_raises(error: type[BaseException], action: Awaitable[Any], what: str) -> BaseException:
    try:
        result = await action
    except error as e:
        return e
    except Exception as e:
        raise CheckFailed(f"{what}: expected {error.__name__}, got {type(e).__name__}: {e}") from None
    raise CheckFailed(f"{what}: expected {error.__name__}, got a result {_short(result)}")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


async def drain(handle: ExecHandle) -> tuple[bytes, bytes, list[Any]]:
    """Read a handle's output to its end: (stdout, stderr, items)."""
    items: list[Any] = []
    out, err = bytearray(), bytearray()
    async for item in handle.output:
        items.append(item)
        if isinstance(item, OutputChunk):
            (out if item.stream == "stdout" else err).extend(item.data)
    return bytes(out), bytes(err), items


def exit_items(items: list[Any]) -> list[ExitItem]:
    return [i for i in items if isinstance(i, ExitItem)]


def expect_one_exit(items: list[Any], code: int | None, what: str) -> None:
    exits = exit_items(items)
    expect(len(exits) == 1, f"{what}: expected exactly one exit item, got {len(exits)}")
    expect(items[-1] is exits[0], f"{what}: the exit item is not the last item")
    if code is not None:
        expect(exits[0].exit_code == code, f"{what}: expected exit status {code}, got {exits[0].exit_code}")


class ConformanceSuite:
    """The checks, run one after another; each failure is recorded, not raised."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        image: str | None = None,
        timeout_scale: float = 1.0,
        big_stdin_bytes: int = 16 << 20,
        big_output_bytes: int = 4 << 20,
        check_timeout: float = 120.0,
    ) -> None:
        self.sandbox = sandbox
        self.image = image
        self.scale = timeout_scale
        self.big_stdin_bytes = big_stdin_bytes
        self.big_output_bytes = big_output_bytes
        self.check_timeout = check_timeout
        self.tag = secrets.token_hex(4)
        self.created: list[SandboxSession] = []
        self.failures: list[str] = []

    # -------------------------------------------------------------- helpers

    def t(self, seconds: float) -> float:
        return seconds * self.scale

    def spec(self, **changes: Any) -> SessionSpec:
        return SessionSpec(image=self.image, consumer=f"conformance-{self.tag}", **changes)

    async def session(self, **changes: Any) -> SandboxSession:
        session = await self.sandbox.create(self.spec(**changes))
        self.created.append(session)
        return session

    async def sh(self, session: SandboxSession, script: str, *args: str, timeout: float = 30.0) -> bytes:
        result = await session.exec(["sh", "-c", script, "sh", *args], timeout_seconds=self.t(timeout))
        expect(
            result.exit_code == 0, f"helper command {script!r} exited {result.exit_code}: {result.stderr!r}"
        )
        return result.stdout

    async def read_pid(self, session: SandboxSession, path: str, timeout: float = 5.0) -> str:
        deadline = time.monotonic() + self.t(timeout)
        while time.monotonic() < deadline:
            try:
                pid = (await session.get_file(path)).decode().strip()
            except SandboxNotFoundError:
                pid = ""
            if pid.isdigit():
                return pid
            await asyncio.sleep(0.05)
        raise CheckFailed(f"the command never wrote its pid to {path}")

    async def is_running(self, session: SandboxSession, pid: str) -> bool:
        """Whether ``pid`` is a live process (a zombie counts as stopped)."""
        stat = await self.sh(session, 'cat "/proc/$1/stat" 2>/dev/null || true', pid)
        if not stat.strip():
            return False
        state = stat.rsplit(b")", 1)[-1].split()[0]
        return state not in (b"Z", b"X")

    async def expect_stopped(self, session: SandboxSession, pid: str, what: str) -> None:
        deadline = time.monotonic() + self.t(3)
        while await self.is_running(session, pid):
            if time.monotonic() > deadline:
                raise CheckFailed(f"{what}: process {pid} is still running")
            await asyncio.sleep(0.1)

    async def kill_pid(self, session: SandboxSession, pid: str) -> None:
        await session.exec(["kill", "-9", pid], timeout_seconds=self.t(10))

    async def timed(self, action: Awaitable[Any]) -> tuple[Any, float]:
        start = time.monotonic()
        result = await action
        return result, time.monotonic() - start

    # --------------------------------------------------------------- checks

    async def check_lifecycle(self) -> None:
        ttl = 600.0
        session = await self.session(ttl_seconds=ttl)
        info = await session.info()
        expect(info.id == session.id, f"info().id {info.id!r} differs from the session id {session.id!r}")
        expect(info.kind == self.sandbox.kind, f"info().kind {info.kind!r}, expected {self.sandbox.kind!r}")
        expect(
            abs((info.expires_at - info.created_at) - ttl) < 5, "expires_at is not created_at + ttl_seconds"
        )
        expect(bool(info.workspace), "info().workspace is empty")
        again = await self.sandbox.get(session.id)
        expect(again.id == session.id, "get(id) returned another session")
        listed = [i.id for i in await self.sandbox.list()]
        expect(session.id in listed, "list() does not show a live session")
        result = await session.exec(["echo", "alive"], timeout_seconds=self.t(30))
        expect(result.stdout == b"alive\n", f"echo gave {result.stdout!r}")
        await session.destroy()
        await expect_raises(
            SandboxNotFoundError, self.sandbox.get(session.id), "get() of a destroyed session"
        )
        expect(
            session.id not in [i.id for i in await self.sandbox.list()], "list() shows a destroyed session"
        )
        await expect_raises(
            SandboxError, session.exec(["echo"], timeout_seconds=self.t(5)), "exec in a destroyed session"
        )
        await expect_raises(
            SandboxNotFoundError, self.sandbox.get(f"no-such-{self.tag}"), "get() of an unknown id"
        )

    async def check_credential_env(self) -> None:
        secret = f"s3cret 'quoted' \"double\" $HOME ;{self.tag}"
        session = await self.session(env={"TAI_CONFORMANCE_TOKEN": secret})
        out = await self.sh(session, 'printf %s "$TAI_CONFORMANCE_TOKEN"')
        expect(out == secret.encode(), f"spec.env did not reach the command: got {out!r}")
        result = await session.exec(
            ["sh", "-c", 'printf %s "$TAI_CONFORMANCE_EXTRA"'],
            timeout_seconds=self.t(30),
            env={"TAI_CONFORMANCE_EXTRA": "per-exec"},
        )
        expect(result.stdout == b"per-exec", f"exec env did not reach the command: got {result.stdout!r}")

    async def check_streams_and_status(self) -> None:
        session = await self.session()
        result = await session.exec(
            ["sh", "-c", "echo out; echo err >&2; exit 7"], timeout_seconds=self.t(30)
        )
        expect(result.exit_code == 7, f"exit status {result.exit_code}, expected 7")
        expect(result.stdout == b"out\n", f"stdout {result.stdout!r}, expected b'out\\n'")
        expect(result.stderr == b"err\n", f"stderr {result.stderr!r}, expected b'err\\n'")
        result = await session.exec(["sh", "-c", "kill -9 $$"], timeout_seconds=self.t(30))
        expect(
            result.exit_code == KILLED,
            f"a command killed by SIGKILL reported {result.exit_code}, expected 137",
        )
        for argv, what in (([], "empty argv"), ("echo hi", "a string argv")):
            await expect_raises(SandboxError, session.exec(argv, timeout_seconds=5), what)  # type: ignore[arg-type]
        for timeout in (0, -1, float("nan")):
            await expect_raises(
                SandboxError, session.exec(["echo"], timeout_seconds=timeout), f"timeout_seconds={timeout}"
            )
        await expect_raises(
            SandboxError,
            session.exec_start(["echo"], timeout_seconds=-1),
            "exec_start with timeout_seconds=-1",
        )

    async def check_big_stdin_through_cat(self) -> None:
        session = await self.session()
        data = os.urandom(self.big_stdin_bytes)
        result = await session.exec(["cat"], stdin=data, timeout_seconds=self.t(120))
        expect(result.exit_code == 0, f"cat exited {result.exit_code}: {result.stderr[:200]!r}")
        expect(len(result.stdout) == len(data), f"cat echoed {len(result.stdout)} of {len(data)} bytes")
        expect(result.stdout == data, "cat echoed different bytes than it was given")

    async def check_head_of_big_stdin(self) -> None:
        session = await self.session()
        data = os.urandom(self.big_stdin_bytes)
        timeout = self.t(15)
        try:
            result, took = await self.timed(
                session.exec(["head", "-c", "1"], stdin=data, timeout_seconds=timeout)
            )
        except SandboxExecTimeoutError:
            raise CheckFailed("head -c 1 of a large stdin hit its deadline") from None
        expect(result.exit_code == 0, f"head -c 1 exited {result.exit_code}: {result.stderr[:200]!r}")
        expect(result.stdout == data[:1], f"head -c 1 gave {result.stdout!r}")
        expect(took < timeout, f"head -c 1 took {took:.1f}s")

    async def check_interactive_seam(self) -> None:
        session = await self.session()
        handle = await session.exec_start(["sh", "-c", "echo hi"], timeout_seconds=self.t(30))
        out, _, items = await drain(handle)
        expect(out == b"hi\n", f"interactive echo gave {out!r}")
        expect_one_exit(items, 0, "interactive echo")
        await handle.kill()
        await handle.kill()  # a repeated kill after the exit never raises
        await expect_raises(SandboxError, handle.write(b"late"), "a write after the exit")

        handle = await session.exec_start(["cat"], timeout_seconds=self.t(30))
        await handle.write(b"abc")
        await handle.write(b"def")
        await handle.close_stdin()
        await expect_raises(SandboxError, handle.write(b"x"), "a write after close_stdin")
        out, _, items = await drain(handle)
        expect(out == b"abcdef", f"cat echoed {out!r} of interactive writes")
        expect_one_exit(items, 0, "interactive cat")
        await handle.kill()

    async def check_output_before_kill(self) -> None:
        session = await self.session()
        handle = await session.exec_start(
            ["sh", "-c", "echo before; echo err-before >&2; exec sleep 60"], timeout_seconds=self.t(60)
        )
        await asyncio.sleep(self.t(1.5))  # the provider takes the output in meanwhile
        _, took = await self.timed(handle.kill())
        expect(took < self.t(6), f"kill() took {took:.1f}s")
        (out, err, items), took = await self.timed(drain(handle))
        expect(took < self.t(3), f"the output took {took:.1f}s to end after kill()")
        expect(out == b"before\n", f"output received before kill() was not all yielded after it: {out!r}")
        expect(err == b"err-before\n", f"stderr received before kill() was not yielded after it: {err!r}")
        expect_one_exit(items, KILLED, "a killed command")
        await handle.kill()

    async def check_late_and_slow_reads(self) -> None:
        session = await self.session()
        size = self.big_output_bytes
        script = f"head -c {size} /dev/zero; echo done >&2"
        # late: read only after the command ended and past its (short) deadline
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=self.t(3))
        await asyncio.sleep(self.t(4.5))
        try:
            out, err, items = await drain(handle)
        except SandboxExecTimeoutError:
            raise CheckFailed(
                "a command that ended within its deadline raised a timeout on a late read"
            ) from None
        expect(len(out) == size, f"late read got {len(out)} of {size} stdout bytes")
        expect(err == b"done\n", f"late read got stderr {err!r}")
        expect_one_exit(items, 0, "late read")
        await handle.kill()
        # slow: a reader pausing between chunks
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=self.t(60))
        out, err = bytearray(), bytearray()
        items = []
        async for item in handle.output:
            items.append(item)
            if isinstance(item, OutputChunk):
                (out if item.stream == "stdout" else err).extend(item.data)
                await asyncio.sleep(0.05 if len(items) < 20 else 0)
        expect(len(out) == size, f"slow read got {len(out)} of {size} stdout bytes")
        expect(bytes(err) == b"done\n", f"slow read got stderr {bytes(err)!r}")
        expect_one_exit(items, 0, "slow read")
        await handle.kill()
        # one-shot
        result = await session.exec(["sh", "-c", script], timeout_seconds=self.t(60))
        expect(len(result.stdout) == size, f"one-shot got {len(result.stdout)} of {size} stdout bytes")

    async def check_kill_past_deadline(self) -> None:
        session = await self.session()
        handle = await session.exec_start(["sleep", "60"], timeout_seconds=self.t(1))
        await asyncio.sleep(self.t(2.5))
        await handle.kill()
        try:
            (_, _, items), took = await self.timed(drain(handle))
        except SandboxExecTimeoutError:
            raise CheckFailed("output raised a timeout although kill() had returned") from None
        expect(took < self.t(3), f"the output took {took:.1f}s to end after kill()")
        expect_one_exit(items, KILLED, "kill past the deadline")

    async def check_deadline_kills_unread_command(self) -> None:
        session = await self.session()
        handle = await session.exec_start(
            ["sh", "-c", "echo $$ > unread.pid; echo started; exec sleep 60"], timeout_seconds=self.t(1.5)
        )
        pid = await self.read_pid(session, "unread.pid")
        await asyncio.sleep(self.t(3))  # nobody reads
        await self.expect_stopped(session, pid, "the deadline of a command nobody reads")
        await expect_raises(
            SandboxExecTimeoutError, drain(handle), "reading a command killed at its deadline"
        )
        await handle.kill()

        _, took = await self.timed(
            expect_raises(
                SandboxExecTimeoutError,
                session.exec(["sleep", "60"], timeout_seconds=self.t(1)),
                "one-shot past its deadline",
            )
        )
        expect(took < self.t(1) + 3, f"a one-shot with a 1 s deadline took {took:.1f}s")

    async def check_deadline_kills_command_that_closed_output(self) -> None:
        session = await self.session()
        handle = await session.exec_start(
            ["sh", "-c", "echo $$ > closed.pid; exec >&- 2>&-; exec sleep 60"], timeout_seconds=self.t(1.5)
        )
        pid = await self.read_pid(session, "closed.pid")
        _, took = await self.timed(
            expect_raises(SandboxExecTimeoutError, drain(handle), "a command that closed its output")
        )
        expect(took < self.t(1.5) + 3, f"the timeout came {took:.1f}s after the start")
        await self.expect_stopped(session, pid, "the deadline of a command that closed its output")
        await handle.kill()

    async def check_timeout_byte_counts(self) -> None:
        session = await self.session()
        script = "head -c 1000 /dev/zero; head -c 500 /dev/zero >&2; exec sleep 60"
        error = await expect_raises(
            SandboxExecTimeoutError,
            session.exec(["sh", "-c", script], timeout_seconds=self.t(2)),
            "one-shot byte counts",
        )
        assert isinstance(error, SandboxExecTimeoutError)
        expect(
            (error.stdout_bytes, error.stderr_bytes) == (1000, 500),
            f"one-shot timeout counted {error.stdout_bytes}/{error.stderr_bytes} bytes, expected 1000/500",
        )
        expect(not error.note, f"a timeout whose output ended with the kill carries a note: {error.note!r}")
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=self.t(2))
        await asyncio.sleep(self.t(3.5))
        # the next read raises: output nobody read is not yielded once the timeout is raised
        error = await expect_raises(
            SandboxExecTimeoutError, handle.output.__anext__(), "the first read after the deadline"
        )
        assert isinstance(error, SandboxExecTimeoutError)
        expect(
            (error.stdout_bytes, error.stderr_bytes) == (1000, 500),
            f"interactive timeout counted {error.stdout_bytes}/{error.stderr_bytes}, expected 1000/500",
        )
        await handle.kill()

    async def check_timeout_with_held_output(self) -> None:
        session = await self.session()
        escape = 'setsid sh -c "echo \\$\\$ > $1; echo escaped; exec sleep 60" &'
        pids = []
        try:
            error = await expect_raises(
                SandboxExecTimeoutError,
                session.exec(["sh", "-c", escape, "sh", "held1.pid"], timeout_seconds=self.t(2.5)),
                "one-shot whose output an escaped process holds",
            )
            pids.append(await self.read_pid(session, "held1.pid"))
            assert isinstance(error, SandboxExecTimeoutError)
            expect(bool(error.note), "the timeout of held output carries no note")
            handle = await session.exec_start(
                ["sh", "-c", escape, "sh", "held2.pid"], timeout_seconds=self.t(2.5)
            )
            pids.append(await self.read_pid(session, "held2.pid"))
            error, took = await self.timed(
                expect_raises(SandboxExecTimeoutError, drain(handle), "interactive held output")
            )
            assert isinstance(error, SandboxExecTimeoutError)
            expect(bool(error.note), "the interactive timeout of held output carries no note")
            expect(took < self.t(2.5) + 4, f"the held-output timeout came {took:.1f}s late")
            await handle.kill()
            # kill() ends the output promptly even while the escaped process holds it
            handle = await session.exec_start(
                ["sh", "-c", escape, "sh", "held3.pid"], timeout_seconds=self.t(60)
            )
            pids.append(await self.read_pid(session, "held3.pid"))
            await asyncio.sleep(self.t(0.5))
            await handle.kill()
            try:
                (_out, _, items), took = await self.timed(drain(handle))
            except SandboxExecTimeoutError:
                raise CheckFailed("output raised a timeout although kill() had returned") from None
            expect(took < self.t(3), f"held output took {took:.1f}s to end after kill()")
            expect(len(exit_items(items)) == 1, "held output did not end with one exit item after kill()")
        finally:
            for pid in pids:
                await self.kill_pid(session, pid)

    async def check_group_stopped_after_exit(self) -> None:
        session = await self.session()
        # at the deadline: the command exited, a child in its group holds the output
        await expect_raises(
            SandboxExecTimeoutError,
            session.exec(["sh", "-c", "sleep 60 & echo $! > left1.pid"], timeout_seconds=self.t(2)),
            "one-shot whose child holds its output",
        )
        pid = await self.read_pid(session, "left1.pid")
        await self.expect_stopped(session, pid, "the deadline's stop of a child left in the group")
        # by kill(), after the command's own exit
        handle = await session.exec_start(
            ["sh", "-c", "sleep 60 & echo $! > left2.pid; exit 3"], timeout_seconds=self.t(60)
        )
        pid = await self.read_pid(session, "left2.pid")
        await asyncio.sleep(self.t(0.5))
        expect(
            await self.is_running(session, pid), "the child left in the group is not running before kill()"
        )
        await handle.kill()
        (_, _, items), took = await self.timed(drain(handle))
        expect(took < self.t(3), f"the output took {took:.1f}s to end after kill()")
        expect_one_exit(items, 3, "kill() after the command's own exit")
        await self.expect_stopped(session, pid, "kill() of a child left in the group")

    async def check_file_transfer(self) -> None:
        session = await self.session()
        data = bytes(range(256)) * 4096
        await session.put_file("conf/deep/data.bin", data)
        expect(
            await session.get_file("conf/deep/data.bin") == data,
            "get_file did not return what put_file wrote",
        )
        result = await session.exec(["cat", "conf/deep/data.bin"], timeout_seconds=self.t(30))
        expect(
            result.stdout == data, "a command does not see the file put_file wrote (is cwd the workspace?)"
        )
        await session.put_file("conf/deep/data.bin", b"replaced")
        expect(await session.get_file("conf/deep/data.bin") == b"replaced", "put_file did not replace a file")

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(8):
                yield bytes([i]) * 100_000

        await session.put_file("streamed.bin", chunks())
        expect(
            await session.get_file("streamed.bin") == b"".join(bytes([i]) * 100_000 for i in range(8)),
            "a streamed put_file came back different",
        )
        streamed = b"".join([c async for c in session.iter_file("streamed.bin", 65536)])
        expect(len(streamed) == 800_000, f"iter_file gave {len(streamed)} bytes")
        await self.sh(session, "printf made > made.txt")
        expect(await session.get_file("made.txt") == b"made", "get_file does not see a file a command wrote")
        names = {e["name"]: e for e in await session.list_files(".")}
        expect(names.get("conf", {}).get("type") == "directory", f"list_files shows {names.get('conf')}")
        expect(names.get("made.txt", {}).get("size") == 4, f"list_files shows {names.get('made.txt')}")
        await expect_raises(
            SandboxNotFoundError, session.get_file("missing.txt"), "get_file of a missing file"
        )

    async def check_workspace_paths(self) -> None:
        session = await self.session()
        root = session.resolve(".")
        expect(
            session.resolve("a/b") == root.rstrip("/") + "/a/b",
            f"resolve('a/b') gave {session.resolve('a/b')}",
        )
        expect(
            session.resolve(root + "/x") == root.rstrip("/") + "/x", "an absolute path inside is not accepted"
        )
        pwd = (await self.sh(session, "pwd -P 2>/dev/null || pwd")).decode().strip()
        expect(
            os.path.normpath(pwd) == os.path.normpath(root) or pwd.endswith(os.path.basename(root)),
            f"commands run in {pwd}, not the workspace {root}",
        )
        for bad in ("../x", "/etc/passwd", "a/../../x", "..", "/"):
            try:
                session.resolve(bad)
            except SandboxError:
                pass
            else:
                raise CheckFailed(f"resolve({bad!r}) was accepted: it lies outside the workspace")
            await expect_raises(SandboxError, session.get_file(bad), f"get_file({bad!r})")
        marker = f"tai-conformance-escape-{self.tag}"
        await expect_raises(SandboxError, session.put_file(f"../{marker}", b"x"), "put_file through '..'")
        await expect_raises(
            SandboxError, session.put_file(f"/tmp/{marker}", b"x"), "put_file of an absolute path"
        )
        await expect_raises(
            SandboxError, session.exec(["echo"], timeout_seconds=self.t(5), cwd=".."), "exec with cwd='..'"
        )
        links = await session.exec(
            ["sh", "-c", "ln -s / escape && ln -s /etc/passwd pw"], timeout_seconds=self.t(30)
        )
        if links.exit_code == 127:
            return  # no ln in this image: the symlink half cannot be set up
        expect(links.exit_code == 0, f"could not make the test symlinks: {links.stderr!r}")
        await expect_raises(
            SandboxError, session.get_file("escape/etc/passwd"), "get_file through a symlink out"
        )
        await expect_raises(SandboxError, session.get_file("pw"), "get_file of a symlink to a file outside")
        await expect_raises(
            SandboxError, session.put_file(f"escape/tmp/{marker}", b"x"), "put_file through a symlink out"
        )
        await expect_raises(SandboxError, session.list_files("escape"), "list_files of a symlink out")
        try:
            session.resolve("escape/etc")
        except SandboxError:
            pass
        else:
            raise CheckFailed("resolve() followed a symlink out of the workspace")
        leaked = await session.exec(["ls", f"/tmp/{marker}"], timeout_seconds=self.t(10))
        expect(leaked.exit_code != 0, "a put_file outside the workspace wrote a file")

    async def check_consumer_label(self) -> None:
        consumer = f"conformance-label-{self.tag}"
        session = await self.sandbox.create(SessionSpec(image=self.image, consumer=consumer))
        self.created.append(session)
        expect((await session.info()).consumer == consumer, "info() lost the consumer label")
        listed = {i.id: i for i in await self.sandbox.list()}
        expect(
            session.id in listed and listed[session.id].consumer == consumer, "list() lost the consumer label"
        )
        again = await self.sandbox.get(session.id)
        expect((await again.info()).consumer == consumer, "get() lost the consumer label")
        if self.image is not None:
            expect((await session.info()).image == self.image, "info() lost the image")

    async def check_ttl_reap(self) -> None:
        keeper = await self.session(ttl_seconds=600)
        short = await self.session(ttl_seconds=self.t(1))
        key = f"tai-conformance-{self.tag}"
        durable = await self.session(ttl_seconds=self.t(1), durability="persistent", workspace_key=key)
        await durable.put_file("kept.txt", b"survives the reap")
        await asyncio.sleep(self.t(1.5))
        reaped = await self.sandbox.reap()
        for session in (short, durable):
            expect(session.id in reaped, f"reap() did not report the expired session {session.id}")
            await expect_raises(
                SandboxNotFoundError, self.sandbox.get(session.id), "get() of a reaped session"
            )
        expect(keeper.id not in reaped, "reap() took a session before its TTL")
        await self.sandbox.get(keeper.id)
        back = await self.session(durability="persistent", workspace_key=key)
        try:
            kept = await back.get_file("kept.txt")
        except SandboxNotFoundError:
            kept = b""
        expect(kept == b"survives the reap", "a persistent workspace did not survive its session's reap")
        await back.destroy(remove_workspace=True)
        fresh = await self.session(durability="persistent", workspace_key=key)
        await expect_raises(
            SandboxNotFoundError,
            fresh.get_file("kept.txt"),
            "a file in a workspace removed by destroy(remove_workspace=True)",
        )
        await fresh.destroy(remove_workspace=True)

    async def check_rejects_what_it_cannot_honour(self) -> None:
        before = {i.id for i in await self.sandbox.list()}
        cannot: list[tuple[str, dict[str, Any]]] = []
        for level in ISOLATION_ORDER:
            if isolation_rank(level) > isolation_rank(self.sandbox.max_isolation):
                cannot.append((f"isolation={level!r}", {"isolation": level}))
        for network in NETWORK_ORDER:
            if network not in self.sandbox.networks:
                cannot.append((f"network={network!r}", {"network": network}))
        if not self.sandbox.supports_limits:
            cannot += [("cpu=1", {"cpu": 1.0}), ("memory_mb=256", {"memory_mb": 256})]
        for what, changes in cannot:
            try:
                session = await self.sandbox.create(self.spec(**changes))
            except SandboxSpecRejectedError:
                continue
            except Exception as e:
                raise CheckFailed(
                    f"{what}: expected SandboxSpecRejectedError, got {type(e).__name__}: {e}"
                ) from None
            self.created.append(session)
            raise CheckFailed(f"a spec with {what} was accepted, though the provider cannot honour it")
        for level in ISOLATION_ORDER[: isolation_rank(self.sandbox.max_isolation) + 1]:
            session = await self.session(isolation=level)
            given = (await session.info()).isolation
            expect(isolation_rank(given) >= isolation_rank(level), f"isolation={level!r} got {given!r}")
            await session.destroy()
        after = {i.id for i in await self.sandbox.list()}
        created = {s.id for s in self.created}
        expect(after - before <= created, "a rejected spec left a session behind")

    # ------------------------------------------------------------------ run

    def checks(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        return [
            (name.removeprefix("check_"), getattr(self, name))
            for name in dir(self)
            if name.startswith("check_") and callable(getattr(self, name))
        ]

    async def run(self, only: list[str] | None = None) -> list[str]:
        try:
            for name, check in self.checks():
                if only is not None and name not in only:
                    continue
                try:
                    await asyncio.wait_for(check(), timeout=self.check_timeout * self.scale)
                except CheckFailed as e:
                    self.failures.append(f"{name}: {e}")
                except asyncio.TimeoutError:
                    self.failures.append(
                        f"{name}: did not finish within {self.check_timeout * self.scale:g}s"
                    )
                except Exception as e:
                    self.failures.append(f"{name}: raised {type(e).__name__}: {e}")
        finally:
            await self.cleanup()
        return self.failures

    async def cleanup(self) -> None:
        for session in self.created:
            with contextlib.suppress(SandboxError):
                await session.destroy(remove_workspace=True)
        self.created.clear()


async def run_sandbox_conformance(
    sandbox: Sandbox,
    *,
    image: str | None = None,
    timeout_scale: float = 1.0,
    only: list[str] | None = None,
    **options: Any,
) -> list[str]:
    """Run every check against ``sandbox``; return the failures (empty certifies it).

    ``image``: the session image to ask for (None: the provider's default).
    ``timeout_scale`` stretches every deadline and wait for a slow provider.
    ``only`` runs a subset of the checks, by name (``lifecycle``, ``ttl_reap``...).
    """
    suite = ConformanceSuite(sandbox, image=image, timeout_scale=timeout_scale, **options)
    return await suite.run(only)


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_tai_sandbox.conformance PROVIDER``: certify a provider, print the verdict."""
    import argparse

    from .sandboxes import load_provider_class

    parser = argparse.ArgumentParser(
        prog="python -m jupyter_tai_sandbox.conformance",
        description="Run the sandbox conformance suite against a provider and print what failed.",
    )
    parser.add_argument("provider", help="local, docker, or module:Class")
    parser.add_argument("--image", help="session image to ask for (default: the provider's)")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="stretch every deadline")
    parser.add_argument("--only", action="append", help="run only this check (repeatable)")
    args = parser.parse_args(argv)
    provider = load_provider_class(args.provider)()

    async def certify() -> list[str]:
        try:
            return await run_sandbox_conformance(
                provider, image=args.image, timeout_scale=args.timeout_scale, only=args.only
            )
        finally:
            await provider.close()

    started = time.monotonic()
    failures = asyncio.run(certify())
    for failure in failures:
        print(f"FAIL {failure}")
    verdict = "certified" if not failures else f"{len(failures)} check(s) failed"
    print(f"{provider.kind}: {verdict} in {time.monotonic() - started:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
