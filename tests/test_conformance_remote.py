"""The remote provider through the conformance suite, against real `jupyter server` subprocesses.

Each class certifies RemoteSandbox over the REST and websocket API of a server
running this extension: one on the local provider (isolation none), one on the
docker provider (skipped without an engine, failing under CI=true). Every check
runs at full strength; the provider under test talks HTTP to another process,
exactly as a user's server talks to a JupyterHub sandbox service.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from docker_support import RUN_LABEL, TEST_IMAGE, docker_client, leftovers
from test_magics import LOCAL_ARGS, LiveServer

from jupyter_tai_sandbox.providers.remote import RemoteSandbox
from jupyter_tai_sandbox.testing import SandboxConformance

#: the remote's own reaper passes once at its start and then not for an hour: the suite's
#: TTL check asks RemoteSandbox.reap() which sessions it reaped, and a pass of the remote's
#: reaper between the expiry and that call would take them first (a race, not a finding)
QUIET_REAPER = "--SandboxApp.reap_interval=3600"


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
    (key, value), = RUN_LABEL.items()
    yield from live_server(
        tmp_path_factory,
        "remote-over-docker",
        "--SandboxApp.provider=docker",
        "--SandboxPolicy.isolation=none",
        f"--DockerSandbox.image={TEST_IMAGE}",
        f"--DockerSandbox.extra_labels={key}={value}",
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


class TestRemoteOverDockerConformance(RemoteConformance):
    image = TEST_IMAGE

    @pytest.fixture(autouse=True)
    def _remote(self, docker_remote: LiveServer) -> None:
        self.server = docker_remote
