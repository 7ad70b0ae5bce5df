"""``jupyter tai-sandbox audit verify`` on a real server's log: an untouched log verifies across rotations; an
edited, a removed, a reordered and an inserted line are each named (file and line); a torn last line (a
server killed mid-write) is a note, not tampering, also once a restarted writer has chained past it."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_tai_sandbox.audit.log import AuditLog, line_hash, log_files
from jupyter_tai_sandbox.events import SandboxEvent
from tests.audit.conftest import flushed_lines
from tests.support.server import call, exec_call, sandbox_app
from tests.support.users import as_user


@pytest.fixture
def provider() -> str:
    return "local"


@pytest.fixture
def audit_settings():
    return {"max_bytes": 1500, "backups": 100}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_tai_sandbox.cli", "audit", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def make_log(jp_fetch, jp_serverapp, commands: int = 12) -> Path:
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300}, headers=as_user("alice")
    )
    assert status == 201, info
    for n in range(commands):
        status, result = await exec_call(jp_fetch, info["id"], ["echo", str(n)], headers=as_user("alice"))
        assert status == 200, result
    flushed_lines(jp_serverapp)
    log = sandbox_app(jp_serverapp).audit_log
    assert log is not None
    return Path(log.path)


async def test_an_untouched_log_verifies_across_rotations(jp_fetch, jp_serverapp):
    path = await make_log(jp_fetch, jp_serverapp)
    files = log_files(str(path))
    assert len(files) >= 3, files  # rotated (1500 bytes a file)
    for name in files:
        assert Path(name).stat().st_size <= 1500
    # the first line of each file chains to the last line of the one before
    for older, newer in itertools.pairwise(files):
        last = Path(older).read_bytes().rstrip(b"\n").split(b"\n")[-1]
        first = json.loads(Path(newer).read_bytes().split(b"\n")[0])
        assert first["prev"] == line_hash(last) and first["seq"] == json.loads(last)["seq"] + 1
    done = run_cli("verify", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact" in done.stdout and f"in {len(files)} file(s)" in done.stdout
    # show filters the same lines
    shown = run_cli("show", str(path), "--user", "alice", "--kind", "exec.end")
    ends = [json.loads(line) for line in shown.stdout.splitlines()]
    assert len(ends) == 12 and {line["kind"] for line in ends} == {"exec.end"}
    since = ends[5]["time"]
    shown = run_cli("show", str(path), "--kind", "exec.", "--since", since)
    assert all(line["time"] >= since for line in map(json.loads, shown.stdout.splitlines()))
    assert run_cli("show", str(path), "--session", "sbx-none").stdout == ""


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().rstrip(b"\n").split(b"\n")


@pytest.mark.parametrize("audit_settings", [{"max_bytes": 4000, "backups": 100}])
async def test_verify_names_each_edited_removed_reordered_and_inserted_line(jp_fetch, jp_serverapp, tmp_path):
    source = await make_log(jp_fetch, jp_serverapp)
    copy = tmp_path / "copy" / "audit.jsonl"
    copy.parent.mkdir()
    for name in log_files(str(source)):
        shutil.copy(name, copy.parent / Path(name).name)
    assert run_cli("verify", str(copy)).returncode == 0
    files = [Path(name) for name in log_files(str(copy))]
    big = [f for f in files if len(lines_of(f)) >= 6]
    assert len(big) >= 3, [len(lines_of(f)) for f in files]
    edited, removed, reordered = big[0], big[1], big[2]

    # edit line 2: an exit code changed
    lines = lines_of(edited)
    record = json.loads(lines[1])
    record["data"] = {**record["data"], "tampered": True}
    lines[1] = json.dumps(record, separators=(",", ":")).encode()
    edited.write_bytes(b"\n".join(lines) + b"\n")
    # remove line 3
    lines = lines_of(removed)
    removed_seq = json.loads(lines[2])["seq"]
    del lines[2]
    removed.write_bytes(b"\n".join(lines) + b"\n")
    # swap lines 4 and 5
    lines = lines_of(reordered)
    lines[3], lines[4] = lines[4], lines[3]
    reordered.write_bytes(b"\n".join(lines) + b"\n")

    done = run_cli("verify", str(copy))
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert f"{edited}:2: edited" in out, out
    assert f"{removed}:3: removed: seq {removed_seq} (1 line) missing before this line" in out, out
    assert f"{reordered}:4: reordered" in out or f"{reordered}:5: reordered" in out, out
    assert str(reordered) + ":4" in out and str(reordered) + ":5" in out  # both lines of the swap are named
    assert "3 problem(s)" in done.stderr
    problems = [line for line in out.splitlines() if ": note: " not in line]
    assert len(problems) == 3, out  # nothing else is blamed

    # an inserted line: a copy of another one, put elsewhere
    lines = lines_of(files[-1])
    lines.insert(1, lines[-1])
    files[-1].write_bytes(b"\n".join(lines) + b"\n")
    done = run_cli("verify", str(copy))
    assert (
        f"{files[-1]}:2: inserted" in done.stdout or f"{files[-1]}:{len(lines)}: inserted" in done.stdout
    ), done.stdout


def test_a_torn_last_line_is_a_note_and_a_restarted_writer_chains_past_it(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), deployment="d", server="s")
    for n in range(3):
        log.listener(
            SandboxEvent("exec.start", session="sbx-1", owner="alice", data={"argv": ["echo", str(n)]})
        )
    log.close()
    with open(path, "ab") as f:  # a server killed mid-write
        f.write(b'{"seq":4,"time":"2026-')
    done = run_cli("verify", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{path}:4: torn: the last line is cut short" in done.stdout
    # the next server ends the torn line and chains to the last whole one
    log = AuditLog(str(path), deployment="d", server="s")
    log.listener(SandboxEvent("session.destroy", session="sbx-1", owner="alice"))
    log.close()
    done = run_cli("verify", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{path}:4: torn: a line cut short" in done.stdout and "intact" in done.stdout
    last = json.loads(lines_of(path)[-1])
    assert last["seq"] == 4 and last["prev"] == line_hash(lines_of(path)[2])
    # editing that line into junk is still tampering
    lines = lines_of(path)
    lines[1] = b'{"not": "audit"}'
    path.write_bytes(b"\n".join(lines) + b"\n")
    done = run_cli("verify", str(path))
    assert done.returncode == 1 and f"{path}:2: edited" in done.stdout, done.stdout


def test_two_writers_on_one_file_keep_one_chain(tmp_path):
    path = tmp_path / "audit.jsonl"
    first = AuditLog(str(path), deployment="d", server="one", max_bytes=2000)
    second = AuditLog(str(path), deployment="d", server="two", max_bytes=2000)
    for n in range(40):
        (first if n % 2 else second).listener(SandboxEvent("exec.start", session=f"sbx-{n}", data={"n": n}))
        if n % 5 == 0:
            first.flush()
            second.flush()
    first.close()
    second.close()
    done = run_cli("verify", str(path))
    assert done.returncode == 0 and "seq 1 to 40" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("audit_settings", [{"enabled": False}])
async def test_the_audit_log_is_off_when_disabled(jp_fetch, jp_serverapp, audit_path):
    assert sandbox_app(jp_serverapp).audit_log is None
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
    assert status == 201, info
    status, body = await call(jp_fetch, "audit")
    assert (status, body["error"]) == (404, "SandboxNotFoundError") and "AuditSettings.enabled" in body[
        "message"
    ]
    assert not audit_path.parent.exists()
