"""The agent's files: confined to a root by the kernel (openat2 RESOLVE_BENEATH), uploads atomic."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from jupyter_tai_sandbox.agent import AgentError
from tests.support.agent import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]
ROOT = "/data/ws"


def _prepare(session) -> None:
    session.exec(
        "sh",
        "-c",
        "mkdir -p /data/ws /data/outside && echo secret > /data/outside/secret && "
        "ln -s / /data/ws/to-root && ln -s ../outside /data/ws/to-outside && "
        "ln -s /proc/self/root /data/ws/magic && mkdir /data/ws/inner && echo in > /data/ws/inner/f && "
        "ln -s inner /data/ws/to-inner",
    )


def test_upload_and_download_round_trip_exactly(session):
    _prepare(session)
    payload = hashlib.sha256(b"x").digest() * ((8 << 20) // 32) + b"tail"

    async def go():
        client = await session.client()
        try:
            assert await client.write_file(ROOT, "deep/er/blob", payload) == len(payload)
            assert await client.read_file(ROOT, "deep/er/blob") == payload
            assert (await client.stat(ROOT, "deep/er/blob"))["size"] == len(payload)
            assert await client.read_file(ROOT, "to-inner/f") == b"in\n"  # a symlink that stays inside
            names = {e["name"]: e["type"] for e in await client.listdir(ROOT)}
            assert names["deep"] == "dir" and names["to-root"] == "symlink" and names["inner"] == "dir"
            assert not any(n.startswith(".tai-upload-") for n in await _names(client, "deep/er"))
        finally:
            await client.close()

    run(go())
    digest = session.exec("sha256sum", "/data/ws/deep/er/blob").split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()


async def _names(client, path: str) -> list[str]:
    return [e["name"] for e in await client.listdir(ROOT, path)]


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret",
        "/data/outside/secret",
        "to-root/etc/passwd",
        "to-outside/secret",
        "magic/etc/passwd",
        "inner/../../outside/secret",
    ],
)
def test_paths_that_leave_the_root_are_refused_by_the_kernel(session, path):
    _prepare(session)

    async def go():
        client = await session.client()
        try:
            for attempt in (client.read_file(ROOT, path), client.stat(ROOT, path)):
                with pytest.raises(AgentError) as e:
                    await attempt
                assert e.value.code in ("EXDEV", "ELOOP"), e.value
            target = path.rsplit("/", 1)[0] + "/planted"
            with pytest.raises(AgentError):
                await client.write_file(ROOT, target, b"planted", parents=False)
            with pytest.raises(AgentError):
                await client.delete(ROOT, path)
            with pytest.raises(AgentError):
                await client.rename(ROOT, "inner/f", target)
        finally:
            await client.close()

    run(go())
    assert session.exec("cat", "/data/outside/secret") == "secret\n"
    assert "planted" not in session.exec("ls", "/data/outside", "/")
    assert session.exec("cat", "/data/ws/inner/f") == "in\n"


def test_mkdir_rename_delete_stay_inside(session):
    _prepare(session)

    async def go():
        client = await session.client()
        try:
            await client.mkdir(ROOT, "a/b/c", parents=True)
            with pytest.raises(AgentError) as e:
                await client.mkdir(ROOT, "a/b/c")
            assert e.value.code == "EEXIST"
            await client.write_file(ROOT, "a/b/c/file", b"1")
            await client.rename(ROOT, "a/b/c/file", "x/y/moved", parents=True)
            assert await client.read_file(ROOT, "x/y/moved") == b"1"
            with pytest.raises(AgentError) as e:
                await client.delete(ROOT, "a")
            assert e.value.code == "ENOTEMPTY"
            await client.delete(ROOT, "a", recursive=True)
            await client.delete(ROOT, "to-root", recursive=True)  # removes the link, never what it points to
            names = await _names(client, ".")
            assert "a" not in names and "to-root" not in names
            with pytest.raises(AgentError) as e:
                await client.stat(ROOT, "a")
            assert e.value.code == "ENOENT"
        finally:
            await client.close()

    run(go())
    assert session.exec("ls", "/bin/busybox").strip() == "/bin/busybox"


def test_an_upload_cancelled_midway_leaves_the_target_as_it_was(session):
    _prepare(session)

    async def go():
        client = await session.client()
        try:
            await client.write_file(ROOT, "target", b"old")
            task = asyncio.ensure_future(client.write_file(ROOT, "target", bytes(64 << 20)))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await client.read_file(ROOT, "target") == b"old"
            assert [n for n in await _names(client, ".") if n.startswith(".tai-upload-")] == []
            # an upload whose connection dies is removed too
            other = await session.client()
            started = asyncio.ensure_future(other.write_file(ROOT, "target", bytes(64 << 20)))
            await asyncio.sleep(0.05)
            other.process.kill()
            with pytest.raises(AgentError):
                await started
            await other.close()
            await asyncio.sleep(0.3)
            assert await client.read_file(ROOT, "target") == b"old"
            assert [n for n in await _names(client, ".") if n.startswith(".tai-upload-")] == []
        finally:
            await client.close()

    run(go())
