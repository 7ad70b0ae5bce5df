"""Checks of sessions and their workspaces: lifecycle, env, labels, TTL reaping, specs, files, paths."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from ..contract import (
    ISOLATION_ORDER,
    NETWORK_ORDER,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    isolation_rank,
)
from .base import CheckFailed, SuiteBase, expect, expect_raises


class LifecycleChecks(SuiteBase):
    """A session's life (create, info, get, list, exec, destroy) and the env it hands its commands."""

    async def check_lifecycle(self) -> None:
        ttl = 600.0
        session = await self.session(ttl_seconds=ttl)
        info = await session.info()
        expect(info.id == session.id, f"info().id {info.id!r} differs from the session id {session.id!r}")
        expect(info.kind == self.sandbox.kind, f"info().kind {info.kind!r}, expected {self.sandbox.kind!r}")
        expect(
            abs((info.expires_at - info.created_at) - ttl) < 5, "expires_at is not created_at + ttl_seconds"
        )
        expect(bool(info.workspace), "info().workspace is empty")
        again = await self.sandbox.get(session.id)
        expect(again.id == session.id, "get(id) returned another session")
        listed = [i.id for i in await self.sandbox.list()]
        expect(session.id in listed, "list() does not show a live session")
        result = await session.exec(["echo", "alive"], timeout_seconds=self.t(30))
        expect(result.stdout == b"alive\n", f"echo gave {result.stdout!r}")
        await session.destroy()
        await expect_raises(
            SandboxNotFoundError, self.sandbox.get(session.id), "get() of a destroyed session"
        )
        expect(
            session.id not in [i.id for i in await self.sandbox.list()], "list() shows a destroyed session"
        )
        await expect_raises(
            SandboxError, session.exec(["echo"], timeout_seconds=self.t(5)), "exec in a destroyed session"
        )
        await expect_raises(
            SandboxNotFoundError, self.sandbox.get(f"no-such-{self.tag}"), "get() of an unknown id"
        )

    async def check_credential_env(self) -> None:
        secret = f"s3cret 'quoted' \"double\" $HOME ;{self.tag}"
        session = await self.session(env={"TAI_CONFORMANCE_TOKEN": secret})
        out = await self.sh(session, 'printf %s "$TAI_CONFORMANCE_TOKEN"')
        expect(out == secret.encode(), f"spec.env did not reach the command: got {out!r}")
        result = await session.exec(
            ["sh", "-c", 'printf %s "$TAI_CONFORMANCE_EXTRA"'],
            timeout_seconds=self.t(30),
            env={"TAI_CONFORMANCE_EXTRA": "per-exec"},
        )
        expect(result.stdout == b"per-exec", f"exec env did not reach the command: got {result.stdout!r}")


class WorkspaceChecks(SuiteBase):
    """Files and paths of a workspace, the consumer label, the TTL reap, and specs a provider must refuse."""

    async def check_file_transfer(self) -> None:
        session = await self.session()
        data = bytes(range(256)) * 4096
        await session.put_file("conf/deep/data.bin", data)
        expect(
            await session.get_file("conf/deep/data.bin") == data,
            "get_file did not return what put_file wrote",
        )
        result = await session.exec(["cat", "conf/deep/data.bin"], timeout_seconds=self.t(30))
        expect(
            result.stdout == data, "a command does not see the file put_file wrote (is cwd the workspace?)"
        )
        await session.put_file("conf/deep/data.bin", b"replaced")
        expect(await session.get_file("conf/deep/data.bin") == b"replaced", "put_file did not replace a file")

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(8):
                yield bytes([i]) * 100_000

        await session.put_file("streamed.bin", chunks())
        expect(
            await session.get_file("streamed.bin") == b"".join(bytes([i]) * 100_000 for i in range(8)),
            "a streamed put_file came back different",
        )
        streamed = b"".join([c async for c in session.iter_file("streamed.bin", 65536)])
        expect(len(streamed) == 800_000, f"iter_file gave {len(streamed)} bytes")
        await self.sh(session, "printf made > made.txt")
        expect(await session.get_file("made.txt") == b"made", "get_file does not see a file a command wrote")
        names = {e["name"]: e for e in await session.list_files(".")}
        expect(names.get("conf", {}).get("type") == "directory", f"list_files shows {names.get('conf')}")
        expect(names.get("made.txt", {}).get("size") == 4, f"list_files shows {names.get('made.txt')}")
        await expect_raises(
            SandboxNotFoundError, session.get_file("missing.txt"), "get_file of a missing file"
        )

    async def check_workspace_paths(self) -> None:
        session = await self.session()
        root = session.resolve(".")
        expect(
            session.resolve("a/b") == root.rstrip("/") + "/a/b",
            f"resolve('a/b') gave {session.resolve('a/b')}",
        )
        expect(
            session.resolve(root + "/x") == root.rstrip("/") + "/x", "an absolute path inside is not accepted"
        )
        pwd = (await self.sh(session, "pwd -P 2>/dev/null || pwd")).decode().strip()
        expect(
            os.path.normpath(pwd) == os.path.normpath(root) or pwd.endswith(os.path.basename(root)),
            f"commands run in {pwd}, not the workspace {root}",
        )
        for bad in ("../x", "/etc/passwd", "a/../../x", "..", "/"):
            try:
                session.resolve(bad)
            except SandboxError:
                pass
            else:
                raise CheckFailed(f"resolve({bad!r}) was accepted: it lies outside the workspace")
            await expect_raises(SandboxError, session.get_file(bad), f"get_file({bad!r})")
        marker = f"tai-conformance-escape-{self.tag}"
        await expect_raises(SandboxError, session.put_file(f"../{marker}", b"x"), "put_file through '..'")
        await expect_raises(
            SandboxError, session.put_file(f"/tmp/{marker}", b"x"), "put_file of an absolute path"
        )
        await expect_raises(
            SandboxError, session.exec(["echo"], timeout_seconds=self.t(5), cwd=".."), "exec with cwd='..'"
        )
        links = await session.exec(
            ["sh", "-c", "ln -s / escape && ln -s /etc/passwd pw"], timeout_seconds=self.t(30)
        )
        if links.exit_code == 127:
            return  # no ln in this image: the symlink half cannot be set up
        expect(links.exit_code == 0, f"could not make the test symlinks: {links.stderr!r}")
        await expect_raises(
            SandboxError, session.get_file("escape/etc/passwd"), "get_file through a symlink out"
        )
        await expect_raises(SandboxError, session.get_file("pw"), "get_file of a symlink to a file outside")
        await expect_raises(
            SandboxError, session.put_file(f"escape/tmp/{marker}", b"x"), "put_file through a symlink out"
        )
        await expect_raises(SandboxError, session.list_files("escape"), "list_files of a symlink out")
        try:
            session.resolve("escape/etc")
        except SandboxError:
            pass
        else:
            raise CheckFailed("resolve() followed a symlink out of the workspace")
        leaked = await session.exec(["ls", f"/tmp/{marker}"], timeout_seconds=self.t(10))
        expect(leaked.exit_code != 0, "a put_file outside the workspace wrote a file")

    async def check_consumer_label(self) -> None:
        consumer = f"conformance-label-{self.tag}"
        session = await self.sandbox.create(self.spec(consumer=consumer))
        self.created.append(session)
        expect((await session.info()).consumer == consumer, "info() lost the consumer label")
        listed = {i.id: i for i in await self.sandbox.list()}
        expect(
            session.id in listed and listed[session.id].consumer == consumer, "list() lost the consumer label"
        )
        again = await self.sandbox.get(session.id)
        expect((await again.info()).consumer == consumer, "get() lost the consumer label")
        if self.image is not None:
            expect((await session.info()).image == self.image, "info() lost the image")

    async def check_ttl_reap(self) -> None:
        keeper = await self.session(ttl_seconds=600)
        short = await self.session(ttl_seconds=self.t(1))
        key = f"tai-conformance-{self.tag}"
        durable = await self.session(ttl_seconds=self.t(1), durability="persistent", workspace_key=key)
        await durable.put_file("kept.txt", b"survives the reap")
        await asyncio.sleep(self.t(1.5))
        reaped = await self.sandbox.reap()
        for session in (short, durable):
            expect(session.id in reaped, f"reap() did not report the expired session {session.id}")
            await expect_raises(
                SandboxNotFoundError, self.sandbox.get(session.id), "get() of a reaped session"
            )
        expect(keeper.id not in reaped, "reap() took a session before its TTL")
        await self.sandbox.get(keeper.id)
        back = await self.session(durability="persistent", workspace_key=key)
        try:
            kept = await back.get_file("kept.txt")
        except SandboxNotFoundError:
            kept = b""
        expect(kept == b"survives the reap", "a persistent workspace did not survive its session's reap")
        await back.destroy(remove_workspace=True)
        fresh = await self.session(durability="persistent", workspace_key=key)
        await expect_raises(
            SandboxNotFoundError,
            fresh.get_file("kept.txt"),
            "a file in a workspace removed by destroy(remove_workspace=True)",
        )
        await fresh.destroy(remove_workspace=True)

    async def check_rejects_what_it_cannot_honour(self) -> None:
        # only this run's sessions count (an engine may be shared with other clients meanwhile)
        consumer = self.spec().consumer

        async def ours() -> set[str]:
            return {i.id for i in await self.sandbox.list() if i.consumer == consumer}

        before = await ours()
        cannot: list[tuple[str, dict[str, Any]]] = []
        for level in ISOLATION_ORDER:
            if isolation_rank(level) > isolation_rank(self.sandbox.max_isolation):
                cannot.append((f"isolation={level!r}", {"isolation": level}))
        for network in NETWORK_ORDER:
            if network not in self.sandbox.networks:
                cannot.append((f"network={network!r}", {"network": network}))
        if not self.sandbox.supports_limits:
            cannot += [("cpu=1", {"cpu": 1.0}), ("memory_mb=256", {"memory_mb": 256})]
        for what, changes in cannot:
            try:
                session = await self.sandbox.create(self.spec(**changes))
            except SandboxSpecRejectedError:
                continue
            except Exception as e:
                raise CheckFailed(
                    f"{what}: expected SandboxSpecRejectedError, got {type(e).__name__}: {e}"
                ) from None
            self.created.append(session)
            raise CheckFailed(f"a spec with {what} was accepted, though the provider cannot honour it")
        for level in ISOLATION_ORDER[: isolation_rank(self.sandbox.max_isolation) + 1]:
            session = await self.session(isolation=level)
            given = (await session.info()).isolation
            expect(isolation_rank(given) >= isolation_rank(level), f"isolation={level!r} got {given!r}")
            await session.destroy()
        after = await ours()
        created = {s.id for s in self.created}
        expect(after - before <= created, "a rejected spec left a session behind")
