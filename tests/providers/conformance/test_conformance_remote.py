"""The remote provider through the conformance suite, against real `jupyter server` subprocesses.

Each class certifies RemoteSandbox over the REST and websocket API of a server
running this extension: one on the local provider (isolation none), one on the
docker provider (skipped without an engine, failing under CI=true). Every check
runs at full strength; the provider under test talks HTTP to another process,
exactly as a user's server talks to a JupyterHub sandbox service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from jupyter_tai_sandbox.providers.remote import RemoteSandbox
from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support.docker import TEST_IMAGE, docker_client, leftovers, server_args
from tests.support.live_server import LOCAL_ARGS, LiveServer
from tests.support.server import call, exec_call

pytestmark = [pytest.mark.slow(85)]

#: the remote's own reaper passes once at its start and then not for an hour: the suite's
#: TTL check asks RemoteSandbox.reap() which sessions it reaped, and a pass of the remote's
#: reaper between the expiry and that call would take them first (a race, not a finding)
QUIET_REAPER = "--SandboxApp.reap_interval_seconds=3600"


def live_server(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[LiveServer]:
    """A started server in a fresh folder ``name``, stopped after (a fixture's body); its log on failure."""
    tmp = tmp_path_factory.mktemp(name)
    server = LiveServer(tmp, args=(*args, QUIET_REAPER, f"--LocalSandbox.root={tmp / 'sandboxes'}")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def local_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from live_server(tmp_path_factory, "remote-over-local", *LOCAL_ARGS)


@pytest.fixture(scope="module")
def docker_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    client = docker_client()  # skips (fails in CI) without an engine
    yield from live_server(
        tmp_path_factory, "remote-over-docker", *server_args(), "--SandboxPolicy.isolation=none"
    )
    assert leftovers(client) == [], "the remote docker server left containers, volumes or networks behind"
    client.close()


class RemoteConformance(SandboxConformance):
    """RemoteSandbox pointed at ``self.server`` (set per test by the subclass's fixture)."""

    server: LiveServer

    def make_sandbox(self, tmp_path):
        return RemoteSandbox(url=self.server.url, token=self.server.token)


class TestRemoteOverLocalConformance(RemoteConformance):
    @pytest.fixture(autouse=True)
    def _remote(self, local_remote: LiveServer) -> None:
        self.server = local_remote


# a unit of its own (its server, and the check that it left nothing, on another worker)
@pytest.mark.xdist_group("conformance-remote-over-docker")
@pytest.mark.docker
class TestRemoteOverDockerConformance(RemoteConformance):
    image = TEST_IMAGE

    @pytest.fixture(autouse=True)
    def _remote(self, docker_remote: LiveServer) -> None:
        self.server = docker_remote


# ---------------------------------------------------------------- beyond the suite


def test_the_owner_is_the_remotes_principal_never_the_specs(local_remote: LiveServer) -> None:
    """SessionSpec.owner is never sent (the remote, where this token is admin, would take it); a spec naming
    another owner than the token's user is refused loudly, never made as the token's user."""
    from jupyter_tai_sandbox.contract import SessionSpec
    from jupyter_tai_sandbox.errors import SandboxForbiddenError
    from jupyter_tai_sandbox.sessions import server_owner

    async def check() -> None:
        remote = RemoteSandbox(url=local_remote.url, token=local_remote.token)
        try:
            before = {info.id for info in await remote.list()}
            with pytest.raises(SandboxForbiddenError, match="mallory"):
                await remote.create(SessionSpec(owner="mallory", ttl_seconds=60))
            assert {info.id for info in await remote.list()} == before  # nothing was made
            session = await remote.create(
                SessionSpec(owner=server_owner(), consumer="kernel:k1", ttl_seconds=60)
            )
            info = await session.info()
            assert info.owner == server_owner()  # the remote server's principal
            assert info.consumer == "kernel:k1"  # under the token's own label at the remote, as it was here
            at_remote = await remote.client.info(session.id)
            assert at_remote["consumer"] == f"user:{server_owner()}/kernel:k1", at_remote
            assert remote.kind == "local" and remote.max_isolation == "none"
            assert remote.networks == {"egress"} and not remote.supports_limits
            await session.destroy()
        finally:
            await remote.close()

    asyncio.run(check())


def test_token_sources_and_a_missing_url(tmp_path, monkeypatch) -> None:
    from jupyter_tai_sandbox.contract import SandboxUnavailableError

    monkeypatch.delenv("TAI_SANDBOX_REMOTE_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token")
    monkeypatch.setenv("TAI_SANDBOX_REMOTE_URL", "http://127.0.0.1:1/")
    assert RemoteSandbox().client.token == "hub-token"
    monkeypatch.setenv("TAI_SANDBOX_REMOTE_TOKEN", "remote-token")
    assert RemoteSandbox().client.token == "remote-token"
    (tmp_path / "token").write_text("  from-file\n")
    assert RemoteSandbox(token_file=str(tmp_path / "token")).client.token == "from-file"
    with pytest.raises(SandboxUnavailableError, match="token_file"):
        RemoteSandbox(token_file=str(tmp_path / "missing"))
    monkeypatch.delenv("TAI_SANDBOX_REMOTE_URL")
    with pytest.raises(SandboxUnavailableError, match="TAI_SANDBOX_REMOTE_URL"):
        RemoteSandbox()
    with pytest.raises(SandboxUnavailableError, match="ca_file"):
        RemoteSandbox(url="https://127.0.0.1:1/", ca_file=str(tmp_path / "missing.pem"))


@pytest.fixture
def jp_server_config(local_remote: LiveServer):
    """A server in this process whose provider is the remote one, pointed at the local_remote server."""
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_tai_sandbox": True}},
        "SandboxApp": {"provider": "remote"},
        "SandboxPolicy": {"isolation": "none"},
        "RemoteSandbox": {"url": local_remote.url, "token": local_remote.token},
    }


async def test_provider_remote_behind_a_servers_doors(jp_fetch, local_remote: LiveServer) -> None:
    """SandboxApp.provider=remote: this server's REST door, gate and owner checks, the remote's sessions."""
    status, created = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120})
    assert status == 201, created
    assert created["kind"] == "local" and created["id"] in local_remote.session_ids()
    status, result = await exec_call(jp_fetch, created["id"], ["echo", "hi"], 30)
    assert (status, result["stdout"]) == (200, "hi\n"), result
    status, row = await call(jp_fetch, "status")
    assert (row["kind"], row["max_isolation"], row["networks"]) == ("local", "none", ["egress"])
    status, refused = await call(jp_fetch, "sessions", method="POST", body={"network": "none"})
    assert (status, refused["error"]) == (400, "SandboxSpecRejectedError"), refused  # the remote's refusal
    assert (await call(jp_fetch, "sessions", created["id"], method="DELETE"))[0] == 204
    assert created["id"] not in local_remote.session_ids()
