"""The vm provider's persistent workspaces are per owner (issue 50 finding 7): alice's ``notes`` and bob's
``notes`` are two disk images; one made before keys were per owner stays its recorded owner's. The naming
through real files (no QEMU), then real QEMU microVMs under TCG (skipped without QEMU and the guest, failing
under ``CI=true``: bash .ci/vm-up)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SessionSpec
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.vm import VmSandbox
from jupyter_tai_sandbox.sessions import Caller
from tests.support.vm import need_qemu

NONE = {"network": "none"}


@pytest.fixture
def state_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tai-vmw-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def provider(state_dir: str) -> VmSandbox:
    return VmSandbox(accel="tcg", state_dir=state_dir, deployment="vm-workspace-tests")


def persistent(key: str, owner: str | None) -> SessionSpec:
    return SessionSpec(durability="persistent", workspace_key=key, owner=owner, **NONE)


def legacy_image(sandbox: VmSandbox, key: str, owner: str) -> Path:
    """A workspace image as the provider made it before keys were per owner: the key's hash, its owner
    recorded beside it."""
    record = {"key": key, "owner": owner, "labels": sandbox.own_labels}
    return asyncio.run(sandbox._machines.ensure_workspace(key, record, 16))


def test_each_owner_has_images_of_their_own_and_a_legacy_one_stays_its_owners(state_dir):
    sandbox = provider(state_dir)
    machines = sandbox._machines
    keys, owners = ("notes", "a-b", "a_b", "x" * 64), ("alice", "bob", "", "\u00e9l\u00e8ve", "x" * 300)
    # an unscoped image's name is 32 hex digits, an owner's 32-32: the two kinds never meet
    assert {len(machines.workspace_image(k).stem) for k in keys} == {32}
    assert {len(machines.workspace_image(k, o).stem) for k in keys for o in owners} == {65}
    assert len({machines.workspace_image(k, o) for k in keys for o in owners}) == len(keys) * len(owners)
    unscoped = machines.workspace_image("notes")
    # no images yet: an owner's key is their own, no owner's is the unscoped one
    assert sandbox._workspace_scope(persistent("notes", "alice")) == "alice"
    assert sandbox._workspace_scope(persistent("notes", None)) is None
    assert legacy_image(sandbox, "notes", "alice") == unscoped
    assert sandbox._workspace_scope(persistent("notes", "alice")) is None  # hers, carried over
    assert sandbox._workspace_scope(persistent("notes", "bob")) == "bob"  # not his: his own
    bobs = asyncio.run(sandbox._workspace_image(persistent("notes", "bob")))
    assert bobs == machines.workspace_image("notes", "bob") != unscoped
    assert machines.workspace_record("notes", "bob")["owner"] == "bob"
    machines.remove_workspace("notes", "bob")
    assert not bobs.exists() and unscoped.exists()


@pytest.mark.slow(40)
@pytest.mark.timeout(240)
def test_two_owners_same_key_are_two_workspaces_and_a_legacy_one_stays_its_owners(state_dir):
    need_qemu()

    async def main() -> None:
        sandbox = provider(state_dir)
        legacy = await sandbox._machines.ensure_workspace(
            "notes", {"key": "notes", "owner": "alice", "labels": sandbox.own_labels}, 64
        )
        sessions = []
        try:
            direct = await sandbox.create(persistent("notes", None))  # no owner: the unscoped image
            await direct.put_file("old.txt", b"from before")
            await direct.destroy()
            alice = await sandbox.create(persistent("notes", "alice"))
            sessions.append(alice)
            assert await alice.get_file("old.txt") == b"from before"
            # bob's "notes" is his own, live beside alice's (no conflict, nothing of hers)
            bob = await sandbox.create(persistent("notes", "bob"))
            sessions.append(bob)
            with pytest.raises(SandboxNotFoundError):
                await bob.get_file("old.txt")
            await bob.destroy(remove_workspace=True)
            assert legacy.exists() and not sandbox._machines.workspace_image("notes", "bob").exists()
            await alice.destroy()
            # an admin naming alice as the owner shares hers
            admin = Caller("admin", frozenset({"read", "write"}))
            named = SandboxPolicy(isolation="vm").effective_spec(
                persistent("notes", "alice"), sandbox.session_limits(), caller=admin
            )
            shared = await sandbox.create(named)
            sessions.append(shared)
            assert await shared.get_file("old.txt") == b"from before"
            await shared.destroy(remove_workspace=True)
            assert not legacy.exists()
        finally:
            for session in sessions:
                await session.destroy()
            await sandbox.close()

    asyncio.run(main())
