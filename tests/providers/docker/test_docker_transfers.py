"""Docker file transfers and output caps against a real engine (issue 14, points 2, 5, 8).

Downloads and uploads hold no engine lock and no worker thread: a stalled consumer delays nobody and is aborted after the idle limit;
uploads are confined inside the container in the same step as the write, so a
folder swapped for a symlink never redirects one; one-shot output and unread
spilled output are capped with a typed error.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.contract import (
    ExecRequest,
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxPathError,
)
from jupyter_tai_sandbox.errors import OutputTooLargeError
from jupyter_tai_sandbox.providers.container import TransferIdleError
from jupyter_tai_sandbox.spool import OutputSpool
from tests.support.docker import leftovers, provider, spec

pytestmark = [pytest.mark.docker, pytest.mark.slow(64)]


BIG = 48 << 20  # far more than every buffer on the way (pipe, engine, sockets)


async def make_big(session, name: str = "big.bin", size: int = BIG) -> None:
    result = await session.exec(["sh", "-c", f"head -c {size} /dev/zero > {name}"], timeout_seconds=60)
    assert result.exit_code == 0, result.stderr


async def procs(session, pattern: str) -> list[str]:
    """Command lines of the session's processes that mention ``pattern`` (not this look itself)."""
    script = (
        'for d in /proc/[0-9]*; do [ "${d#/proc/}" = $$ ] && continue; '
        'c=$(tr "\\0\\n" "  " <"$d/cmdline" 2>/dev/null); case $c in *"$1"*) echo "$c";; esac; done'
    )
    result = await session.exec(["sh", "-c", script, "sh", pattern], timeout_seconds=20)
    return [line for line in result.stdout.decode().splitlines() if "for d in /proc" not in line]


async def left_after(session, pattern: str, within: float = 20.0) -> list[str]:
    """The session's processes that mention ``pattern`` once none are left, or ``within`` s of the
    clock have passed (then the ones still there)."""
    deadline = time.monotonic() + within
    while (left := await procs(session, pattern)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return left


def test_a_stalled_download_delays_no_command_of_its_session_and_resumes(client):
    """The consumer takes one chunk and then nothing for 10 s: a 3 s deadline still fires on time."""

    async def main() -> None:
        sandbox = provider(transfer_idle_seconds=30)
        session = await sandbox.create(spec())
        try:
            await make_big(session)
            chunks = session.iter_file("big.bin", 1 << 16)
            got = len(await anext(chunks))
            stalled_at = time.monotonic()
            started = time.monotonic()
            result = await asyncio.wait_for(session.exec(["echo", "ok"], timeout_seconds=10), 8)
            assert result.stdout == b"ok\n"
            assert time.monotonic() - started < 3
            started = time.monotonic()
            with pytest.raises(SandboxExecTimeoutError):
                await asyncio.wait_for(session.exec(["sleep", "30"], timeout_seconds=3), 20)
            took = time.monotonic() - started
            assert took < 5.5, f"the 3 s deadline answered after {took:.1f} s behind a stalled download"
            # an upload and another download of the same session go by too
            await asyncio.wait_for(session.put_file("small.txt", b"small"), 8)
            assert await asyncio.wait_for(session.get_file("small.txt"), 8) == b"small"
            await asyncio.sleep(max(0.0, 10 - (time.monotonic() - stalled_at)))
            # the stalled consumer reads on and gets the whole file
            async for chunk in chunks:
                got += len(chunk)
            assert got == BIG
            assert await left_after(session, "tai-sbx") == []
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_eight_stalled_downloads_leave_other_sessions_and_creation_alone(client):
    async def main() -> None:
        sandbox = provider(transfer_idle_seconds=60)
        stalled = await sandbox.create(spec())
        other = await sandbox.create(spec())
        made = []
        streams = []
        try:
            await make_big(stalled)
            for _ in range(8):
                chunks = stalled.iter_file("big.bin", 1 << 16)
                await anext(chunks)
                streams.append(chunks)
            started = time.monotonic()
            result = await asyncio.wait_for(other.exec(["echo", "other"], timeout_seconds=10), 10)
            assert result.stdout == b"other\n"
            with pytest.raises(SandboxExecTimeoutError):
                await asyncio.wait_for(other.exec(["sleep", "30"], timeout_seconds=2), 15)
            await asyncio.wait_for(other.put_file("x/y.txt", b"y"), 10)
            assert await asyncio.wait_for(other.get_file("x/y.txt"), 10) == b"y"
            made.append(await asyncio.wait_for(sandbox.create(spec()), 20))
            assert (await made[0].exec(["echo", "new"], timeout_seconds=10)).stdout == b"new\n"
            # and the stalled session itself still runs commands
            assert (
                await asyncio.wait_for(stalled.exec(["echo", "me"], timeout_seconds=10), 10)
            ).stdout == b"me\n"
            assert time.monotonic() - started < 25
        finally:
            for chunks in streams:
                await chunks.aclose()
            for session in [stalled, other, *made]:
                await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_stalled_download_is_aborted_after_the_idle_limit(client):
    """A download is reads the reader asks for, so nothing runs in the session meanwhile."""

    async def main() -> None:
        sandbox = provider(transfer_idle_seconds=2)
        session = await sandbox.create(spec())
        try:
            await make_big(session)
            chunks = session.iter_file("big.bin", 1 << 16)
            await anext(chunks)
            # no command in the session reads the file for the transfer
            assert await procs(session, "big.bin") == []
            await asyncio.sleep(4)
            with pytest.raises(TransferIdleError, match="transfer_idle_seconds"):
                async for _ in chunks:
                    pass
            # nothing in the session names the file, nor a helper of ours
            assert await left_after(session, "big.bin") == []
            assert await left_after(session, "tai-sbx") == []
            # a consumer that leaves early leaves nothing either
            chunks = session.iter_file("big.bin", 1 << 16)
            await anext(chunks)
            await chunks.aclose()
            assert await left_after(session, "big.bin") == []
            assert await left_after(session, "tai-sbx") == []
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_slow_upload_client_holds_nothing_and_an_idle_one_is_aborted(client):
    async def main() -> None:
        sandbox = provider(transfer_idle_seconds=60)
        session = await sandbox.create(spec())
        gate = asyncio.Event()

        async def trickle():
            yield b"first "
            await gate.wait()
            yield b"last"

        try:
            upload = asyncio.ensure_future(session.put_file("slow.txt", trickle()))
            await asyncio.sleep(0.5)
            started = time.monotonic()
            with pytest.raises(SandboxExecTimeoutError):
                await asyncio.wait_for(session.exec(["sleep", "30"], timeout_seconds=2), 15)
            assert time.monotonic() - started < 4.5
            assert not upload.done()
            gate.set()
            await asyncio.wait_for(upload, 15)
            assert await session.get_file("slow.txt") == b"first last"
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_uploads_race_a_folder_swapped_for_a_symlink_and_never_land_outside(client):
    """A session-side loop swaps ``d`` between a folder and a symlink to /tmp/outside (and ``e`` to
    /etc) while 200 uploads go to ``d/...`` and ``e/...``: nothing ever lands outside /workspace."""

    swap = r"""mkdir -p /tmp/outside
while :; do
  rm -rf d e; mkdir d e
  rm -rf d e; ln -s /tmp/outside d; ln -s /etc e
done"""

    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        swapper = None
        outcomes = {"written": 0, "refused": 0}
        try:
            etc_before = (await session.exec(["ls", "-a", "/etc"], timeout_seconds=10)).stdout
            swapper = await session.exec_start(["sh", "-c", swap], timeout_seconds=300)

            async def one(i: int) -> None:
                folder = "d" if i % 2 else "e"
                try:
                    await session.put_file(f"{folder}/up-{i}.txt", b"payload %d" % i)
                    outcomes["written"] += 1
                except SandboxError:
                    outcomes["refused"] += 1

            for start in range(0, 200, 4):
                await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(start, start + 4))), 60)
            await swapper.kill()
            outside = await session.exec(["sh", "-c", "ls -a /tmp/outside; ls -a /etc"], timeout_seconds=10)
            assert b"up-" not in outside.stdout, outside.stdout
            assert (await session.exec(["ls", "-a", "/etc"], timeout_seconds=10)).stdout == etc_before
            found = await session.exec(
                ["sh", "-c", "find / -xdev -name 'up-*.txt' 2>/dev/null"], timeout_seconds=30
            )
            assert all(p.startswith("/workspace/") for p in found.stdout.decode().split()), found.stdout
            assert outcomes["written"] + outcomes["refused"] == 200
            assert outcomes["refused"] > 0  # the race was real
            leftovers_ = await session.exec(
                ["sh", "-c", "find /workspace -name '.tai-upload-*'"], timeout_seconds=10
            )
            assert leftovers_.stdout == b""
        finally:
            if swapper is not None:
                await swapper.kill()
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_concurrent_uploads_to_one_path_never_mix(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        try:
            bodies = [bytes([65 + i]) * (1 << 20) + bytes([97 + i]) * 1000 for i in range(8)]

            async def stream(body: bytes):
                for i in range(0, len(body), 65536):
                    yield body[i : i + 65536]
                    await asyncio.sleep(0)

            await asyncio.gather(*(session.put_file("same/file.bin", stream(b)) for b in bodies))
            assert await session.get_file("same/file.bin") in bodies
            listing = await session.exec(["ls", "-a", "same"], timeout_seconds=10)
            assert listing.stdout.split() == [b".", b"..", b"file.bin"]
            # a 250-byte name is a legal name (no temp suffix makes it too long)
            long = "n" * 250
            await session.put_file(long, b"long")
            assert await session.get_file(long) == b"long"
            with pytest.raises(SandboxPathError):
                await session.put_file("n" * 256, b"x")
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_cut_off_upload_never_replaces_the_file(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        try:
            await session.put_file("kept.txt", b"old content")

            async def broken():
                yield b"new start"
                raise ConnectionError("the client went away")

            with pytest.raises(ConnectionError):
                await session.put_file("kept.txt", broken())
            assert await session.get_file("kept.txt") == b"old content"
            leftovers_ = await session.exec(["sh", "-c", "ls -a"], timeout_seconds=10)
            assert b".tai-upload" not in leftovers_.stdout
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_one_shot_output_limit_stops_the_command_with_byte_counts(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        try:
            started = time.monotonic()
            with pytest.raises(OutputTooLargeError) as caught:
                await session.run(ExecRequest(["yes"], 30, output_limit=1 << 20))
            assert time.monotonic() - started < 15
            error = caught.value
            assert error.stdout_bytes + error.stderr_bytes > 1 << 20
            assert "max_output_bytes" in str(error)
            assert await left_after(session, "yes") == []
            # under the limit, a one-shot is whole
            result = await session.run(
                ExecRequest(["sh", "-c", "head -c 1000 /dev/zero"], 30, output_limit=1 << 20)
            )
            assert len(result.stdout) == 1000
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_unread_output_past_the_spill_cap_stops_the_command(client, monkeypatch):
    monkeypatch.setattr(OutputSpool, "default_disk_limit", 4 << 20)

    async def main() -> None:
        sandbox = provider(output_memory_bytes=1 << 20)
        session = await sandbox.create(spec())
        try:
            handle = await session.exec_start(["yes"], timeout_seconds=60)
            started = time.monotonic()
            assert await left_after(session, "yes") == []  # nobody reads: the cap stops it
            assert time.monotonic() - started < 20
            given = 0
            with pytest.raises(OutputTooLargeError) as caught:
                async for item in handle.output:
                    assert isinstance(item, OutputChunk)
                    given += len(item.data)
            assert "max_spill_bytes" in str(caught.value)
            assert given <= (5 << 20) + (1 << 20)
            assert caught.value.stdout_bytes >= given
            await handle.kill()
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_nothing_is_left_behind(client):
    assert leftovers(client) == []
