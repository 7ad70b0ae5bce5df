"""A paused vm session outlives a killed server: the next server finds it paused, resumes it, and what ran
in it goes on from where it stopped. Real server processes (SIGKILL), real QEMU guests under TCG."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.live_server import run_in_background, sandbox_server, wait_for
from tests.support.vm import need_qemu

pytestmark = [pytest.mark.slow(30), pytest.mark.timeout(240)]

COUNTER = [
    "sh",
    "-c",
    "i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; "
    "sleep 0.1; done",
]


def count(server, session_id: str) -> int | None:
    status, body = server.call("GET", f"sessions/{session_id}/files/n")
    return int(body) if status == 200 and body.strip() else None


def test_a_paused_vm_session_survives_a_killed_server_and_counts_on_from_where_it_stopped(tmp_path):
    need_qemu()
    state = tempfile.mkdtemp(prefix="tai-vmr-", dir="/tmp")
    extra = [
        "--VmSandbox.accel=tcg",
        f"--VmSandbox.state_dir={state}",
        f"--VmSandbox.deployment=vm-restart-{secrets.token_hex(3)}",
    ]
    first = sandbox_server(tmp_path, "vm", *extra)
    second = None
    try:
        try:
            status, info = first.call("POST", "sessions", {"network": "none", "ttl_seconds": 600})
            assert status == 201, info
            sid = info["id"]
            run_in_background(first, sid, COUNTER)
            wait_for(lambda: (count(first, sid) or 0) >= 5, 30, "the counter to start")
            before = count(first, sid)
            counted_at = time.monotonic()
            status, paused = first.call("POST", f"sessions/{sid}/pause")
            assert status == 200 and paused["paused"] is True, paused
            status, refused = first.call("GET", f"sessions/{sid}/files/n")
            assert status == 409 and refused["error"] == "SandboxConflictError", refused
        finally:
            first.kill9()
        second = sandbox_server(tmp_path, "vm", *extra)
        status, found = second.call("GET", f"sessions/{sid}?usage=0")
        assert status == 200 and found["paused"] is True, found
        time.sleep(max(0.0, 3.0 - (time.monotonic() - counted_at)))  # unpaused, it would have counted 30 more
        status, resumed = second.call("POST", f"sessions/{sid}/resume")
        assert status == 200 and resumed["paused"] is False, resumed
        after = count(second, sid)
        assert after is not None and before <= after <= before + 12, (before, after)
        wait_for(lambda: (count(second, sid) or 0) > after, 10, "the counter to go on")
        assert second.call("DELETE", f"sessions/{sid}")[0] == 204
    finally:
        if second is not None:
            second.stop()
        for pidfile in Path(state).glob("*/sessions/*/qemu.pid"):  # a failed check's guest (its QEMU only)
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text())
                if state.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)
