"""A server on the vm provider: its status says plainly when its guests are emulated; sessions, exec and fork
over REST."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.support.server import call, exec_call, server_config
from tests.support.vm import keep_machine_cache, need_qemu


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    need_qemu()
    keep_machine_cache(monkeypatch)
    state = tempfile.mkdtemp(prefix="tai-vms-", dir="/tmp")
    yield server_config(
        "vm",
        tmp_path / "sandboxes",
        VmSandbox={"accel": "tcg", "state_dir": state},
        SandboxPolicy={"isolation": "none", "max_sessions_per_user": 2},
    )
    shutil.rmtree(state, ignore_errors=True)


async def test_status_of_emulated_guests_says_they_are_not_a_hardened_boundary(jp_fetch):
    status, body = await call(jp_fetch, "status")
    assert status == 200, body
    # as root on the engine's host (CI) sessions may sit on the owners' bridges; elsewhere network none only
    networks = ["egress", "internal", "none"] if os.geteuid() == 0 else ["none"]
    assert body["kind"] == "vm" and body["max_isolation"] == "vm" and body["networks"] == networks
    assert body["isolation_note"] == "emulated: a separate guest kernel, not a hardened boundary"
    assert body["limits"]["default_memory_mb"] == 256


async def test_a_vm_session_over_rest_runs_commands_and_files_and_is_deleted(jp_fetch):
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60, "network": "none"}
    )
    assert status == 201, info
    assert (info["kind"], info["isolation"], info["image"]) == ("vm", "vm", "jupyter-tai-sandbox/vm-guest")
    sid = info["id"]
    status, result = await exec_call(
        jp_fetch, sid, ["sh", "-c", "cat; uname -s; echo err >&2; exit 3"], 30, stdin="hello "
    )
    assert status == 200 and (result["exit_code"], result["stdout"], result["stderr"]) == (
        3,
        "hello Linux\n",
        "err\n",
    )
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE")
    assert status == 204
    status, body = await call(jp_fetch, "sessions", sid)
    # its owner is told why (a SandboxNotFoundError's subclass: issue 48)
    assert status == 404 and body["error"] == "SandboxSessionGoneError" and body["reason"] == "destroyed", (
        body
    )


async def test_a_fork_over_rest_is_a_new_session_of_the_owner_within_the_quota(jp_fetch, jp_serverapp):
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300, "network": "none"}
    )
    assert status == 201, info
    sid = info["id"]
    status, _ = await call(
        jp_fetch, "sessions", sid, "files", "note.txt", method="PUT", raw=b"from the source"
    )
    assert status == 201
    status, fork = await call(jp_fetch, "sessions", sid, "fork", method="POST")
    assert status == 201 and fork["id"] != sid and fork["owner"] == info["owner"], fork
    assert (fork["network"], fork["spec"]["ttl_seconds"]) == ("none", 300)
    status, body = await call(jp_fetch, "sessions", fork["id"], "files", "note.txt")
    assert (status, body) == (200, b"from the source")
    # the owner's quota (2 here) counts the fork like a create: a third session is refused
    status, refused = await call(jp_fetch, "sessions", sid, "fork", method="POST")
    assert status == 429 and refused["error"] == "SandboxQuotaError", refused
    for session_id in (sid, fork["id"]):
        assert (await call(jp_fetch, "sessions", session_id, method="DELETE"))[0] == 204


@pytest.mark.docker
async def test_a_vm_session_of_the_default_network_routes_out_through_its_owners_bridge(jp_fetch):
    if os.geteuid() != 0:
        pytest.skip("vm sessions on a network need the server to run as root")
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
    assert status == 201 and info["network"] == "egress", info
    status, result = await exec_call(jp_fetch, info["id"], ["sh", "-c", "ip route; ls /sys/class/net"], 30)
    assert status == 200 and "default via" in result["stdout"] and "eth0" in result["stdout"], result
    assert (await call(jp_fetch, "sessions", info["id"], method="DELETE"))[0] == 204
