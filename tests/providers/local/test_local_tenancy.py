"""sandbox-local tenancy: session owners survive a restart, workspaces are owned, keys are leased."""

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SandboxPathError, SessionSpec
from jupyter_tai_sandbox.errors import SandboxConflictError
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.aio import run


def persistent(key: str, owner: str | None, **more) -> SessionSpec:
    return SessionSpec(durability="persistent", workspace_key=key, owner=owner, **more)


def test_the_owner_is_in_the_sidecar_and_survives_a_restart(sandbox, tmp_path):
    async def scenario():
        scratch = await sandbox.create(
            SessionSpec(owner="alice", consumer="notebook", env={"TOKEN": "secret"})
        )
        durable = await sandbox.create(persistent("proj", "bob"))
        await scratch.put_file("note.txt", b"kept")
        sidecar = json.loads((tmp_path / ".sessions" / f"{scratch.id}.json").read_text())
        assert sidecar["owner"] == "alice" and sidecar["spec"]["owner"] == "alice"
        assert "secret" not in (tmp_path / ".sessions" / f"{scratch.id}.json").read_text()

        restarted = LocalSandbox(root=str(tmp_path))  # a new server process's provider on the same root
        adopted = await restarted.get(scratch.id)
        info = await adopted.info()
        assert (info.owner, info.consumer, info.workspace) == (
            "alice",
            "notebook",
            str(tmp_path / ".ephemeral" / scratch.id),
        )
        assert info.expires_at == (await scratch.info()).expires_at
        owners = {i.id: i.owner for i in await restarted.list()}
        assert owners == {scratch.id: "alice", durable.id: "bob"}
        result = await adopted.exec(["cat", "note.txt"], timeout_seconds=10)
        assert result.stdout == b"kept"
        await adopted.destroy()
        assert not (tmp_path / ".ephemeral" / scratch.id).exists()
        with pytest.raises(SandboxNotFoundError):
            await LocalSandbox(root=str(tmp_path)).get(scratch.id)
        await durable.destroy()
        await (await restarted.get(durable.id)).destroy()
        assert await restarted.list() == []

    run(scenario())


def test_unknown_or_malformed_ids_are_not_found(sandbox):
    async def scenario():
        for session_id in ("sbx-0000000000000000", "../etc/passwd", "sbx-../../x", "", 3):
            with pytest.raises(SandboxNotFoundError):
                await sandbox.get(session_id)

    run(scenario())


def test_a_persistent_workspace_records_its_owner_outside_it_and_refuses_others(sandbox, tmp_path):
    async def scenario():
        alice = await sandbox.create(persistent("proj", "alice"))
        await alice.put_file("mine.txt", b"alice's")
        record = json.loads((tmp_path / ".owners" / "proj.json").read_text())
        assert record["owner"] == "alice"
        assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["mine.txt"]
        # the session's own commands cannot reach the record through the workspace's paths
        with pytest.raises(SandboxPathError):
            await alice.put_file("../.owners/proj.json", b'{"owner": "mallory"}')

        sessions_before = sorted((tmp_path / ".sessions").iterdir())
        with pytest.raises(SandboxNotFoundError, match="proj"):
            await sandbox.create(persistent("proj", "bob"))
        assert sorted((tmp_path / ".sessions").iterdir()) == sessions_before, "bob's session was made"
        assert len(await sandbox.list()) == 1
        with pytest.raises(SandboxNotFoundError):  # after a restart too
            await LocalSandbox(root=str(tmp_path)).create(persistent("proj", "bob"))

        unchecked = await sandbox.create(persistent("proj", None))  # no principal: no check
        again = await sandbox.create(persistent("proj", "alice"))
        assert await again.get_file("mine.txt") == b"alice's"
        assert await sandbox.workspace_owner("proj") == "alice"
        assert await sandbox.workspace_owner("nobody-has-it") is None
        for session in (unchecked, again, alice):
            await session.destroy()
        assert (tmp_path / "proj" / "mine.txt").exists()

    run(scenario())


def test_a_key_first_used_without_an_owner_is_claimed_by_the_first_owner(sandbox, tmp_path):
    async def scenario():
        await (await sandbox.create(persistent("shared", None))).destroy()
        assert not (tmp_path / ".owners" / "shared.json").exists()
        await (await sandbox.create(persistent("shared", "carol"))).destroy()
        with pytest.raises(SandboxNotFoundError):
            await sandbox.create(persistent("shared", "dave"))

    run(scenario())


def test_removing_a_workspace_another_session_holds_is_refused_and_changes_nothing(sandbox, tmp_path):
    async def scenario():
        first = await sandbox.create(persistent("proj", "alice"))
        second = await sandbox.create(persistent("proj", "alice"))
        await first.put_file("data.txt", b"precious")
        with pytest.raises(SandboxConflictError, match="proj"):
            await first.destroy(remove_workspace=True)
        assert (tmp_path / "proj" / "data.txt").read_bytes() == b"precious"
        assert (await first.exec(["cat", "data.txt"], timeout_seconds=10)).stdout == b"precious"
        assert {i.id for i in await sandbox.list()} == {first.id, second.id}
        await second.destroy()
        await first.destroy(remove_workspace=True)
        assert not (tmp_path / "proj").exists()
        assert not (tmp_path / ".owners" / "proj.json").exists(), "the removed key is free again"
        bob = await sandbox.create(persistent("proj", "bob"))
        await bob.destroy(remove_workspace=True)

    run(scenario())


def test_a_reaped_session_lets_go_of_its_lease(sandbox, tmp_path):
    async def scenario():
        short = await sandbox.create(persistent("proj", "alice", ttl_seconds=0.2))
        keeper = await sandbox.create(persistent("proj", "alice"))
        await asyncio.sleep(0.3)
        assert await sandbox.reap() == [short.id]
        await keeper.destroy(remove_workspace=True)
        assert not (tmp_path / "proj").exists()

    run(scenario())


SECOND_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from jupyter_tai_sandbox.contract import SessionSpec
    from jupyter_tai_sandbox.providers.local import LocalSandbox

    async def main():
        sandbox = LocalSandbox(root=sys.argv[1])
        session = await sandbox.create(
            SessionSpec(durability="persistent", workspace_key="proj", owner="alice", ttl_seconds=600)
        )
        print("holding", session.id, flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await session.destroy()
        print("released", flush=True)

    asyncio.run(main())
    """
)


def test_a_session_in_another_server_process_holds_the_key_against_removal(sandbox, tmp_path):
    async def scenario():
        mine = await sandbox.create(persistent("proj", "alice"))
        await mine.put_file("data.txt", b"precious")
        other = subprocess.Popen(
            [sys.executable, "-c", SECOND_SERVER, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(other.stdout.readline), 30)
            assert line.startswith(b"holding"), line
            with pytest.raises(SandboxConflictError):
                await mine.destroy(remove_workspace=True)
            assert (tmp_path / "proj" / "data.txt").read_bytes() == b"precious"
            other.stdin.close()
            line = await asyncio.wait_for(asyncio.to_thread(other.stdout.readline), 30)
            assert line.startswith(b"released"), line
            await mine.destroy(remove_workspace=True)
            assert not (tmp_path / "proj").exists()
        finally:
            other.kill()
            other.wait(10)

    run(scenario())


def test_a_removal_in_progress_elsewhere_refuses_new_sessions_on_the_key(sandbox, tmp_path):
    holder = textwrap.dedent(
        """
        import fcntl, os, sys
        os.makedirs(sys.argv[1], exist_ok=True)
        fd = os.open(os.path.join(sys.argv[1], "proj.lock"), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("removing", flush=True)
        sys.stdin.read()
        """
    )

    async def scenario():
        other = subprocess.Popen(
            [sys.executable, "-c", holder, str(tmp_path / ".locks")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(other.stdout.readline), 30)
            assert line == b"removing\n"
            with pytest.raises(SandboxConflictError, match="being removed"):
                await sandbox.create(persistent("proj", "alice"))
            assert not (tmp_path / "proj").exists()
            other.stdin.close()
            other.wait(10)
            session = await sandbox.create(persistent("proj", "alice"))
            await session.destroy()
        finally:
            other.kill()
            other.wait(10)

    run(scenario())


def test_a_running_servers_sessions_stay_its_own_and_a_killed_ones_are_adopted(sandbox, tmp_path):
    async def scenario():
        other = subprocess.Popen(
            [sys.executable, "-c", SECOND_SERVER, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(other.stdout.readline), 30)
            session_id = line.split()[1].decode()
            assert await sandbox.list() == [], "a running server's session was taken over"
            with pytest.raises(SandboxNotFoundError):
                await sandbox.get(session_id)
            other.kill()  # the server dies without a teardown
            other.wait(10)
            adopted = await sandbox.get(session_id)
            assert (await adopted.info()).owner == "alice"
            await adopted.put_file("after.txt", b"still here")
            # the adopted session holds the key's lease now
            with pytest.raises(SandboxConflictError):
                await (await sandbox.create(persistent("proj", "alice"))).destroy(remove_workspace=True)
            await adopted.destroy(remove_workspace=False)
            assert (tmp_path / "proj" / "after.txt").read_bytes() == b"still here"
        finally:
            other.kill()
            other.wait(10)
        for info in await sandbox.list():
            await (await sandbox.get(info.id)).destroy()

    run(scenario())
