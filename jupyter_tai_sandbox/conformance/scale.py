"""Checks of a session under load and interruption: many commands at once, an absent program, a cut upload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from ..contract import ExitItem, SandboxError, SandboxRequestError
from .base import CheckFailed, SuiteBase, drain, exit_items, expect, expect_raises

#: commands run at once in one session (one of them never read)
CONCURRENT_COMMANDS = 32
#: the upload cut short by a cancellation and by the session's destroy
CUT_UPLOAD_BYTES = 64 << 20


class ScaleChecks(SuiteBase):
    """Per-command flow control across 32 commands, the typed error of an absent program, and uploads cut
    short (cancelled, or their session destroyed) that leave nothing partial and never hang."""

    async def check_unread_command_stalls_no_other(self) -> None:
        session = await self.session()
        size = max(1 << 20, self.big_output_bytes // 4)
        argv = ["head", "-c", str(size), "/dev/zero"]

        async def read_all(n: int) -> float:
            async def one() -> None:
                handle = await session.exec_start(argv, timeout_seconds=self.t(120))
                out, err, items = await drain(handle)
                await handle.kill()
                if len(out) != size:
                    ended = [(i.exit_code, i.reason) for i in exit_items(items)]
                    raise CheckFailed(
                        f"a read command gave {len(out)} of {size} bytes (its exit: {ended}; "
                        f"stderr: {err[-300:]!r})"
                    )

            started = time.monotonic()
            await asyncio.gather(*(one() for _ in range(n)))
            return time.monotonic() - started

        readers = CONCURRENT_COMMANDS - 1
        alone = await read_all(readers)  # the same commands with no unread one beside them
        # it never ends on its own: a provider that keeps all of an unread command's output (local spools it)
        # lets its producer finish, and only the sleep after it then shows whether the kill stopped it
        unread = await session.exec_start(
            ["sh", "-c", f"head -c {1 << 30} /dev/zero; exec sleep 300"], timeout_seconds=self.t(300)
        )
        try:
            await asyncio.sleep(self.t(0.5))  # it fills whatever buffers the provider has for it
            try:
                beside = await asyncio.wait_for(read_all(readers), self.t(60) + 4 * alone)
            except TimeoutError:
                raise CheckFailed(
                    f"{readers} read commands did not finish beside one unread command (alone: {alone:.1f}s)"
                ) from None
            expect(
                beside <= 3 * alone + self.t(2),
                f"{readers} read commands took {beside:.1f}s beside one unread command, {alone:.1f}s alone",
            )
        finally:
            _, took = await self.timed(unread.kill())
        expect(took < self.t(6), f"kill() of the unread command took {took:.1f}s")
        exits = []
        async for item in unread.output:
            if isinstance(item, ExitItem):
                exits.append(item.exit_code)
        expect(len(exits) == 1 and exits[0] != 0, f"the unread command's exit after the kill: {exits}")

    async def check_absent_program_is_a_typed_error(self) -> None:
        session = await self.session()
        for program in (f"tai-no-such-program-{self.tag}", f"/no/such/dir-{self.tag}/program"):
            for start in (
                lambda p=program: session.exec([p, "arg"], timeout_seconds=self.t(30)),
                lambda p=program: session.exec_start([p, "arg"], timeout_seconds=self.t(30)),
            ):
                err = await expect_raises(
                    SandboxRequestError, start(), f"starting the absent program {program!r}"
                )
                field = getattr(err, "field", None)
                expect(field == "argv", f"the error for the absent program {program!r} names field {field!r}")
        result = await session.exec(["echo", "still fine"], timeout_seconds=self.t(30))
        expect(result.stdout == b"still fine\n", "the session did not run a command after the absent program")

    async def check_cut_upload_leaves_nothing_partial(self) -> None:
        session = await self.session()
        await session.make_folder("cut")
        await session.put_file("cut/target.bin", b"old")
        chunk = bytes(range(256)) * 4096  # 1 MiB
        sent = asyncio.Event()

        async def data() -> AsyncIterator[bytes]:
            for i in range(CUT_UPLOAD_BYTES // len(chunk)):
                if i == 8:
                    sent.set()
                yield chunk
                await asyncio.sleep(0)

        # a cancelled upload: the old file stays whole, nothing partial is ever visible, no hang
        upload = asyncio.create_task(session.put_file("cut/target.bin", data()))
        await asyncio.wait(
            {upload, asyncio.create_task(sent.wait())},
            timeout=self.t(60),
            return_when=asyncio.FIRST_COMPLETED,
        )
        seen = await session.get_file("cut/target.bin")
        expect(seen == b"old", f"a reader saw {len(seen)} bytes of an upload in progress, not the old file")
        upload.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(upload), self.t(10))
        except asyncio.CancelledError:
            pass
        except TimeoutError:
            raise CheckFailed("a cancelled upload did not end within 10s") from None
        except SandboxError:
            pass
        seen = await session.get_file("cut/target.bin")
        if upload.cancelled():
            expect(
                seen == b"old", f"after a cancelled upload the file holds {len(seen)} bytes, not the old ones"
            )
        else:
            expect(seen in (b"old", chunk * (CUT_UPLOAD_BYTES // len(chunk))), "the file is partial")
        # a provider behind a connection drops its partial temp file once it sees the upload end: a short grace
        deadline = time.monotonic() + self.t(5)
        while (names := sorted(e["name"] for e in await session.list_files("cut"))) != ["target.bin"]:
            if time.monotonic() > deadline:
                raise CheckFailed(f"a cancelled upload left {names} in its folder")
            await asyncio.sleep(0.1)
        await asyncio.sleep(self.t(1))
        seen = await session.get_file("cut/target.bin")
        expect(
            not upload.cancelled() or seen == b"old",
            f"a cancelled upload went on unseen: the file now holds {len(seen)} bytes",
        )
        # a destroy during an upload: both end promptly, the upload with a SandboxError or whole
        sent.clear()
        upload = asyncio.create_task(session.put_file("cut/second.bin", data()))
        await asyncio.wait(
            {upload, asyncio.create_task(sent.wait())},
            timeout=self.t(60),
            return_when=asyncio.FIRST_COMPLETED,
        )
        _, took = await self.timed(asyncio.wait_for(session.destroy(), self.t(30)))
        expect(took < self.t(15), f"destroy() during an upload took {took:.1f}s")
        try:
            await asyncio.wait_for(upload, self.t(10))
        except TimeoutError:
            raise CheckFailed("an upload whose session was destroyed did not end within 10s") from None
        except SandboxError:
            pass
