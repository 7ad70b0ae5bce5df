"""Checks of stopping commands: deadlines, kill(), cancelled calls, failed stdin writes, setsid."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import secrets
import time
from collections.abc import Awaitable
from typing import Any

from ..contract import (
    SandboxError,
    SandboxExecTimeoutError,
    SandboxSession,
)
from .base import (
    KILLED,
    CheckFailed,
    SuiteBase,
    drain,
    exit_items,
    expect,
    expect_one_exit,
    expect_raises,
)


class DeadlineChecks(SuiteBase):
    """A command's deadline and kill(): what they stop, what they report, and how soon."""

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


class StopChecks(SuiteBase):
    """Stops that come otherwise: a cancelled call, a failed stdin write, a command that calls setsid."""

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
            written, _ = await asyncio.wait({writer}, timeout=self.t(5))
            expect(writer in written, "a pending write did not end after kill()")
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
