"""Checks of running commands: streams and exit status, big stdin, the interactive seam, reads."""

from __future__ import annotations

import asyncio
import os

from ..contract import (
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
)
from .base import KILLED, CheckFailed, SuiteBase, drain, expect, expect_one_exit, expect_raises


class ExecChecks(SuiteBase):
    """One-shot and interactive commands: output, status, stdin, and reads late, slow or after kill()."""

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
            await expect_raises(SandboxError, session.exec(argv, timeout_seconds=5), what)
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
        slow_out, slow_err = bytearray(), bytearray()
        items = []
        async for item in handle.output:
            items.append(item)
            if isinstance(item, OutputChunk):
                (slow_out if item.stream == "stdout" else slow_err).extend(item.data)
                await asyncio.sleep(0.05 if len(items) < 20 else 0)
        expect(len(slow_out) == size, f"slow read got {len(slow_out)} of {size} stdout bytes")
        expect(bytes(slow_err) == b"done\n", f"slow read got stderr {bytes(slow_err)!r}")
        expect_one_exit(items, 0, "slow read")
        await handle.kill()
        # one-shot
        result = await session.exec(["sh", "-c", script], timeout_seconds=self.t(60))
        expect(len(result.stdout) == size, f"one-shot got {len(result.stdout)} of {size} stdout bytes")
