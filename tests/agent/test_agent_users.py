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
            out, _, status = await (await client.start(["cat", "/proc/self/status"], uid=UID, gid=GID)).collect()
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
            cmd = await client.start(["sh", "-c", "/bin/hostile | grep socket; echo more >> /data/roots"], uid=UID, gid=GID)
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
            await client.write_file("/data", "home/u/notes.txt", b"first\n", owner=(UID, GID), mode=0o600)
            for path in ("home", "home/u", "home/u/notes.txt"):
                st = await client.stat("/data", path)
                assert (st["uid"], st["gid"]) == (UID, GID), path
            assert (await client.stat("/data", "home/u/notes.txt"))["mode"] == 0o600
            # the user's own command can append to its 0600 file and write in the folder made for it
            cmd = await client.start(["sh", "-c", "echo second >> /data/home/u/notes.txt && touch /data/home/u/new"],
                                     uid=UID, gid=GID)
            assert (await cmd.collect())[2].code == 0
            assert await client.read_file("/data", "home/u/notes.txt") == b"first\nsecond\n"
            assert (await client.stat("/data", "home/u/new"))["uid"] == UID
            # an upload over the user's file stays the user's; a folder made for them is theirs
            await client.write_file("/data", "home/u/notes.txt", b"replaced\n", owner=(UID, GID))
            assert (await client.stat("/data", "home/u/notes.txt"))["uid"] == UID
            await client.mkdir("/data", "home/u/a/b", parents=True, owner=(UID, GID))
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
