"""Checks of a session that holds its commands itself (``holds_commands``: a session agent), so they outlive
the server that started them: the label kept, the listing, an attach resuming each stream exactly, and the
first reader told it was taken over (never stopping the command), a detached command running on. A provider without the capability has
nothing to check here: its sessions list no commands, and an attach is an unknown command."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ..contract import (
    ExecRequest,
    ExitItem,
    OutputChunk,
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
)
from .base import CheckFailed, SuiteBase, expect, expect_raises

#: writes "a" and "B" (stderr), then "c" once told through its stdin, then waits
_SCRIPT = "printf a; printf B >&2; read line; printf c; sleep 60"


class HeldCommandChecks(SuiteBase):
    """The restart capability: what a later server relies on to adopt a command and resume its output."""

    async def check_held_commands_are_listed_and_resumed_exactly(self) -> None:
        session = await self.session()
        if not session.holds_commands:
            expect(await session.held_commands() == [], "a session that holds no commands listed some")
            await expect_raises(
                SandboxNotFoundError, session.attach_command("1"), "attaching to an unknown command"
            )
            return
        label = f'{{"check": "{self.tag}"}}'
        first = await session.start(ExecRequest(("sh", "-c", _SCRIPT), self.t(120), label=label))
        items = aiter(first.output)
        await self._read_until(items, {"stdout": b"a", "stderr": b"B"}, "the first reader")
        [held] = [c for c in await session.held_commands() if c.label == label]
        expect(held.running and held.attached and not held.pty, f"the held command is listed as {held}")
        expect(
            held.offsets.get("stdout") == (0, 1) and held.offsets.get("stderr") == (0, 1),
            f"the held command's output is listed as {dict(held.offsets)}, not stdout (0, 1) and stderr (0, 1)",
        )
        await expect_raises(
            SandboxNotFoundError, session.attach_command(f"no-{self.tag}"), "attaching to no command"
        )
        # a second reader, from stdout's second byte (none yet) and stderr's first
        second = await session.attach_command(held.id, {"stdout": 1, "stderr": 0})
        try:
            async with asyncio.timeout(self.t(30)):
                try:
                    async for _ in items:
                        pass
                except SandboxConflictError:
                    pass
                else:
                    raise CheckFailed(
                        "the first reader's output ended without saying another reader took over"
                    )
            await second.write(b"go\n")
            again = aiter(second.output)
            await self._read_until(again, {"stdout": b"c", "stderr": b"B"}, "the resumed command")
            await first.kill()  # the first reader's kill stops nothing now
            result = await session.exec(["sh", "-c", "echo alive"], timeout_seconds=self.t(30))
            expect(result.stdout == b"alive\n", "the session stopped answering after the takeover")
        finally:
            _, took = await self.timed(second.kill())
        expect(took < self.t(6), f"kill() of the resumed command took {took:.1f}s")
        async with asyncio.timeout(self.t(30)):
            ends = await _ends(again)
        expect(len(ends) <= 1, f"the resumed command ended with {len(ends)} exit items")
        await asyncio.sleep(self.t(0.5))
        left = [c for c in await session.held_commands() if c.label == label]
        expect(not left or not left[0].running, "the resumed command still runs after its kill")

    async def check_a_detached_command_runs_on_and_is_attached_again(self) -> None:
        """``ExecHandle.detach``: a held command runs on without its handle (output included) and a later
        attach reads it; where the session holds no commands, detach ends the command (nothing outlives the
        server)."""
        session = await self.session()
        label = f'{{"check": "{self.tag}-detach"}}'
        handle = await session.start(ExecRequest(("sh", "-c", _SCRIPT), self.t(120), label=label))
        items = aiter(handle.output)
        await self._read_until(items, {"stdout": b"a", "stderr": b"B"}, "the command")
        await handle.detach()
        if not session.holds_commands:
            async with asyncio.timeout(self.t(30)):
                await _ends(items)
            return
        [held] = [c for c in await session.held_commands() if c.label == label]
        expect(held.running, f"the detached command stopped: listed as {held}")
        again = await session.attach_command(held.id, {"stdout": 1, "stderr": 1})
        try:
            await again.write(b"go\n")
            await self._read_until(
                aiter(again.output), {"stdout": b"c", "stderr": b""}, "the attached command"
            )
        finally:
            await again.kill()

    async def _read_until(self, items: AsyncIterator[Any], want: dict[str, bytes], who: str) -> None:
        """Read ``items`` until each stream gave exactly ``want``'s bytes."""
        got = dict.fromkeys(want, b"")
        async with asyncio.timeout(self.t(30)):
            while got != want:
                item = await anext(items)
                if not isinstance(item, OutputChunk):
                    raise CheckFailed(f"{who}'s output ended ({item}) after {got}, not {want}")
                got[item.stream] = got.get(item.stream, b"") + item.data


async def _ends(output: AsyncIterator[Any]) -> list[ExitItem]:
    ends: list[ExitItem] = []
    try:
        async for item in output:
            if isinstance(item, ExitItem):
                ends.append(item)
    except SandboxError:
        pass  # a kill's end may be an error (no exit status invented)
    return ends
