"""A server killed with SIGKILL, then started again: orphans are reaped, persistent workspaces keep
their data byte for byte, and no process or container is left behind.

Each test runs a real ``jupyter server`` subprocess (the extension, one provider), kills it with
``kill -9`` while a session holds a running command, and starts a second server on the same state.
"""

from __future__ import annotations

import secrets
import time

import pytest

from tests.support import DEPLOYMENT
from tests.support.live_server import (
    LiveServer,
    processes_marked,
    run_in_background,
    sandbox_server,
    wait_for,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow(65)]
PAYLOAD = secrets.token_bytes(1 << 16)


def end_soon(server: LiveServer, *sessions: dict, seconds: float = 3) -> float:
    """Make each session end ``seconds`` from now (it was made with a long TTL, so the first server's own
    reaper cannot take it while the test still sets it up, however slow the machine); the latest end."""
    ends = []
    for session in sessions:
        for _ in range(3):  # a reply slower than ``seconds`` makes the end past: ask again
            ttl = time.time() - session["created_at"] + seconds
            status, info = server.call("PATCH", f"sessions/{session['id']}", {"ttl_seconds": ttl})
            if status == 200:
                ends.append(info["expires_at"])
                break
        else:
            pytest.fail(f"could not shorten {session['id']}'s TTL: {status} {info}")
    return max(ends)


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def test_local_sessions_of_a_killed_server(tmp_path):
    first = sandbox_server(tmp_path, "local")
    try:
        _, durable = first.call(
            "POST", "sessions", {"durability": "persistent", "workspace_key": "keep-me", "ttl_seconds": 600}
        )
        assert first.call("PUT", f"sessions/{durable['id']}/files/data.bin", raw=PAYLOAD)[0] == 201
        _, ephemeral = first.call("POST", "sessions", {"ttl_seconds": 600})
        run_in_background(first, ephemeral["id"], ["sh", "-c", "sleep 300 & sleep 300"])
        wait_for(lambda: len(processes_marked(ephemeral["id"])) >= 2, 20, "the commands never started")
        ends = end_soon(first, durable, ephemeral)
    finally:
        first.kill9()
    assert processes_marked(ephemeral["id"]), "the commands should outlive a SIGKILLed server"
    sleep_until(ends + 0.5)  # past both sessions' TTL
    second = sandbox_server(tmp_path, "local")
    try:
        wait_for(lambda: not processes_marked(ephemeral["id"]), 30, "the dead server's commands still run")
        wait_for(
            lambda: second.call("GET", "sessions")[1]["sessions"] == [], 30, "the orphans were not reaped"
        )
        # the persistent workspace kept its data, byte for byte
        _, again = second.call("POST", "sessions", {"durability": "persistent", "workspace_key": "keep-me"})
        assert second.call("GET", f"sessions/{again['id']}/files/data.bin") == (200, PAYLOAD)
        assert second.call("DELETE", f"sessions/{again['id']}?remove_workspace=1")[0] == 204
    finally:
        second.stop()
    assert not list((tmp_path / "sandboxes" / ".ephemeral").glob("*"))


def test_docker_sessions_of_a_killed_server(tmp_path):
    docker_support = pytest.importorskip("tests.support.docker")
    client = docker_support.docker_client()
    label = f"tai-faults-{secrets.token_hex(4)}"
    # a deployment of its own: whatever a failed check leaves is removed by it below, and by nothing else
    deployment = f"{DEPLOYMENT}-faults-{secrets.token_hex(3)}"
    extra = [f"--DockerSandbox.image={docker_support.TEST_IMAGE}", f"--DockerSandbox.deployment={deployment}",
             f"--DockerSandbox.extra_labels={{'{label}': '1'}}"]  # fmt: skip
    first = sandbox_server(tmp_path, "docker", *extra)
    second = None
    try:
        try:
            _, durable = first.call(
                "POST",
                "sessions",
                {"durability": "persistent", "workspace_key": f"keep-{label}", "ttl_seconds": 600},
            )
            assert first.call("PUT", f"sessions/{durable['id']}/files/data.bin", raw=PAYLOAD)[0] == 201
            _, ephemeral = first.call("POST", "sessions", {"ttl_seconds": 600})
            run_in_background(first, ephemeral["id"], ["sh", "-c", "sleep 300 & sleep 300"])
            time.sleep(1.5)
            ends = end_soon(first, durable, ephemeral)
        finally:
            first.kill9()
        sleep_until(ends + 0.5)
        second = sandbox_server(tmp_path, "docker", *extra)
        ours = {"label": [label]}
        wait_for(
            lambda: not client.containers.list(all=True, filters=ours, sparse=True),
            60,
            "containers left behind",
        )
        _, again = second.call(
            "POST", "sessions", {"durability": "persistent", "workspace_key": f"keep-{label}"}
        )
        assert second.call("GET", f"sessions/{again['id']}/files/data.bin") == (200, PAYLOAD)
        assert second.call("DELETE", f"sessions/{again['id']}?remove_workspace=1")[0] == 204
    finally:
        if second is not None:
            second.stop()
        docker_support.remove_deployment(client, deployment)
