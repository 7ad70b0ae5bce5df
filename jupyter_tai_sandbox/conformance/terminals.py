"""Checks of commands on a pty (a terminal): window size and resize, ^C, and stopping a terminal."""

from __future__ import annotations

import asyncio
import re
import time

from ..contract import (
    ExecHandle,
    OutputChunk,
    SandboxExecTimeoutError,
)
from .base import INTERRUPTED, KILLED, CheckFailed, SuiteBase, drain, expect, expect_one_exit, expect_raises


class PtyChecks(SuiteBase):
    """Commands started with ``pty=True``."""

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
            # a terminal resizes a shell that is up (its prompt shown), as a person's window does
            await self.read_until(handle, rb"[$#] ", "the interactive shell's prompt")
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
