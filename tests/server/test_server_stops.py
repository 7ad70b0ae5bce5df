"""A server stopped by a signal cleans up exactly like a clean shutdown.

Each test runs a real ``jupyter server`` subprocess with no terminal (as JupyterHub and
process managers run it), starts an interactive command in an ephemeral session, sends
SIGINT (JupyterHub's stop) or SIGTERM, and checks that the server exited, the command's
processes are gone and the session is destroyed.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from tests.support.live_server import LiveServer, processes_marked, sandbox_server, wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow(41)]
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]


def start_interactive(server: LiveServer, session_id: str) -> None:
    """An interactive command (two sleeps in its group) that is running when this returns."""

    async def start() -> None:
        client = SandboxClient(url=f"http://127.0.0.1:{server.port}/", token=server.token)
        handle = await client.exec_start(
            session_id, ["sh", "-c", "sleep 300 & echo started; sleep 300"], timeout_seconds=600
        )
        async for item in handle.output:
            if getattr(item, "data", b"").startswith(b"started"):
                break
        handle.disconnect()  # the command runs on for the detach grace: the stop must end it
        await client.aclose()

    asyncio.run(start())


def stop_with(server: LiveServer, signum: int) -> int:
    """The server's exit status once ``signum`` stopped it; one that outlives 60 s is stopped (never
    left running after a failed test) and the wait's timeout raised."""
    server.process.send_signal(signum)
    try:
        return server.process.wait(60)
    except subprocess.TimeoutExpired:
        server.stop()
        raise
    finally:
        server.close_log()


@pytest.mark.parametrize("signum", SIGNALS)
def test_local_server_stopped_by_a_signal_ends_its_commands_and_sessions(tmp_path, signum):
    server = sandbox_server(tmp_path, "local")
    try:
        _, session = server.call("POST", "sessions", {"ttl_seconds": 3600})
        start_interactive(server, session["id"])
        assert len(processes_marked(session["id"])) >= 2
    except BaseException:
        server.stop()
        raise
    assert stop_with(server, signum) == 0, server.log()
    wait_for(lambda: not processes_marked(session["id"]), 15, "the session's commands outlived the server")
    assert not list((tmp_path / "sandboxes" / ".ephemeral").glob("*")), "the ephemeral workspace was left"


@pytest.mark.parametrize("signum", SIGNALS)
def test_docker_server_stopped_by_a_signal_removes_its_sessions(tmp_path, signum):
    docker_support = pytest.importorskip("tests.support.docker")
    client = docker_support.docker_client()
    server = sandbox_server(tmp_path, "docker", f"--DockerSandbox.image={docker_support.TEST_IMAGE}")
    try:
        _, session = server.call("POST", "sessions", {"ttl_seconds": 3600})
        _, kept = server.call("POST", "sessions", {"ttl_seconds": 3600})
        start_interactive(server, session["id"])
    except BaseException:
        server.stop()
        raise
    assert stop_with(server, signum) == 0, server.log()
    for made in (session, kept):
        found = client.containers.list(
            all=True, filters={"label": f"jupyter-tai-sandbox.session={made['id']}"}
        )
        assert found == [], f"session {made['id']} outlived the server it belonged to"
