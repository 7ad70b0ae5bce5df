"""list() answers from the deployment's containers kept current by the engine's events (docker/watch.py):
what another server of the deployment makes, pauses or removes, and a container removed behind every
server's back, is in (or gone from) the next list, never another deployment's; a flood of engine events
that may have dropped some makes a full listing instead."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from jupyter_tai_sandbox.providers.docker.watch import EVENTS_HELD, MISSED_MARGIN
from tests.support.docker import RUN_LABEL, provider, spec

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("nothing_left")]


def deployment() -> str:
    return f"watch-{secrets.token_hex(4)}"


def test_a_list_sees_what_another_server_of_the_deployment_makes_pauses_and_removes(client):
    name = deployment()

    async def main() -> None:
        ours, theirs, elsewhere = (
            provider(deployment=name),
            provider(deployment=name),
            provider(deployment=deployment()),
        )
        own = await ours.create(spec(owner="alice"))
        try:
            assert [i.id for i in await ours.list()] == [own.id]  # the seed
            other = await theirs.create(spec(owner="bob"))
            foreign = await elsewhere.create(spec(owner="bob"))
            # no wait: the other server's create is in the very next list
            assert [i.id for i in await ours.list()] == [own.id, other.id]
            await other.pause()
            assert [i.paused for i in await ours.list()] == [False, True]
            await other.resume()
            assert [i.paused for i in await ours.list()] == [False, False]
            await other.destroy()
            assert [i.id for i in await ours.list()] == [own.id]
            # what list gave matches a full listing of the engine, also when it came from events
            watch = ours._watch
            assert watch.listings == 1 or watch.overflows > 0
            await foreign.destroy()
        finally:
            await own.destroy()
            for sandbox in (ours, theirs, elsewhere):
                await sandbox.close()

    asyncio.run(main())


def test_a_container_removed_behind_the_servers_back_leaves_the_list(client):
    async def main() -> None:
        sandbox = provider(deployment=deployment())
        kept, removed = await sandbox.create(spec()), await sandbox.create(spec())
        try:
            assert {i.id for i in await sandbox.list()} == {kept.id, removed.id}
            client.api.remove_container(removed.container_id, force=True, v=True)
            assert [i.id for i in await sandbox.list()] == [kept.id]
        finally:
            await removed.destroy()
            await kept.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_flood_of_engine_events_makes_a_full_listing_and_the_list_stays_exact(client):
    """More events than the engine holds between two lists (volumes of no deployment of ours): the read
    may have missed a session's, so the list lists everything again, and finds it."""

    async def main() -> None:
        name = deployment()
        ours, theirs = provider(deployment=name), provider(deployment=name)
        try:
            assert await ours.list() == []
            listings = ours._watch.listings
            other = await theirs.create(spec())
            try:
                for _ in range((EVENTS_HELD - MISSED_MARGIN) // 2 + 1):  # a create and a removal each
                    volume = client.volumes.create(labels=RUN_LABEL)
                    volume.remove()
                assert [i.id for i in await ours.list()] == [other.id]
                assert ours._watch.listings == listings + 1 and ours._watch.overflows >= 1
            finally:
                await other.destroy()
            assert await ours.list() == []
        finally:
            await ours.close()
            await theirs.close()

    asyncio.run(main())


def test_a_spec_without_env_is_parsed_once_and_one_with_env_gets_its_values():
    """A list reads each session's spec from its labels: the same labels give the same (frozen) spec without
    parsing it again; with the container's environment, its values."""
    from jupyter_tai_sandbox.contract import SessionSpec
    from jupyter_tai_sandbox.providers._docker_sandbox import spec_from_labels
    from jupyter_tai_sandbox.providers.docker_engine.names import session_labels

    made = SessionSpec(env={"TOKEN": "secret"}, owner="alice", consumer=f"watch-{secrets.token_hex(3)}")
    labels = session_labels("sbx-0123456789abcdef", made, 1.0, 2.0, {})
    listed = spec_from_labels(labels, None)
    assert spec_from_labels(dict(labels), None) is listed
    assert listed.env == {"TOKEN": ""} and listed.owner == "alice" and listed.consumer == made.consumer
    assert spec_from_labels(labels, ["TOKEN=secret", "PATH=/bin"]).env == {"TOKEN": "secret"}
    assert spec_from_labels({**labels, "jupyter-tai-sandbox.owner": "bob"}, None).owner == "bob"
