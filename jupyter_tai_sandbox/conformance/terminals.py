"""Checks of commands on a pty (a terminal): window size and resize, ^C, and stopping a terminal."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

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
            except TimeoutError:
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
        sizes: tuple[tuple[dict[str, Any], bytes], ...] = (
            ({}, b"24 80"),
            ({"rows": 30, "cols": 100}, b"30 100"),
        )
        for size, expected in sizes:
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

    async def check_commands_start_with_default_signals(self) -> None:
        """Commands start with every signal at its default action and none blocked, whatever the
        server inherited: meanwhile this process ignores SIGINT and SIGQUIT and blocks SIGTERM (as a
        server started in the background of a shell does): a command has none of them ignored or
        blocked (``/proc/self/status``), a shell's own SIGINT and SIGTERM end it, and ^C on a pty
        interrupts."""
        session = await self.session()
        watched = {"SIGINT": signal.SIGINT, "SIGQUIT": signal.SIGQUIT, "SIGTERM": signal.SIGTERM}
        with _signals_as_in_a_background_job():
            status = await session.exec(["cat", "/proc/self/status"], timeout_seconds=self.t(30))
            fields = dict(
                line.split(":", 1)
                for line in status.stdout.decode(errors="replace").splitlines()
                if ":" in line
            )
            expect(
                status.exit_code == 0 and "SigIgn" in fields and "SigBlk" in fields,
                f"`cat /proc/self/status` gave no signal masks (exit {status.exit_code}): {status.stdout[:200]!r}",
            )
            for field, what in (("SigIgn", "ignored"), ("SigBlk", "blocked")):
                mask = int(fields[field].strip(), 16)
                inherited = [name for name, number in watched.items() if mask >> (number - 1) & 1]
                expect(
                    not inherited,
                    f"a command started while the server ignores SIGINT and SIGQUIT and blocks SIGTERM has "
                    f"{', '.join(inherited)} {what} ({field} {fields[field].strip()}): it inherited the "
                    "server's signal state",
                )
            for name in ("INT", "TERM"):
                number = watched[f"SIG{name}"]
                result = await session.exec(
                    ["sh", "-c", f"kill -{name} $$; echo survived-$?"], timeout_seconds=self.t(30)
                )
                expect(
                    result.exit_code == 128 + number and b"survived" not in result.stdout,
                    f"`kill -{name} $$` in a shell: exit {result.exit_code}, stdout {result.stdout[:100]!r} "
                    f"(expected {128 + number})",
                )
            await self.check_pty_ctrl_c()

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


@contextlib.contextmanager
def _signals_as_in_a_background_job() -> Iterator[None]:
    """This process ignores SIGINT and SIGQUIT (only from the main thread, where Python allows it)
    and this thread blocks SIGTERM, as in a job a non-interactive shell started with ``&``; all
    put back after."""
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGQUIT)} if main else {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    try:
        for number in previous:
            signal.signal(number, signal.SIG_IGN)
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
