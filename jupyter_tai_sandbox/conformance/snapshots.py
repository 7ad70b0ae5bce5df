"""Checks of the optional capabilities: pause and resume, and fork. A provider that has one keeps its promise;
one that lacks it says so with SandboxUnsupportedError naming the operation, never a silent no-op."""

from __future__ import annotations

import asyncio
import time

from ..contract import ExecRequest, SandboxConflictError, SandboxSession, SandboxUnsupportedError
from .base import CheckFailed, SuiteBase, expect, expect_raises

#: a loop that counts into the workspace file ``n`` (written whole: a reader never sees half a number)
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; sleep 0.05; done"


class SnapshotChecks(SuiteBase):
    """pause/resume and fork, or their typed refusal."""

    async def _refused(self, session: SandboxSession, operation: str) -> None:
        error = await expect_raises(
            SandboxUnsupportedError,
            getattr(session, operation)(),
            f"{operation}() where the session says it cannot",
        )
        expect(
            getattr(error, "operation", None) == operation,
            f"{operation}()'s SandboxUnsupportedError names {getattr(error, 'operation', None)!r}",
        )

    async def _count(self, session: SandboxSession, above: int = 0) -> int:
        """The counter's value once it is above ``above`` (it keeps counting)."""
        deadline = time.monotonic() + self.t(10)
        while True:
            text = (await self.sh(session, "cat n 2>/dev/null || echo 0")).strip()
            if text.isdigit() and int(text) > above:
                return int(text)
            if time.monotonic() > deadline:
                raise CheckFailed(f"the counting command stopped at {text!r}")
            await asyncio.sleep(0.1)

    async def check_pause_freezes_and_resume_runs_on(self) -> None:
        session = await self.session()
        if not session.pausable:
            await self._refused(session, "pause")
            await self._refused(session, "resume")
            return
        handle = await session.start(ExecRequest(("sh", "-c", COUNTER), self.t(120)))
        before = await self._count(session)
        info = await session.pause()
        expect(info.paused, "pause() answered an info that is not paused")
        expect((await session.pause()).paused, "a second pause() is not a no-op")
        await expect_raises(
            SandboxConflictError,
            session.exec(["true"], timeout_seconds=self.t(10)),
            "exec in a paused session",
        )
        await expect_raises(SandboxConflictError, session.get_file("n"), "a file read in a paused session")
        listed = [i.paused for i in await self.sandbox.list() if i.id == session.id]
        expect(listed == [True], f"list() shows the paused session as {listed}")
        info = await session.resume()
        expect(not info.paused, "resume() answered an info that is still paused")
        expect(not (await session.resume()).paused, "a second resume() is not a no-op")
        await self._count(session, above=before)  # the command it held runs on
        await handle.kill()

    async def check_fork_copies_the_session_or_is_refused(self) -> None:
        source = await self.session()
        if not source.forkable:
            await self._refused(source, "fork")
            return
        await source.put_file("kept/before.txt", b"shared past")
        try:
            copy = await source.fork()
        except SandboxUnsupportedError as e:
            raise CheckFailed(f"the session says it can fork, and fork() refused: {e}") from None
        self.created.append(copy)
        info, source_info = await copy.info(), await source.info()
        expect(copy.id != source.id, "the fork has the source's id")
        expect(
            (info.spec.owner, info.consumer) == (source_info.spec.owner, source_info.consumer),
            "the fork's owner or consumer differs from the source's",
        )
        expect(
            await copy.get_file("kept/before.txt") == b"shared past",
            "the fork lacks the source's workspace file",
        )
        await copy.put_file("after.txt", b"fork")
        await source.put_file("after.txt", b"source")
        expect(
            await copy.get_file("after.txt") == b"fork" and await source.get_file("after.txt") == b"source",
            "the fork and its source share a file written after the fork",
        )
        listed = {i.id for i in await self.sandbox.list()}
        expect({source.id, copy.id} <= listed, "list() does not show both the source and its fork")
        await copy.destroy()
        expect(
            (await source.exec(["true"], timeout_seconds=self.t(10))).exit_code == 0,
            "the source does not run after its fork was destroyed",
        )
