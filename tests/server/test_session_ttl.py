"""Extending (or shortening) a session's TTL: set_expiry on each provider, durable across a restarted
provider and honoured by the reaper; PATCH /api/sandbox/sessions/{id} with the operator's limits and
the owner rules."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SessionSpec
from tests.support.server import call, make_provider, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user


@pytest.mark.parametrize(("kind", "pool"), [("local", 0), ("docker", 0), ("docker", 1)])
def test_a_new_expiry_is_durable_and_the_reaper_honours_it(kind, tmp_path, pool):
    provider = kind
    traits = {"pool_size": pool} if pool else {}

    async def main():
        first = make_provider(provider, tmp_path, **traits)
        if pool:
            await first.list()  # connects: the pool fills
            for _ in range(200):
                if first._pool._ready:
                    break
                await asyncio.sleep(0.05)
        session = await first.create(SessionSpec(ttl_seconds=1.5))
        if pool:
            assert session.record is not None, "the session was not taken from the pool"
        info = await session.info()
        longer = info.created_at + 600
        changed = await session.set_expiry(longer)
        assert changed.expires_at == longer and (await session.info()).expires_at == longer
        await asyncio.sleep(max(0.0, info.expires_at - time.time()) + 0.3)  # past the first TTL
        # a restarted server (a new provider object on the same root or engine) sees the new end
        second = make_provider(provider, tmp_path)
        assert session.id not in await second.reap()
        assert session.id not in await first.reap()
        again = await second.get(session.id)
        assert (await again.info()).expires_at == pytest.approx(longer, abs=0.01)
        assert [i.expires_at for i in await second.list() if i.id == session.id] == [
            pytest.approx(longer, abs=0.01)
        ]
        result = await again.exec(["sh", "-c", "echo alive"], timeout_seconds=20)
        assert result.stdout == b"alive\n"
        # shortened: now the reaper takes it, in the provider that did not make the change too
        soon = time.time() + 0.5
        await again.set_expiry(soon)
        if provider != "local":  # a local provider keeps its own sessions in memory; its reap rereads them
            assert (await (await first.get(session.id)).info()).expires_at == pytest.approx(soon, abs=0.01)
        await asyncio.sleep(0.8)
        assert session.id in await first.reap()
        fresh = make_provider(provider, tmp_path)
        with pytest.raises(SandboxNotFoundError):
            await fresh.get(session.id)
        await fresh.close()
        await first.close()
        await second.close()

    asyncio.run(main())


def test_docker_ttl_records_are_one_per_session_and_go_with_it(tmp_path, monkeypatch):
    from jupyter_tai_sandbox.providers.docker import LABEL_TTL
    from tests.support.docker import docker_client, leftovers

    client = docker_client()

    def records(session_id):
        return client.volumes.list(filters={"label": f"{LABEL_TTL}={session_id}"})

    async def main():
        sandbox = make_provider("docker", tmp_path)
        session = await sandbox.create(SessionSpec(ttl_seconds=60))
        created = (await session.info()).created_at
        for ttl in (120, 180, 90):
            await session.set_expiry(created + ttl)
        assert len(records(session.id)) == 1  # each change replaced the older record
        assert (await (await sandbox.get(session.id)).info()).expires_at == pytest.approx(
            created + 90, abs=0.01
        )
        await session.destroy()
        assert records(session.id) == []
        # a record whose session is gone (removed behind the provider's back) is swept by a reap
        other = await sandbox.create(SessionSpec(ttl_seconds=60))
        await other.set_expiry(created + 120)
        client.api.remove_container(other.container_id, force=True, v=True)
        from jupyter_tai_sandbox.providers import _docker_networks
        from jupyter_tai_sandbox.providers.docker import ttl as _docker_ttl

        # no grace for the stray record, nor for the network the removed container left (the reaper leaves
        # a young network to a server that may be about to join it: past the grace it would reclaim it)
        monkeypatch.setattr(_docker_ttl, "STRAY_TTL_GRACE_SECONDS", 0.0)
        monkeypatch.setattr(_docker_networks, "REAP_GRACE_SECONDS", 0.0)
        await sandbox.reap()
        assert records(other.id) == []
        await sandbox.close()

    asyncio.run(main())
    assert leftovers(client) == []


# ------------------------------------------------------------------ REST


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(
        provider,
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={"max_ttl_seconds": 600.0},
    )


async def test_patch_sets_the_ttl_within_the_operators_maximum(jp_fetch, provider):
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60}, headers=as_user("alice")
    )
    assert status == 201, info
    sid, created = info["id"], info["created_at"]

    async def patch(body, user="alice"):
        return await call(jp_fetch, "sessions", sid, method="PATCH", body=body, headers=as_user(user))

    status, changed = await patch({"ttl_seconds": 300})
    assert status == 200, changed
    assert changed["id"] == sid and changed["expires_at"] == pytest.approx(created + 300, abs=0.01)
    assert 240 < changed["seconds_left"] <= 300
    status, seen = await call(jp_fetch, "sessions", sid, headers=as_user("alice"))
    assert status == 200 and seen["expires_at"] == pytest.approx(created + 300, abs=0.01)
    # another user's session answers like an unknown one; nothing changed
    status, body = await patch({"ttl_seconds": 500}, user="bob")
    assert status == 404 and body["error"] == "SandboxNotFoundError"
    # over the maximum: refused, never clamped
    status, body = await patch({"ttl_seconds": 601})
    assert status == 400 and "max_ttl_seconds" in body["message"]
    # an end already past
    status, body = await patch({"ttl_seconds": 0.001})
    assert status == 400 and "ago" in body["message"]
    for bad in (
        {"ttl_seconds": "1h"},
        {"ttl_seconds": -5},
        {},
        {"ttl_seconds": 100, "extra": 1},
        {"ttl_seconds": True},
    ):
        status, body = await patch(bad)
        assert status == 400, (bad, body)
    status, seen = await call(jp_fetch, "sessions", sid, headers=as_user("alice"))
    assert seen["expires_at"] == pytest.approx(created + 300, abs=0.01)
    # an admin may change any session
    status, changed = await patch({"ttl_seconds": 120}, user="admin")
    assert status == 200 and changed["expires_at"] == pytest.approx(created + 120, abs=0.01)
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))
    assert status == 204
    status, _ = await patch({"ttl_seconds": 300})
    assert status == 404
