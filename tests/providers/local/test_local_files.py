"""sandbox-local file transfer: atomic uploads, long names, and typed errors for every bad path."""

import asyncio
import os
import stat

import pytest

from jupyter_tai_sandbox.contract import (
    SandboxError,
    SandboxNotFoundError,
    SandboxPathError,
    SessionSpec,
)
from tests.support.aio import run

MIB = 1 << 20


async def chunks(body: bytes, size: int = 64 << 10):
    """A streamed upload that yields to the loop between chunks, so uploads interleave."""
    for i in range(0, len(body), size):
        yield body[i : i + size]
        await asyncio.sleep(0)


def test_concurrent_uploads_to_one_path_never_mix(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        bodies = [bytes([i]) * MIB for i in range(20)]
        results = await asyncio.gather(
            *(session.put_file("shared/one.bin", chunks(body)) for body in bodies), return_exceptions=True
        )
        assert results == [None] * 20, results
        data = await session.get_file("shared/one.bin")
        assert data in bodies, "the file mixes several uploads"
        assert [e["name"] for e in await session.list_files("shared")] == ["one.bin"], (
            "a temporary file was left"
        )
        await session.destroy()

    run(scenario())


def test_uploads_of_whole_bodies_race_with_the_last_writer_winning_whole(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        bodies = [bytes([65 + i]) * (3 * MIB) for i in range(8)]
        await asyncio.gather(*(session.put_file("f.bin", body) for body in bodies))
        assert await session.get_file("f.bin") in bodies
        await session.destroy()

    run(scenario())


def test_a_legal_250_character_name_uploads_lists_and_downloads(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        name = "n" * 250
        await session.put_file(f"dir/{name}", b"long name")
        assert await session.get_file(f"dir/{name}") == b"long name"
        assert [e["name"] for e in await session.list_files("dir")] == [name]
        assert session.resolve(f"dir/{name}").endswith(name)
        await session.put_file(name, chunks(b"x" * MIB))  # streamed, at the top too
        assert len(await session.get_file(name)) == MIB
        await session.destroy()

    run(scenario())


@pytest.mark.parametrize(
    "path",
    ["a" * 300, "dir/" + "b" * 256, "/".join(["c" * 200] * 25), "é" * 200],
    ids=["300-name", "256-name-in-dir", "path-over-4096", "multibyte-400-bytes"],
)
def test_names_no_host_file_can_have_are_path_errors_everywhere(sandbox, path):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        calls = {
            "put_file": lambda: session.put_file(path, b"x"),
            "put_file streamed": lambda: session.put_file(path, chunks(b"x")),
            "get_file": lambda: session.get_file(path),
            "list_files": lambda: session.list_files(path),
            "exec cwd": lambda: session.exec(["true"], timeout_seconds=5, cwd=path),
        }
        for name, call in calls.items():
            with pytest.raises(SandboxPathError):
                await call()
            print(name, "ok")
        with pytest.raises(SandboxPathError):
            session.resolve(path)
        with pytest.raises(SandboxPathError):
            async for _ in session.iter_file(path):
                pass
        assert sorted(os.listdir(session.resolve("."))) == []
        await session.destroy()

    run(scenario())


def test_os_errors_from_paths_are_typed_never_bare(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        await session.put_file("file.txt", b"a file")
        await session.put_file("folder/inner.txt", b"in a folder")
        for path in ("file.txt/below", "folder"):  # a file as a folder; a folder as a file
            with pytest.raises(SandboxPathError):
                await session.put_file(path, b"x")
        with pytest.raises(SandboxPathError):
            await session.get_file("folder")
        with pytest.raises(SandboxPathError):
            await session.list_files("file.txt")
        with pytest.raises(SandboxNotFoundError):
            await session.get_file("missing.txt")
        with pytest.raises(SandboxNotFoundError):
            await session.list_files("missing")
        with pytest.raises(SandboxPathError):
            await session.get_file("file.txt/below")  # a path through a file
        if os.geteuid() != 0:  # root reads anything
            os.chmod(session.resolve("file.txt"), 0)
            with pytest.raises(SandboxPathError):
                await session.get_file("file.txt")
        assert await session.get_file("folder/inner.txt") == b"in a folder"
        await session.destroy()

    run(scenario())


def test_a_failed_upload_leaves_the_old_file_whole_and_no_temporary_file(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        await session.put_file("keep.txt", b"the old content")

        async def breaks():
            yield b"partial "
            raise RuntimeError("the client went away")

        with pytest.raises(RuntimeError):
            await session.put_file("keep.txt", breaks())
        assert await session.get_file("keep.txt") == b"the old content"
        assert [e["name"] for e in await session.list_files(".")] == ["keep.txt"]
        await session.destroy()

    run(scenario())


def test_an_uploaded_file_has_the_mode_open_would_give_it(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        await session.put_file("made.txt", b"x")
        mask = os.umask(0)
        os.umask(mask)
        assert stat.S_IMODE(os.stat(session.resolve("made.txt")).st_mode) == 0o666 & ~mask
        result = await session.exec(["sh", "-c", "echo more >> made.txt && cat made.txt"], timeout_seconds=10)
        assert result.stdout == b"xmore\n"
        await session.destroy()

    run(scenario())


def test_path_errors_are_sandbox_errors_with_the_path_in_the_message(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        with pytest.raises(SandboxError, match="a" * 20):
            await session.put_file("a" * 300, b"x")
        await session.destroy()

    run(scenario())
