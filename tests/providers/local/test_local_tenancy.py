"""sandbox-local tenancy: session owners survive a restart, workspace keys are a namespace per owner,
workspaces are owned and leased."""

import asyncio
import hashlib
import json
import subprocess
import sys
import textwrap
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SandboxPathError, SessionSpec
from jupyter_tai_sandbox.errors import SandboxConflictError
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.sessions import Caller, server_owner
from tests.support.aio import run


def persistent(key: str, owner: str | None, **more) -> SessionSpec:
    return SessionSpec(durability="persistent", workspace_key=key, owner=owner, **more)


def own(root, owner: str):
    """The folder of ``owner``'s own workspaces, as the provider's docstring lays it out."""
    return root / ".by-owner" / hashlib.sha256(owner.encode()).hexdigest()[:32]


def legacy_workspace(root, key: str, owner: str | None, files: dict[str, bytes]) -> None:
    """A workspace as the provider made it before keys were per owner: ``<root>/<key>`` and its owner record."""
    (root / key).mkdir(parents=True)
    for name, data in files.items():
        (root / key / name).write_bytes(data)
    if owner is not None:
        (root / ".owners").mkdir(exist_ok=True)
        (root / ".owners" / f"{key}.json").write_text(
            json.dumps({"owner": owner, "key": key, "created_at": time.time()})
        )


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


def test_two_owners_same_key_are_two_workspaces(sandbox, tmp_path):
    async def scenario():
        alice = await sandbox.create(persistent("proj", "alice"))
        await alice.put_file("mine.txt", b"alice's")
        assert (await alice.info()).workspace == str(own(tmp_path, "alice") / "proj")
        record = json.loads((own(tmp_path, "alice") / ".owners" / "proj.json").read_text())
        assert record["owner"] == "alice"
        assert sorted(p.name for p in (own(tmp_path, "alice") / "proj").iterdir()) == ["mine.txt"]
        # the session's own commands cannot reach the record through the workspace's paths
        with pytest.raises(SandboxPathError):
            await alice.put_file("../.owners/proj.json", b'{"owner": "mallory"}')

        bob = await sandbox.create(persistent("proj", "bob"))  # his own, new and empty
        assert (await bob.info()).workspace == str(own(tmp_path, "bob") / "proj")
        assert await bob.list_files(".") == []
        with pytest.raises(SandboxNotFoundError):
            await bob.get_file("mine.txt")
        await bob.put_file("mine.txt", b"bob's")
        assert len(await sandbox.list()) == 2
        # after a restart too, each gets their own
        restarted = LocalSandbox(root=str(tmp_path))
        again = await restarted.create(persistent("proj", "alice"))
        assert await again.get_file("mine.txt") == b"alice's"
        bob_again = await restarted.create(persistent("proj", "bob"))
        assert await bob_again.get_file("mine.txt") == b"bob's"
        assert not (tmp_path / "proj").exists(), "an owner's workspace went to the unscoped path"
        assert await sandbox.workspace_owner("proj") is None
        for session in (again, bob_again):
            await session.destroy()
        for session in (alice, bob):
            await session.destroy()
        assert (own(tmp_path, "alice") / "proj" / "mine.txt").read_bytes() == b"alice's"

    run(scenario())


def test_a_key_held_by_another_owner_is_not_revealed(sandbox, tmp_path):
    async def scenario():
        alice = await sandbox.create(persistent("taken", "alice"))
        await alice.put_file("x.txt", b"x")

        async def answer(key: str) -> dict:
            session = await sandbox.create(persistent(key, "bob"))
            info = (await session.info()).to_json()
            listing = await session.list_files(".")
            await session.destroy()
            for name in ("id", "created_at", "expires_at", "seconds_left"):
                info.pop(name)
            return {"info": json.loads(json.dumps(info).replace(key, "<key>")), "files": listing}

        # a key alice holds and one nobody holds: the same answer, both bob's own and empty
        assert await answer("taken") == await answer("free")
        assert await alice.get_file("x.txt") == b"x"
        await alice.destroy()

    run(scenario())


def test_a_legacy_workspace_stays_its_owners(tmp_path):
    async def scenario():
        legacy_workspace(tmp_path, "proj", "alice", {"old.txt": b"from before"})
        sandbox = LocalSandbox(root=str(tmp_path), home_owner="me")
        alice = await sandbox.create(persistent("proj", "alice"))
        assert (await alice.info()).workspace == str(tmp_path / "proj")
        assert await alice.get_file("old.txt") == b"from before"
        # someone else, the home owner included, gets their own: the old one is not theirs
        for other in ("bob", "me"):
            session = await sandbox.create(persistent("proj", other))
            assert (await session.info()).workspace == str(own(tmp_path, other) / "proj")
            assert await session.list_files(".") == []
            await session.put_file("theirs.txt", b"new")
            # removing their own never waits on alice's live session on hers
            await session.destroy(remove_workspace=True)
        assert await alice.get_file("old.txt") == b"from before"
        await alice.destroy()
        assert (tmp_path / "proj" / "old.txt").read_bytes() == b"from before"

    run(scenario())


def test_no_owner_and_the_home_owner_keep_the_seed_path(tmp_path):
    async def scenario():
        sandbox = LocalSandbox(root=str(tmp_path), home_owner="me")
        direct = await sandbox.create(persistent("notes", None))
        assert (await direct.info()).workspace == str(tmp_path / "notes")
        await direct.put_file("a.txt", b"direct")
        await direct.destroy()
        assert not (tmp_path / ".owners" / "notes.json").exists()
        home = await sandbox.create(persistent("notes", "me"))  # takes the unrecorded path
        assert (await home.info()).workspace == str(tmp_path / "notes")
        assert await home.get_file("a.txt") == b"direct"
        assert await sandbox.workspace_owner("notes") == "me"
        dave = await sandbox.create(persistent("notes", "dave"))
        assert (await dave.info()).workspace == str(own(tmp_path, "dave") / "notes")
        for session in (home, dave):
            await session.destroy()

    run(scenario())


def test_the_home_owner_is_the_servers_own_principal(sandbox):
    assert sandbox.home_owner == server_owner()


def test_the_home_owner_keeps_a_workspace_of_its_own_once_it_has_one(tmp_path):
    async def scenario():
        legacy_workspace(tmp_path, "proj", "alice", {})
        sandbox = LocalSandbox(root=str(tmp_path), home_owner="me")
        home = await sandbox.create(persistent("proj", "me"))
        await home.put_file("mine.txt", b"me")
        await home.destroy()
        alice = await sandbox.create(persistent("proj", "alice"))
        await alice.destroy(remove_workspace=True)  # the unscoped path is nobody's now
        assert not (tmp_path / "proj").exists()
        again = await sandbox.create(persistent("proj", "me"))
        assert await again.get_file("mine.txt") == b"me"
        await again.destroy()

    run(scenario())


def test_an_admin_naming_an_owner_shares_that_owners_workspace(sandbox):
    async def scenario():
        alice = await sandbox.create(persistent("proj", "alice"))
        await alice.put_file("mine.txt", b"alice's")
        await alice.destroy()
        policy, limits = SandboxPolicy(isolation="none"), sandbox.session_limits()
        admin = Caller("admin", frozenset({"read", "write"}))
        named = policy.effective_spec(persistent("proj", "alice"), limits, caller=admin)
        assert named.owner == "alice"
        shared = await sandbox.create(named)
        assert await shared.get_file("mine.txt") == b"alice's"
        await shared.destroy()
        # the admin's own "proj" is another workspace
        mine = await sandbox.create(policy.effective_spec(persistent("proj", None), limits, caller=admin))
        assert await mine.list_files(".") == []
        await mine.destroy()

    run(scenario())


def test_removing_a_workspace_another_session_holds_is_refused_and_changes_nothing(sandbox, tmp_path):
    async def scenario():
        first = await sandbox.create(persistent("proj", "alice"))
        second = await sandbox.create(persistent("proj", "alice"))
        await first.put_file("data.txt", b"precious")
        with pytest.raises(SandboxConflictError, match="proj"):
            await first.destroy(remove_workspace=True)
        assert (own(tmp_path, "alice") / "proj" / "data.txt").read_bytes() == b"precious"
        assert (await first.exec(["cat", "data.txt"], timeout_seconds=10)).stdout == b"precious"
        assert {i.id for i in await sandbox.list()} == {first.id, second.id}
        await second.destroy()
        await first.destroy(remove_workspace=True)
        assert not (own(tmp_path, "alice") / "proj").exists()
        assert not (own(tmp_path, "alice") / ".owners" / "proj.json").exists(), (
            "the removed key is free again"
        )
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
        assert not (own(tmp_path, "alice") / "proj").exists()

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
            assert (own(tmp_path, "alice") / "proj" / "data.txt").read_bytes() == b"precious"
            other.stdin.close()
            line = await asyncio.wait_for(asyncio.to_thread(other.stdout.readline), 30)
            assert line.startswith(b"released"), line
            await mine.destroy(remove_workspace=True)
            assert not (own(tmp_path, "alice") / "proj").exists()
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
            [sys.executable, "-c", holder, str(own(tmp_path, "alice") / ".locks")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(other.stdout.readline), 30)
            assert line == b"removing\n"
            with pytest.raises(SandboxConflictError, match="being removed"):
                await sandbox.create(persistent("proj", "alice"))
            assert not (own(tmp_path, "alice") / "proj").exists()
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
            assert (own(tmp_path, "alice") / "proj" / "after.txt").read_bytes() == b"still here"
        finally:
            other.kill()
            other.wait(10)
        for info in await sandbox.list():
            await (await sandbox.get(info.id)).destroy()

    run(scenario())
