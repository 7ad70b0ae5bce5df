"""Commands run as a non-root session user, and files the agent writes for that user, in a real container."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.agent import AgentError
from tests.support.agent import run

UID, GID = 1234, 2345


def _status_ids(status: str) -> dict[str, list[str]]:
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {k: fields[k].split() for k in ("Uid", "Gid", "Groups")}


def test_a_command_runs_as_the_given_uid_and_gid_with_no_supplementary_groups(session):
    async def go():
        client = await session.client()
        try:
            out, _, status = await (
                await client.start(["cat", "/proc/self/status"], uid=UID, gid=GID)
            ).collect()
            assert status.code == 0
            ids = _status_ids(out.decode())
            assert ids["Uid"] == [str(UID)] * 4 and ids["Gid"] == [str(GID)] * 4
            assert ids["Groups"] == []
            # gid defaults to the uid; without either the command stays the agent's root
            out, _, _ = await (await client.start(["cat", "/proc/self/status"], uid=UID)).collect()
            assert _status_ids(out.decode())["Gid"] == [str(UID)] * 4
            out, _, _ = await (await client.start(["id", "-u"])).collect()
            assert out.strip() == b"0"
        finally:
            await client.close()

    run(go())


def test_a_non_root_command_is_refused_by_the_agents_socket_and_cannot_write_roots_files(session):
    async def go():
        client = await session.client()
        try:
            await client.write_file("/data", "roots", b"root's\n")  # 0644, root's
            cmd = await client.start(
                ["sh", "-c", "/bin/hostile | grep socket; echo more >> /data/roots"], uid=UID, gid=GID
            )
            out, err, status = await cmd.collect()
            assert status.code != 0
            assert out.startswith(b"REFUSED socket"), out  # the agent answers no peer it did not expect
            assert b"Permission denied" in err
            assert await client.read_file("/data", "roots") == b"root's\n"
        finally:
            await client.close()

    run(go())


def test_an_upload_for_the_user_is_theirs_with_the_folders_it_made(session):
    async def go():
        client = await session.client()
        try:
            await client.write_file("/data", "home/u/notes.txt", b"first\n", user=(UID, GID), mode=0o600)
            for path in ("home", "home/u", "home/u/notes.txt"):
                st = await client.stat("/data", path)
                assert (st["uid"], st["gid"]) == (UID, GID), path
            assert (await client.stat("/data", "home/u/notes.txt"))["mode"] == 0o600
            # the user's own command can append to its 0600 file and write in the folder made for it
            cmd = await client.start(
                ["sh", "-c", "echo second >> /data/home/u/notes.txt && touch /data/home/u/new"],
                uid=UID,
                gid=GID,
            )
            assert (await cmd.collect())[2].code == 0
            assert await client.read_file("/data", "home/u/notes.txt") == b"first\nsecond\n"
            assert (await client.stat("/data", "home/u/new"))["uid"] == UID
            # an upload over the user's file stays the user's; a folder made for them is theirs
            await client.write_file("/data", "home/u/notes.txt", b"replaced\n", user=(UID, GID))
            assert (await client.stat("/data", "home/u/notes.txt"))["uid"] == UID
            await client.mkdir("/data", "home/u/a/b", parents=True, user=(UID, GID))
            assert (await client.stat("/data", "home/u/a/b"))["gid"] == GID
            # without an owner the agent's files stay root's
            await client.write_file("/data", "plain", b"x")
            assert (await client.stat("/data", "plain"))["uid"] == 0
            with pytest.raises(AgentError) as e:  # half an owner is refused, nothing is created
                await client._file(0x39, {"root": "/data", "path": "half", "parents": False, "uid": UID})
            assert e.value.code == "EINVAL"
        finally:
            await client.close()

    run(go())


def test_a_program_the_user_may_not_run_is_a_typed_error(session):
    async def go():
        client = await session.client()
        try:
            await client.write_file("/data", "rootonly", b"#!/bin/sh\necho hi\n", mode=0o700)
            with pytest.raises(AgentError) as e:
                await client.start(["/data/rootonly"], uid=UID, gid=GID)
            assert e.value.code == "EACCES"
            cmd = await client.start(["/data/rootonly"])  # root may
            assert (await cmd.collect())[0] == b"hi\n"
        finally:
            await client.close()

    run(go())


def test_file_operations_for_a_user_have_that_users_rights_and_no_more(session):
    """Each file operation with ``user`` runs on a thread with the user's fsuid/fsgid and no groups: what root
    may touch and the user may not is refused (EACCES) for every kind of operation, and the agent's own
    operations keep root's rights after them."""

    async def go():
        client = await session.client()
        try:
            await client.mkdir("/data", "rootdir")  # root's, 0755
            await client.write_file("/data", "rootdir/secret", b"root's\n", mode=0o600)
            await client.mkdir("/data", "rootdir/closed")
            setup = await client.start(["sh", "-c", "chmod 700 /data/rootdir/closed"])
            assert (await setup.wait()).code == 0
            as_user = (UID, GID)
            refused = {
                "read": client.read_file("/data", "rootdir/secret", user=as_user),
                "list": client.listdir("/data", "rootdir/closed", user=as_user),
                "stat": client.stat("/data", "rootdir/closed/x", user=as_user),
                "upload": client.write_file("/data", "rootdir/new", b"x", user=as_user),
                "mkdir": client.mkdir("/data", "rootdir/sub", user=as_user),
                "delete": client.delete("/data", "rootdir/secret", user=as_user),
                "rename": client.rename("/data", "rootdir/secret", "stolen", user=as_user),
            }
            for name, op in refused.items():
                with pytest.raises(AgentError) as e:
                    await op
                assert e.value.code == "EACCES", (name, e.value)
            # what the user may do, they do as themselves; root still has root's rights afterwards
            assert (await client.stat("/data", "rootdir/secret", user=as_user))["size"] == 7
            assert await client.read_file("/data", "rootdir/secret") == b"root's\n"
            await client.write_file("/data", "rootdir/closed/x", b"root")
            assert [e["name"] for e in await client.listdir("/data", "rootdir/closed")] == ["x"]
            await client.write_file("/data", "mine/file", b"mine", user=as_user)
            await client.rename("/data", "mine/file", "mine/renamed", user=as_user)
            st = await client.stat("/data", "mine/renamed")
            assert (st["uid"], st["gid"]) == as_user
            await client.delete("/data", "mine", recursive=True, user=as_user)
        finally:
            await client.close()

    run(go())
