"""Docker-side tenancy (issue 13) against the real engine: owners that survive a restart, owned
workspaces, the image allow-list, operator cpu/memory limits, per-owner internal networks, and
engine refusals a user can cause answered as typed 4xx-class errors."""

from __future__ import annotations

import functools
import ipaddress
import json
import secrets

import pytest

from jupyter_tai_sandbox.contract import (
    SandboxPathError,
    SandboxSpecRejectedError,
    SessionSpec,
)
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.docker import LABEL_OWNER, LABEL_SESSION, LABEL_WORKSPACE
from jupyter_tai_sandbox.sessions import Caller
from tests.support import aio
from tests.support.docker import RUN_FILTER, TEST_IMAGE, host_listener, provider, spec

pytestmark = [pytest.mark.docker]

#: each coroutine of these tests is bounded to 120 s
run = functools.partial(aio.run, timeout=120)


def our_containers(client) -> list:
    return client.containers.list(all=True, filters={"label": RUN_FILTER})


# ------------------------------------------------------------------ (a) owner


def test_the_owner_survives_a_restart_and_is_listed(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec(owner="alice"))
        try:
            (container,) = client.containers.list(
                all=True, filters={"label": f"{LABEL_SESSION}={session.id}"}
            )
            assert container.labels[LABEL_OWNER] == "alice"
            later = provider()  # a restarted server
            again = await later.get(session.id)
            assert again.spec.owner == "alice"
            assert (await again.info()).owner == "alice"
            (listed,) = [i for i in await later.list() if i.id == session.id]
            assert listed.owner == "alice"
            await later.close()
        finally:
            await session.destroy()
            await sandbox.close()

    run(main())


# ------------------------------------------------------------- (b) workspaces


def persistent(key: str, owner: str | None) -> SessionSpec:
    return spec(durability="persistent", workspace_key=key, owner=owner)


def mounted_volume(client, session) -> str:
    """The name of the volume at /workspace in the session's container."""
    mounts = client.containers.get(session.container_id).attrs["Mounts"]
    (name,) = [m["Name"] for m in mounts if m["Destination"] == "/workspace"]
    return name


def drop_volumes(client, *names: str) -> None:
    for name in names:
        for v in client.volumes.list(filters={"name": name}):
            if v.name == name:
                v.remove(force=True)


def test_an_owners_volume_name_never_equals_an_unscoped_one():
    from jupyter_tai_sandbox.providers.docker_engine.names import Deployment
    from jupyter_tai_sandbox.providers.swarm.session import record_name

    scope = Deployment("someone@host:/config")
    owners = ["alice", "bob", "a-b", "a_b", "", "x" * 300, "\u00e9l\u00e8ve", "alice-notes"]
    keys = ["notes", "a-b", "a_b", "a.b", "x" * 64, "0"]
    unscoped = {scope.workspace_volume(k) for k in keys}
    scoped = {scope.workspace_volume(k, o) for k in keys for o in owners}
    assert len(scoped) == len(keys) * len(owners)
    assert not unscoped & scoped
    assert all(len(name) <= 255 for name in scoped)  # a volume name is a folder name on the engine's disk
    records = {record_name(scope, k) for k in keys} | {record_name(scope, k, o) for k in keys for o in owners}
    assert len(records) == len(keys) * (len(owners) + 1)
    assert all(len(name) <= 64 for name in records)  # a swarm config name


def test_two_owners_same_key_are_two_workspaces(client):
    key = f"test-{secrets.token_hex(4)}"
    scope = provider().scope
    alices, bobs = scope.workspace_volume(key, "alice"), scope.workspace_volume(key, "bob")

    async def main() -> None:
        sandbox = provider()
        try:
            alice = await sandbox.create(persistent(key, "alice"))
            await alice.put_file("secret.txt", b"alice's")
            assert mounted_volume(client, alice) == alices
            assert client.volumes.get(alices).attrs["Labels"][LABEL_OWNER] == "alice"
            bob = await sandbox.create(persistent(key, "bob"))  # his own, new and empty
            assert mounted_volume(client, bob) == bobs
            assert client.volumes.get(bobs).attrs["Labels"][LABEL_OWNER] == "bob"
            assert (await bob.exec(["ls", "-A", "/workspace"], timeout_seconds=10)).stdout == b""
            await bob.put_file("secret.txt", b"bob's")
            # removing his own never waits on, or is refused for, alice's live session on hers
            await bob.destroy(remove_workspace=True)
            assert not [v for v in client.volumes.list(filters={"name": bobs}) if v.name == bobs]
            assert await alice.get_file("secret.txt") == b"alice's"
            await alice.destroy()
            again = await provider().create(persistent(key, "alice"))  # a restarted server too
            assert await again.get_file("secret.txt") == b"alice's"
            await again.destroy(remove_workspace=True)
            names = {scope.workspace_volume(key), alices, bobs}
            assert not [v for v in client.volumes.list() if v.name in names]
        finally:
            await sandbox.close()
            drop_volumes(client, alices, bobs)

    run(main())


def test_a_key_held_by_another_owner_is_not_revealed(client):
    taken, free = f"test-{secrets.token_hex(4)}", f"test-{secrets.token_hex(4)}"
    scope = provider().scope

    async def main() -> None:
        sandbox = provider()

        async def answer(key: str) -> dict:
            session = await sandbox.create(persistent(key, "bob"))
            info = (await session.info()).to_json()
            listing = (await session.exec(["ls", "-A", "/workspace"], timeout_seconds=10)).stdout
            await session.destroy(remove_workspace=True)
            for name in ("id", "created_at", "expires_at", "seconds_left"):
                info.pop(name)
            return {"info": json.loads(json.dumps(info).replace(key, "<key>")), "files": listing}

        try:
            alice = await sandbox.create(persistent(taken, "alice"))
            await alice.put_file("x.txt", b"x")
            # a key alice holds (her session live) and one nobody holds: the same answer
            assert await answer(taken) == await answer(free)
            assert await alice.get_file("x.txt") == b"x"
            await alice.destroy(remove_workspace=True)
        finally:
            await sandbox.close()
            drop_volumes(
                client, *(scope.workspace_volume(k, o) for k in (taken, free) for o in ("alice", "bob"))
            )

    run(main())


def test_a_legacy_workspace_stays_its_owners(client):
    key = f"test-{secrets.token_hex(4)}"
    sandbox = provider()
    legacy = sandbox.scope.workspace_volume(key)
    bobs = sandbox.scope.workspace_volume(key, "bob")

    async def main() -> None:
        try:
            # alice's volume as the provider made it before keys were per owner: the unscoped name, her label
            client.volumes.create(
                legacy, labels={**sandbox.own_labels, LABEL_WORKSPACE: key, LABEL_OWNER: "alice"}
            )
            direct = await sandbox.create(persistent(key, None))  # no owner: the unscoped volume, as before
            assert mounted_volume(client, direct) == legacy
            await direct.put_file("old.txt", b"from before")
            await direct.destroy()
            alice = await sandbox.create(persistent(key, "alice"))
            assert mounted_volume(client, alice) == legacy
            assert await alice.get_file("old.txt") == b"from before"
            bob = await sandbox.create(persistent(key, "bob"))
            assert mounted_volume(client, bob) == bobs
            assert (await bob.exec(["ls", "-A", "/workspace"], timeout_seconds=10)).stdout == b""
            await bob.destroy(remove_workspace=True)
            assert client.volumes.get(legacy).name == legacy, "bob's removal took alice's volume"
            await alice.destroy(remove_workspace=True)  # hers: the legacy volume
            assert not [v for v in client.volumes.list(filters={"name": legacy}) if v.name == legacy]
        finally:
            await sandbox.close()
            drop_volumes(client, legacy, bobs)

    run(main())


def test_the_home_owner_shares_a_keys_workspace_with_the_python_api_without_an_owner(client):
    """On a single-user server every caller is the server's account (``home_owner``): its ``notes`` is the
    volume a spec without an owner uses, made before or after; another owner's is still their own."""
    key = f"test-{secrets.token_hex(4)}"
    sandbox = provider(home_owner="me")
    unscoped = sandbox.scope.workspace_volume(key)
    bobs = sandbox.scope.workspace_volume(key, "bob")

    async def main() -> None:
        try:
            direct = await sandbox.create(persistent(key, None))  # the Python API, no owner recorded
            await direct.put_file("notes.txt", b"from the API")
            await direct.destroy()
            me = await sandbox.create(persistent(key, "me"))
            assert mounted_volume(client, me) == unscoped
            assert await me.get_file("notes.txt") == b"from the API"
            bob = await sandbox.create(persistent(key, "bob"))
            assert mounted_volume(client, bob) == bobs
            await bob.destroy(remove_workspace=True)
            await me.destroy(remove_workspace=True)
        finally:
            await sandbox.close()
            drop_volumes(client, unscoped, bobs)

    run(main())


def test_an_admin_naming_an_owner_shares_that_owners_workspace(client):
    key = f"test-{secrets.token_hex(4)}"
    scope = provider().scope

    async def main() -> None:
        sandbox = provider()
        policy, admin = SandboxPolicy(), Caller("admin", frozenset({"read", "write"}))
        try:
            alice = await sandbox.create(persistent(key, "alice"))
            await alice.put_file("secret.txt", b"alice's")
            await alice.destroy()
            named = policy.effective_spec(persistent(key, "alice"), sandbox.session_limits(), caller=admin)
            assert named.owner == "alice"
            shared = await sandbox.create(named)
            assert await shared.get_file("secret.txt") == b"alice's"
            await shared.destroy()
            own = policy.effective_spec(persistent(key, None), sandbox.session_limits(), caller=admin)
            mine = await sandbox.create(own)  # the admin's own key of that name is another workspace
            assert (await mine.exec(["ls", "-A", "/workspace"], timeout_seconds=10)).stdout == b""
            await mine.destroy(remove_workspace=True)
            # no owner at all (the Python API used directly): the unscoped volume, not alice's
            direct = await sandbox.create(persistent(key, None))
            assert mounted_volume(client, direct) == scope.workspace_volume(key)
            assert (await direct.exec(["ls", "-A", "/workspace"], timeout_seconds=10)).stdout == b""
            await direct.destroy(remove_workspace=True)
        finally:
            await sandbox.close()
            drop_volumes(
                client,
                scope.workspace_volume(key),
                *(scope.workspace_volume(key, o) for o in ("alice", "admin")),
            )

    run(main())


# ----------------------------------------------------------------- (c) images


def test_image_allow_list():
    sandbox = provider(allowed_images=["busybox", "registry.example.com/team/*"])
    assert sandbox.image_allowed(None)
    assert sandbox.image_allowed(TEST_IMAGE)
    assert sandbox.image_allowed(TEST_IMAGE.rsplit(":", 1)[0])  # the same image, tag left implicit
    assert sandbox.image_allowed("busybox:latest") and sandbox.image_allowed("busybox")
    assert not sandbox.image_allowed("busybox:1.36")
    assert sandbox.image_allowed("registry.example.com/team/tool:2")
    assert not sandbox.image_allowed("registry.example.com/other/tool:2")
    assert not provider().image_allowed("busybox")  # default: only the configured image


@pytest.mark.parametrize(
    "image, words",
    [
        ("UPPER/Case:x", "not a valid image reference"),
        ("a b", "not a valid image reference"),
        ("x" * 300, "not a valid image reference"),
        ("busybox@sha256:abc", "not a valid image reference"),
        (f"tai-sbx-test/no-such-image:{secrets.token_hex(4)}", "is not on the Docker engine"),
    ],
    ids=["uppercase", "space", "long", "bad-digest", "missing"],
)
def test_a_bad_or_missing_image_is_a_spec_rejection(client, image, words):
    sandbox = provider()
    try:
        with pytest.raises(SandboxSpecRejectedError, match=words):
            run(sandbox.create(spec(image=image)))
    finally:
        run(sandbox.close())


# ----------------------------------------------------------------- (d) limits


def test_default_limits_apply_to_every_session(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        try:
            host = client.containers.get(session.container_id).attrs["HostConfig"]
            assert host["NanoCpus"] == 1_000_000_000
            assert host["Memory"] == 1024 << 20
            assert (session.spec.cpu, session.spec.memory_mb) == (1.0, 1024)
            lowered = await sandbox.create(spec(cpu=0.25, memory_mb=32))
            host = client.containers.get(lowered.container_id).attrs["HostConfig"]
            assert (host["NanoCpus"], host["Memory"]) == (250_000_000, 32 << 20)
            await lowered.destroy()
        finally:
            await session.destroy()
            await sandbox.close()

    run(main())


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"cpu": 1000}, r"cpu: 1000 is over the operator's maximum of 2 CPUs"),
        ({"cpu": 2.5}, r"cpu: 2.5 is over the operator's maximum of 2 CPUs"),
        ({"cpu": 1e-12}, r"cpu: 1e-12 is under the Docker engine's minimum of 0.01"),
        ({"memory_mb": 1}, r"memory_mb: 1 is under the Docker engine's minimum of 6 MiB"),
        ({"memory_mb": 5000}, r"memory_mb: 5000 is over the operator's maximum of 4096 MiB"),
    ],
    ids=["cpu-1000", "cpu-over", "cpu-tiny", "memory-1", "memory-over"],
)
def test_limits_out_of_range_are_rejected_naming_field_and_limit(client, changes, words):
    sandbox = provider()
    before = {c.id for c in our_containers(client)}
    try:
        with pytest.raises(SandboxSpecRejectedError, match=words):
            run(sandbox.create(spec(**changes)))
    finally:
        run(sandbox.close())
    assert {c.id for c in our_containers(client)} == before


def test_without_a_maximum_the_engine_refusal_is_still_a_spec_rejection(client):
    sandbox = provider(max_cpu=0)
    try:
        with pytest.raises(SandboxSpecRejectedError, match="refused the session: Range of CPUs") as raised:
            run(sandbox.create(spec(cpu=1000)))
        assert "http+docker" not in str(raised.value)  # the engine's message, not the SDK's URL
    finally:
        run(sandbox.close())


# -------------------------------------------------------- (e) owner networks


def test_internal_networks_are_per_owner(client):
    async def reach(session, address: str, port: int) -> bytes:
        result = await session.exec(
            ["sh", "-c", f"nc -w 2 {address} {port} </dev/null 2>&1; echo rc=$?"], timeout_seconds=20
        )
        return result.stdout

    async def address_of(session) -> str:
        out = (
            await session.exec(["sh", "-c", "ip -4 -o addr show eth0"], timeout_seconds=10)
        ).stdout.decode()
        return out.split("inet ", 1)[1].split("/", 1)[0]

    async def main() -> None:
        sandbox = provider()
        made = []
        try:
            with host_listener() as port:
                for owner in ("alice", "alice", "bob"):
                    made.append(await sandbox.create(spec(network="internal", owner=owner)))
                alice1, alice2, bob = made
                nets = {
                    s.id: list(client.containers.get(s.container_id).attrs["NetworkSettings"]["Networks"])
                    for s in made
                }
                assert nets[alice1.id] == nets[alice2.id] and nets[alice1.id] != nets[bob.id]
                for name in {n for names in nets.values() for n in names}:
                    assert name.startswith("tai-sbx-internal-")
                    assert client.networks.get(name).attrs["Internal"] is True
                listener = await alice1.exec_start(
                    ["nc", "-ll", "-p", "9000", "-e", "echo", "pong"], timeout_seconds=60
                )
                try:
                    target = await address_of(alice1)
                    assert b"pong" in await reach(alice2, target, 9000)  # the same owner: reachable
                    out = await reach(bob, target, 9000)
                    assert b"pong" not in out and b"rc=0" not in out, out  # another owner: not
                    ipam = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
                    gateway = ipam.get("Gateway") or str(ipaddress.ip_network(ipam["Subnet"])[1])
                    out = await reach(bob, gateway, port)
                    assert b"pong" not in out and b"rc=0" not in out, out  # the host: not
                finally:
                    await listener.kill()
        finally:
            for session in made:
                await session.destroy()
            await sandbox.close()
        names = [n for names in nets.values() for n in names]
        assert [n.name for n in client.networks.list() if n.name in names] == []  # gone with their sessions

    run(main())


# ------------------------------------------------------- (f) typed refusals


def test_a_file_name_too_long_is_a_path_error(client):
    async def main() -> None:
        sandbox = provider()
        session = await sandbox.create(spec())
        name = "n" * 300
        try:
            with pytest.raises(SandboxPathError, match="at most 255 bytes"):
                await session.get_file(name)
            with pytest.raises(SandboxPathError, match="at most 255 bytes"):
                await session.put_file(f"folder/{name}", b"x")
            with pytest.raises(SandboxPathError, match="at most 255 bytes"):
                await session.list_files(name)
            with pytest.raises(SandboxPathError):
                session.resolve(name)
        finally:
            await session.destroy()
            await sandbox.close()

    run(main())


def test_removing_a_workspace_in_use_is_a_conflict_not_an_engine_error(client):
    from jupyter_tai_sandbox.errors import SandboxConflictError

    key = f"test-{secrets.token_hex(4)}"

    async def main() -> None:
        sandbox = provider()
        first = await sandbox.create(spec(durability="persistent", workspace_key=key))
        second = await sandbox.create(spec(durability="persistent", workspace_key=key))
        try:
            with pytest.raises(SandboxConflictError, match="in use"):
                await first.destroy(remove_workspace=True)
        finally:
            await second.destroy(remove_workspace=True)
            await first.destroy()
            await sandbox.close()

    run(main())
    assert [
        v.name for v in client.volumes.list(filters={"name": provider().scope.workspace_volume(key)})
    ] == []
