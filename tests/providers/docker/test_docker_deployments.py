"""Two deployments on one engine are invisible to each other: the deployment scope.

Two DockerSandbox instances with different ``deployment`` names stand for two servers (two
JupyterHub users, a teammate, a test run) on one engine. Neither lists, gets, reaps, pools,
counts or resolves the other's sessions, workspaces or networks, admin rights included.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SessionSpec
from jupyter_tai_sandbox.providers.docker import LABEL_DEPLOYMENT, DockerSandbox
from tests.support.docker import provider

pytestmark = [pytest.mark.docker]


def two_deployments() -> tuple[str, str]:
    tag = secrets.token_hex(4)
    return f"alice-server-{tag}", f"bob-server-{tag}"


def test_a_deployment_sees_gets_and_reaps_only_its_own_sessions(client):
    ours, theirs = two_deployments()

    async def main() -> None:
        mine, other = provider(deployment=ours), provider(deployment=theirs)
        expired = await other.create(SessionSpec(ttl_seconds=0.5, owner="alice"))
        live = await other.create(SessionSpec(ttl_seconds=600, owner="alice"))
        own = await mine.create(SessionSpec(ttl_seconds=600, owner="bob"))
        try:
            await asyncio.sleep(1)
            assert [i.id for i in await mine.list()] == [own.id]
            for session in (expired, live):
                with pytest.raises(SandboxNotFoundError):
                    await mine.get(session.id)
            assert await mine.reap() == []  # the other deployment's expired session is not ours to reap
            assert {i.id for i in await other.list()} == {expired.id, live.id}
            labels = client.containers.get(own.container_id).labels
            assert labels[LABEL_DEPLOYMENT] == ours
            assert await other.reap() == [expired.id]
        finally:
            await own.destroy()
            await live.destroy()
            await mine.close()
            await other.close()

    asyncio.run(main())


def test_the_same_workspace_key_in_two_deployments_is_two_volumes(client):
    ours, theirs = two_deployments()
    key = f"shared-{secrets.token_hex(3)}"

    async def main() -> None:
        mine, other = provider(deployment=ours), provider(deployment=theirs)
        try:
            theirs_ws = await other.create(SessionSpec(durability="persistent", workspace_key=key))
            await theirs_ws.put_file("secret.txt", b"theirs")
            # no owner (direct use, or an admin door) skips the owner check, never the deployment
            ours_ws = await mine.create(SessionSpec(durability="persistent", workspace_key=key))
            try:
                assert (await ours_ws.exec(["ls", "/workspace"], timeout_seconds=10)).stdout == b""
                assert mine.scope.workspace_volume(key) != other.scope.workspace_volume(key)
            finally:
                await ours_ws.destroy(remove_workspace=True)
            assert await theirs_ws.get_file("secret.txt") == b"theirs"
            await theirs_ws.destroy(remove_workspace=True)
        finally:
            await mine.close()
            await other.close()

    asyncio.run(main())


def test_internal_networks_of_one_owner_in_two_deployments_are_apart(client):
    ours, theirs = two_deployments()

    async def main() -> None:
        mine, other = provider(deployment=ours), provider(deployment=theirs)
        a = await mine.create(SessionSpec(network="internal", owner="carol"))
        b = await other.create(SessionSpec(network="internal", owner="carol"))
        try:
            net_a = mine.scope.owner_network(mine.internal_network, "carol")
            net_b = other.scope.owner_network(other.internal_network, "carol")
            assert net_a != net_b
            assert client.networks.get(net_a).attrs["Labels"][LABEL_DEPLOYMENT] == ours
            address = client.containers.get(b.container_id).attrs["NetworkSettings"]["Networks"][net_b][
                "IPAddress"
            ]
            listener = await b.exec_start(
                ["nc", "-ll", "-p", "9000", "-e", "echo", "pong"], timeout_seconds=60
            )
            try:
                probe = f"nc -w 2 {address} 9000 </dev/null 2>&1; echo rc=$?"
                # the listener answers inside its own deployment's network (once it listens)...
                for _ in range(50):
                    if b"pong" in (await b.exec(["sh", "-c", probe], timeout_seconds=20)).stdout:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the listener never answered in its own network")
                # ...and not to the same owner's session of another deployment
                out = (await a.exec(["sh", "-c", probe], timeout_seconds=20)).stdout
                assert b"pong" not in out and b"rc=0" not in out, out
            finally:
                await listener.kill()
        finally:
            await a.destroy()
            await b.destroy()
            await mine.close()
            await other.close()
        assert [n.name for n in client.networks.list(names=[net_a, net_b])] == []

    asyncio.run(main())


def test_the_warm_pool_takes_no_other_deployments_containers(client):
    ours, theirs = two_deployments()

    async def main() -> None:
        other = provider(deployment=theirs, pool_size=1)
        mine = provider(deployment=ours)
        try:
            session = await other.create(SessionSpec())
            await other._pool.settle()
            for _ in range(100):  # the refill after the hand-out
                if other._pool.ready_count():
                    break
                await asyncio.sleep(0.1)
            assert [i.id for i in await mine.list()] == []
            with pytest.raises(SandboxNotFoundError):
                await mine.get(session.id)
            await mine.reap()
            assert [i.id for i in await other.list()] == [session.id]
            await session.destroy()
        finally:
            await other.close()
            await mine.close()

    asyncio.run(main())


def test_the_default_deployment_names_the_user_and_the_config_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("TAI_SANDBOX_DEPLOYMENT", raising=False)
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    name = DockerSandbox().deployment
    assert name.startswith("alice@") and name.endswith(f":{tmp_path}")
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")
    assert DockerSandbox().deployment != name
    monkeypatch.setenv("TAI_SANDBOX_DEPLOYMENT", "class-of-2026")
    assert DockerSandbox().deployment == "class-of-2026"
    with pytest.raises(Exception, match="deployment"):
        DockerSandbox(deployment="")
