"""The conformance suite: what certifies a provider.

``await run_sandbox_conformance(provider)`` runs every check against a live
provider at full strength and returns a list of failures, each naming the
check and what was seen; an empty list certifies the provider. A run that is
not a certification -- a subset of the checks (``only``), smaller payloads or a
stretched ``timeout_scale`` -- never returns a bare ``[]``: its list ends with
an entry starting ``"not a certification: "``. An unknown check name raises
ValueError. Every session the suite creates is destroyed before it returns
(persistent test workspaces included).

The same checks have a pytest face for provider authors,
:class:`jupyter_tai_sandbox.testing.SandboxConformance`, where each check is its
own test. The checks use only the commands the session image contract names,
plus ``head``, ``printf``, ``stty`` and ``ln`` (checks needing ``ln`` are
skipped when it is missing).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
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
INTERRUPTED = 130  # 128 + SIGINT

#: The payload sizes a certifying run uses; smaller ones are a weakened run.
FULL_STRENGTH = {"big_stdin_bytes": 16 << 20, "big_output_bytes": 4 << 20}
#: The most a certifying run may stretch the suite's deadlines and waits (a loaded CI machine).
MAX_CERTIFYING_TIMEOUT_SCALE = 2.0
#: How an entry of a run that certifies nothing starts.
NOT_A_CERTIFICATION = "not a certification"


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
        big_stdin_bytes: int = FULL_STRENGTH["big_stdin_bytes"],
        big_output_bytes: int = FULL_STRENGTH["big_output_bytes"],
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

    # ------------------------------------------------------ pty (a terminal)

    async def read_until(self, handle: ExecHandle, pattern: bytes, what: str, timeout: float = 10.0) -> bytes:
        """Read a handle's output until ``pattern`` (a regular expression) shows; return what was read."""
        seen = bytearray()
        deadline = time.monotonic() + self.t(timeout)
        while not re.search(pattern, seen):
            left = deadline - time.monotonic()
            try:
                item = await asyncio.wait_for(handle.output.__anext__(), max(0.01, left))
            except asyncio.TimeoutError:
                raise CheckFailed(
                    f"{what}: no {pattern!r} within {self.t(timeout):g}s: {bytes(seen[-300:])!r}"
                ) from None
            except StopAsyncIteration:
                raise CheckFailed(
                    f"{what}: the output ended before {pattern!r}: {bytes(seen[-300:])!r}"
                ) from None
            if not isinstance(item, OutputChunk):
                raise CheckFailed(
                    f"{what}: the command ended ({item!r}) before {pattern!r}: {bytes(seen[-300:])!r}"
                )
            seen += item.data
        return bytes(seen)

    async def check_pty_window_and_resize(self) -> None:
        """A pty command starts on a 24x80 terminal (or the rows x cols asked), and follows a resize."""
        session = await self.session()
        for size, expected in (({}, b"24 80"), ({"rows": 30, "cols": 100}, b"30 100")):
            handle = await session.exec_start(["stty", "size"], timeout_seconds=self.t(30), pty=True, **size)
            out, _, items = await drain(handle)
            expect(expected in out, f"stty size on a pty started with {size or 'no size'} printed {out!r}")
            expect_one_exit(items, 0, "stty size on a pty")
            await handle.kill()
        handle = await session.exec_start(["sh", "-i"], timeout_seconds=self.t(60), pty=True)
        try:
            await handle.resize(40, 120)
            await handle.write(b"stty size\n")
            await self.read_until(handle, rb"40 120", "stty size after resize(40, 120)")
            await handle.resize(33, 91)
            await handle.write(b"stty size\n")
            await self.read_until(handle, rb"33 91", "stty size after a second resize(33, 91)")
            # ^C interrupts the shell's foreground job, not the shell
            await handle.write(b"sleep 30\n")
            await asyncio.sleep(self.t(0.5))
            await handle.write(b"\x03")
            await handle.write(b"echo interrupted-$?\n")
            await self.read_until(handle, rb"interrupted-130", "^C of the shell's foreground sleep")
            # end-of-file ends the shell like a user's ^D would
            await handle.write(b"exit 5\n")
            (_, _, items), took = await self.timed(drain(handle))
            expect(took < self.t(5), f"the terminal's output took {took:.1f}s to end after `exit 5`")
            expect_one_exit(items, 5, "an interactive shell on a pty that ran `exit 5`")
        finally:
            await handle.kill()
        handle = await session.exec_start(["cat"], timeout_seconds=self.t(30), pty=True)
        await handle.write(b"hello\n")
        await handle.close_stdin()
        out, _, items = await drain(handle)
        expect(
            out.count(b"hello") == 2, f"cat on a pty, then close_stdin: {out!r} (expected the echo and cat's)"
        )
        expect_one_exit(items, 0, "cat on a pty after close_stdin (end of file)")
        await handle.kill()

    async def check_pty_ctrl_c(self) -> None:
        """^C written to a pty interrupts the running command: its exit status is 130."""
        session = await self.session()
        handle = await session.exec_start(
            ["sh", "-c", "echo ready; sleep 30"], timeout_seconds=self.t(60), pty=True
        )
        try:
            await self.read_until(handle, rb"ready", "a pty command's first line")
            await asyncio.sleep(self.t(0.3))
            await handle.write(b"\x03")
            (_, _, items), took = await self.timed(drain(handle))
            expect(took < self.t(5), f"the output took {took:.1f}s to end after ^C")
            expect_one_exit(items, INTERRUPTED, "`sh -c 'sleep 30'` on a pty after ^C")
        finally:
            await handle.kill()

    async def check_pty_stop_ends_the_terminal_session(self) -> None:
        """kill() and the deadline stop a terminal's whole session, jobs in groups of their own too."""
        session = await self.session()
        for stop in ("kill", "deadline"):
            timeout = self.t(60) if stop == "kill" else self.t(3)
            handle = await session.exec_start(["sh", "-i"], timeout_seconds=timeout, pty=True)
            try:
                # an interactive shell moves its background job to a process group of its own
                await handle.write(b"sleep 60 & echo job-$!\n")
                seen = await self.read_until(handle, rb"job-(\d+)\r?\n", f"a background job ({stop})")
                found = re.search(rb"job-(\d+)\r?\n", seen)
                assert found is not None
                pid = found.group(1).decode()
                expect(
                    await self.is_running(session, pid), f"the terminal's job {pid} is not running ({stop})"
                )
                if stop == "kill":
                    _, took = await self.timed(handle.kill())
                    expect(took < self.t(6), f"kill() of a terminal took {took:.1f}s")
                    (_, _, items), took = await self.timed(drain(handle))
                    expect(took < self.t(3), f"the terminal's output took {took:.1f}s to end after kill()")
                    expect_one_exit(items, KILLED, "a killed terminal")
                else:
                    _, took = await self.timed(
                        expect_raises(SandboxExecTimeoutError, drain(handle), "a terminal past its deadline")
                    )
                await self.expect_stopped(session, pid, f"the {stop}'s stop of a terminal's background job")
            finally:
                await handle.kill()

    # ------------------------------------------------------- cancelled calls

    async def cmdline_holds(self, session: SandboxSession, token: str) -> bool:
        """Whether a live process has ``token`` in its command line."""
        listing = await self.sh(session, "cat /proc/[0-9]*/cmdline 2>/dev/null; true")
        return token.encode() in listing

    async def expect_none_running(self, session: SandboxSession, token: str, what: str) -> None:
        await asyncio.sleep(self.t(0.5))  # a stop still on its way gets its moment
        deadline = time.monotonic() + self.t(3)
        while await self.cmdline_holds(session, token):
            if time.monotonic() > deadline:
                raise CheckFailed(f"{what}: a process it started is still running")
            await asyncio.sleep(0.1)

    def token(self) -> str:
        """A sleep time no other process is likely to have on its command line."""
        return f"59.{secrets.randbelow(10**6):06d}"

    async def check_cancelled_one_shot_stops_its_group(self) -> None:
        """A cancelled one-shot (the task awaiting exec is cancelled) stops the command and its group."""
        session = await self.session()
        script = "echo $$ > one.pid; sleep 60 & echo $! > child.pid; wait"
        task = asyncio.create_task(session.exec(["sh", "-c", script], timeout_seconds=self.t(60)))
        try:
            command = await self.read_pid(session, "one.pid")
            child = await self.read_pid(session, "child.pid")
        except CheckFailed:
            task.cancel()
            raise
        expect(not task.done(), f"the one-shot ended before it was cancelled: {task!r}")
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=self.t(6))
        expect(task in done, "a cancelled one-shot did not end within 6 s")
        expect(task.cancelled(), f"a cancelled one-shot ended otherwise: {task!r}")
        await self.expect_stopped(session, command, "a cancelled one-shot's command")
        await self.expect_stopped(session, child, "a cancelled one-shot's child in its group")

    async def check_cancelled_start_leaves_nothing_running(self) -> None:
        """A cancelled exec_start (the awaiting task is cancelled mid-start) leaves nothing running."""
        session = await self.session()
        token = self.token()
        script = f"sleep {token} & wait"
        # cancel after ever more event-loop turns, then ever longer, until a start beats its cancel
        delays: list[tuple[str, float]] = [("turns", n) for n in (0, 1, 2, 3, 5, 8, 13)]
        delays += [("seconds", s) for s in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)]
        for unit, amount in delays:
            task = asyncio.create_task(session.exec_start(["sh", "-c", script], timeout_seconds=self.t(60)))
            if unit == "turns":
                for _ in range(int(amount)):
                    await asyncio.sleep(0)
            else:
                await asyncio.sleep(amount)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=self.t(6))
            expect(task in done, f"an exec_start cancelled after {amount:g} {unit} did not end within 6 s")
            if task.cancelled():
                continue
            error = task.exception()
            if error is not None:
                raise CheckFailed(
                    f"an exec_start cancelled after {amount:g} {unit} raised {type(error).__name__}: {error}"
                )
            await task.result().kill()  # the start won the race: later cancels would come later still
            break
        await self.expect_none_running(session, token, "a cancelled exec_start")

    # -------------------------------------------------------------- stdin

    @contextlib.contextmanager
    def loop_errors(self) -> Any:
        """Collect what the event loop reports meanwhile (a task's exception nobody retrieved...)."""
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()
        seen: list[str] = []
        loop.set_exception_handler(
            lambda _loop, context: seen.append(str(context.get("message")) + f" {context.get('exception')!r}")
        )
        try:
            yield seen
        finally:
            gc.collect()  # a task's unretrieved exception is reported when the task is collected
            loop.set_exception_handler(previous)

    async def outcome(self, action: Awaitable[Any]) -> Any:
        """What ``action`` returned, or the exception it raised."""
        try:
            return await action
        except Exception as e:
            return e

    async def check_failed_stdin_write_is_one_error(self) -> None:
        """A failed stdin write raises one SandboxError; a command that closed its stdin is no failure.

        "One": the call raises a single SandboxError (never an OSError, and nothing else is left for
        the event loop to report, such as a feeder task's exception nobody retrieved).
        """
        session = await self.session()
        data = os.urandom(self.big_stdin_bytes)
        with self.loop_errors() as reported:
            # a command killed while its one-shot stdin is fed closed its stdin: the result still comes back
            task = asyncio.create_task(
                session.exec(
                    ["sh", "-c", "echo $$ > fed.pid; exec sleep 60"], stdin=data, timeout_seconds=self.t(60)
                )
            )
            try:
                await self.kill_pid(session, await self.read_pid(session, "fed.pid"))
            except BaseException:
                task.cancel()
                raise
            done, _ = await asyncio.wait({task}, timeout=self.t(6))
            expect(task in done, "a one-shot whose command was killed while its stdin was fed did not end")
            error = task.exception()
            if error is not None:
                raise CheckFailed(
                    "a one-shot whose command was killed (closing its stdin) while its stdin was fed raised "
                    f"{type(error).__name__}: {error}, not its result"
                )
            expect(task.result().exit_code == KILLED, f"it reported exit status {task.result().exit_code}")
            # an interactive write still pending when its command is killed fails with one SandboxError
            handle = await session.exec_start(["sleep", "60"], timeout_seconds=self.t(60))
            writer = asyncio.create_task(handle.write(data))
            await asyncio.sleep(self.t(0.5))
            await handle.kill()
            done, _ = await asyncio.wait({writer}, timeout=self.t(5))
            expect(writer in done, "a pending write did not end after kill()")
            error = writer.exception()
            expect(
                error is None or isinstance(error, SandboxError),
                f"a pending write failed with {type(error).__name__}: {error}, not a SandboxError",
            )
            await expect_raises(SandboxError, handle.write(b"x"), "a write after kill()")
            # a command that exits while a process it started still holds its stdin, input unwritten:
            # the provider returns the result (the input is dropped) or fails the call with one
            # SandboxError and stops the group (sandbox-local), never anything else
            script = "sleep 60 <&0 >/dev/null 2>&1 & echo $! > holder.pid; exit 0"
            outcome, took = await self.timed(
                self.outcome(session.exec(["sh", "-c", script], stdin=data, timeout_seconds=self.t(30)))
            )
            holder = await self.read_pid(session, "holder.pid")
            expect(took < self.t(10), f"a one-shot whose child held its stdin took {took:.1f}s")
            if isinstance(outcome, BaseException):
                expect(
                    isinstance(outcome, SandboxError) and not isinstance(outcome, SandboxExecTimeoutError),
                    f"a one-shot whose child held its stdin raised {type(outcome).__name__}: {outcome}",
                )
                await self.expect_stopped(session, holder, "the group of a one-shot whose stdin write failed")
            else:
                expect(outcome.exit_code == 0, f"a one-shot whose child held its stdin gave {outcome!r}")
                await self.kill_pid(session, holder)
            # a one-shot fed stdin while its session goes away: its result or one SandboxError
            other = await self.session()
            task = asyncio.create_task(other.exec(["sleep", "60"], stdin=data, timeout_seconds=self.t(4)))
            await asyncio.sleep(self.t(1))
            await other.destroy()
            done, _ = await asyncio.wait({task}, timeout=self.t(4) + 6)
            expect(task in done, "a one-shot fed stdin did not end after its session was destroyed")
            error = task.exception()
            expect(
                error is None or isinstance(error, SandboxError),
                f"a one-shot whose session went away mid-stdin raised {type(error).__name__}: {error}",
            )
            await asyncio.sleep(0)
        expect(not reported, f"besides the one error, the event loop reported: {reported}")

    # ------------------------------------------------- a command that calls setsid

    async def check_setsid_command_is_stopped(self) -> None:
        """A command that itself calls setsid is still the command: its deadline and kill() stop it."""
        session = await self.session()
        script = "echo $$ > $1; echo started; exec sleep 30"
        pids: list[str] = []
        try:
            # a one-shot at its deadline
            _, took = await self.timed(
                expect_raises(
                    SandboxExecTimeoutError,
                    session.exec(["setsid", "sh", "-c", script, "sh", "ss1.pid"], timeout_seconds=self.t(1)),
                    "a one-shot that called setsid, past its deadline",
                )
            )
            pids.append(await self.read_pid(session, "ss1.pid"))
            expect(took < self.t(1) + 2, f"a setsid one-shot with a 1 s deadline took {took:.1f}s")
            await self.expect_stopped(session, pids[-1], "the deadline of a one-shot that called setsid")
            # an interactive command at its deadline
            handle = await session.exec_start(
                ["setsid", "sh", "-c", script, "sh", "ss2.pid"], timeout_seconds=self.t(1)
            )
            pids.append(await self.read_pid(session, "ss2.pid"))
            _, took = await self.timed(
                expect_raises(
                    SandboxExecTimeoutError, drain(handle), "an interactive command that called setsid"
                )
            )
            expect(
                took < self.t(1) + 2, f"a setsid command's 1 s deadline answered {took:.1f}s after the start"
            )
            await self.expect_stopped(
                session, pids[-1], "the deadline of an interactive command that called setsid"
            )
            await handle.kill()
            # kill()
            handle = await session.exec_start(
                ["setsid", "sh", "-c", script, "sh", "ss3.pid"], timeout_seconds=self.t(60)
            )
            pids.append(await self.read_pid(session, "ss3.pid"))
            _, took = await self.timed(handle.kill())
            expect(took < self.t(3), f"kill() of a command that called setsid took {took:.1f}s")
            (_, _, items), took = await self.timed(drain(handle))
            expect(took < self.t(3), f"the output took {took:.1f}s to end after kill()")
            expect_one_exit(items, KILLED, "a killed command that called setsid")
            await self.expect_stopped(session, pids[-1], "kill() of a command that called setsid")
        finally:
            for pid in pids:
                with contextlib.suppress(SandboxError):
                    await self.kill_pid(session, pid)

    # ------------------------------------------------------------------ run

    async def run_check(self, name: str) -> str | None:
        """Run one check by name; return its failure, or None when it passed."""
        check = getattr(self, f"check_{name}")
        limit = self.check_timeout * self.scale
        try:
            await asyncio.wait_for(check(), timeout=limit)
        except CheckFailed as e:
            return f"{name}: {e}"
        except asyncio.TimeoutError:
            return f"{name}: did not finish within {limit:g}s"
        except Exception as e:
            return f"{name}: raised {type(e).__name__}: {e}"
        return None

    async def run(self, names: list[str]) -> list[str]:
        """Run the named checks in order; return their failures (no verdict on certification)."""
        try:
            for name in names:
                failure = await self.run_check(name)
                if failure is not None:
                    self.failures.append(failure)
        finally:
            await self.cleanup()
        left = [i.id for i in await self.sandbox.list() if self.tag in i.consumer]
        if left:
            self.failures.append(f"cleanup: sessions the suite destroyed are still listed: {left}")
        return self.failures

    async def cleanup(self) -> None:
        for session in self.created:
            with contextlib.suppress(SandboxError):
                await session.destroy(remove_workspace=True)
        self.created.clear()


def check_names() -> list[str]:
    """Every check of the suite, by name, in the order a run takes them."""
    return [name.removeprefix("check_") for name in vars(ConformanceSuite) if name.startswith("check_")]


def check_doc(name: str) -> str:
    """The one-line description of a check."""
    doc = getattr(ConformanceSuite, f"check_{name}").__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else name.replace("_", " ")


def selected_checks(only: list[str] | None) -> list[str]:
    """The checks ``only`` names, in suite order; ValueError for an unknown name or an empty selection."""
    every = check_names()
    if only is None:
        return every
    if isinstance(only, str):
        raise ValueError(f"only must be a list of check names, not the string {only!r}")
    unknown = [name for name in only if name not in every]
    if unknown:
        raise ValueError(f"unknown conformance check(s) {unknown}; the checks are: {', '.join(every)}")
    if not only:
        raise ValueError("only=[] selects no check: pass None to run them all")
    return [name for name in every if name in only]


def weakenings(*, timeout_scale: float = 1.0, **options: Any) -> list[str]:
    """What about these options makes a run weaker than a certification asks (empty: full strength).

    ValueError for an option the suite cannot run with at all.
    """
    if not (isinstance(timeout_scale, (int, float)) and math.isfinite(timeout_scale) and timeout_scale > 0):
        raise ValueError(f"timeout_scale must be a finite number > 0, not {timeout_scale!r}")
    found = []
    if timeout_scale > MAX_CERTIFYING_TIMEOUT_SCALE:
        found.append(
            f"timeout_scale={timeout_scale:g} stretches the deadlines past the certifying "
            f"{MAX_CERTIFYING_TIMEOUT_SCALE:g}"
        )
    for option, full in FULL_STRENGTH.items():
        value = options.get(option, full)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{option} must be a positive int, not {value!r}")
        if value < full:
            found.append(f"{option}={value} is below the full-strength {full}")
    return found


async def run_checks(
    sandbox: Sandbox,
    names: list[str],
    *,
    image: str | None = None,
    timeout_scale: float = 1.0,
    **options: Any,
) -> list[str]:
    """Run the named checks against ``sandbox``; return their failures.

    A building block (the pytest face runs one check at a time with it): an
    empty return says these checks passed, and certifies nothing. Use
    :func:`run_sandbox_conformance` to certify a provider.
    """
    names = selected_checks(names)
    weakenings(timeout_scale=timeout_scale, **options)  # raises for options the suite cannot use
    suite = ConformanceSuite(sandbox, image=image, timeout_scale=timeout_scale, **options)
    return await suite.run(names)


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
    ``timeout_scale`` stretches every deadline and wait for a slow provider
    (up to ``MAX_CERTIFYING_TIMEOUT_SCALE`` a run still certifies).
    ``only`` runs a subset of the checks, by name (``lifecycle``, ``ttl_reap``...;
    see :func:`check_names`); an unknown name raises ValueError. A subset, or
    ``big_stdin_bytes``/``big_output_bytes`` below full strength, or a larger
    ``timeout_scale``, is no certification: the list then ends with entries
    starting ``"not a certification: "``, so it is never empty.
    """
    names = selected_checks(only)
    notices = [f"{NOT_A_CERTIFICATION}: {w}" for w in weakenings(timeout_scale=timeout_scale, **options)]
    if len(names) < len(check_names()):
        notices.append(
            f"{NOT_A_CERTIFICATION}: only {len(names)} of the {len(check_names())} checks ran ({', '.join(names)})"
        )
    failures = await run_checks(sandbox, names, image=image, timeout_scale=timeout_scale, **options)
    return failures + notices


def main(argv: list[str] | None = None) -> int:
    """``python -m jupyter_tai_sandbox.conformance PROVIDER``: certify a provider, print the verdict.

    Exit status: 0 certified, 1 a check failed, 2 the checks run passed but the
    run was no certification (``--only``, a large ``--timeout-scale``) or the
    arguments were wrong.
    """
    import argparse

    from .sandboxes import load_provider_class

    parser = argparse.ArgumentParser(
        prog="python -m jupyter_tai_sandbox.conformance",
        description="Run the sandbox conformance suite against a provider and print what failed. "
        "Exit status 0: certified; 1: a check failed; 2: the checks run passed but the run "
        "certifies nothing (a subset, or deadlines stretched too far).",
    )
    parser.add_argument("provider", help="local, docker, or module:Class")
    parser.add_argument("--image", help="session image to ask for (default: the provider's)")
    parser.add_argument(
        "--timeout-scale",
        type=float,
        default=1.0,
        help=f"stretch every deadline (above {MAX_CERTIFYING_TIMEOUT_SCALE:g} the run certifies nothing)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=check_names(),
        metavar="CHECK",
        help="run only this check (repeatable; the run then certifies nothing): " + ", ".join(check_names()),
    )
    args = parser.parse_args(argv)
    try:
        weakenings(timeout_scale=args.timeout_scale)
    except ValueError as e:
        parser.error(str(e))
    provider = load_provider_class(args.provider)()

    async def certify() -> list[str]:
        try:
            return await run_sandbox_conformance(
                provider, image=args.image, timeout_scale=args.timeout_scale, only=args.only
            )
        finally:
            await provider.close()

    started = time.monotonic()
    entries = asyncio.run(certify())
    failures = [e for e in entries if not e.startswith(f"{NOT_A_CERTIFICATION}:")]
    notices = [e for e in entries if e.startswith(f"{NOT_A_CERTIFICATION}:")]
    for failure in failures:
        print(f"FAIL {failure}")
    for notice in notices:
        print(f"NOTE {notice}")
    took = f"in {time.monotonic() - started:.1f}s"
    if failures:
        print(f"{provider.kind}: {len(failures)} check(s) failed {took}")
        return 1
    if notices:
        print(f"{provider.kind}: the checks run passed {took}, but this run is {NOT_A_CERTIFICATION}")
        return 2
    print(f"{provider.kind}: certified {took}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
