"""A real server's audit log after a workload (local and docker): the expected lines, each naming who and
where, never a secret value; its chain verifies; REST pages it, and a user reads only their own lines."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.audit.conftest import SECRET, flushed_lines, raw_bytes
from tests.support.server import call, exec_call, read_all, sandbox_app
from tests.support.users import as_user

KEYS = {
    "seq",
    "time",
    "deployment",
    "server",
    "kind",
    "owner",
    "consumer",
    "session",
    "actor",
    "data",
    "prev",
}


async def workload(jp_fetch, jp_ws_fetch) -> str:
    """alice: a session, commands (one naming the secret), a file in and out, a terminal, then destroyed;
    bob refused her session; the admin runs a command in it."""
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300}, headers=as_user("alice")
    )
    assert status == 201, info
    sid = info["id"]
    status, result = await exec_call(jp_fetch, sid, ["echo", SECRET], headers=as_user("alice"))
    assert status == 200 and result["exit_code"] == 0, result
    status, result = await exec_call(
        jp_fetch, sid, ["sh", "-c", "printf abc; exit 3"], headers=as_user("alice")
    )
    assert status == 200 and result["exit_code"] == 3, result
    status, _ = await call(
        jp_fetch,
        "sessions",
        sid,
        "files",
        "notes.txt",
        method="PUT",
        raw=b"twelve bytes",
        headers=as_user("alice"),
    )
    assert status in (200, 201, 204)
    status, body = await call(jp_fetch, "sessions", sid, "files", "notes.txt", headers=as_user("alice"))
    assert status == 200 and body == b"twelve bytes"
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws", headers=as_user("alice"))
    await ws.write_message(json.dumps({"type": "start", "argv": ["echo", "term"], "timeout_seconds": 10}))
    out, _err, final, _notes = await read_all(ws)
    assert out == b"term\n" and final == {"type": "exit", "exit_code": 0}
    ws.close()
    status, body = await call(jp_fetch, "sessions", sid, headers=as_user("bob"))
    assert status == 404, body
    status, result = await exec_call(jp_fetch, sid, ["true"], headers=as_user("admin"))
    assert status == 200, result
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))
    assert status == 204
    return sid


async def wait_for(jp_serverapp, kind: str, tries: int = 100) -> list[dict]:
    import asyncio

    for _ in range(tries):
        lines = flushed_lines(jp_serverapp)
        if any(line["kind"] == kind for line in lines):
            return lines
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {kind} line")


async def test_a_workload_is_logged_each_line_naming_who_and_where_and_no_secret(
    jp_fetch, jp_ws_fetch, jp_serverapp, audit_path, provider
):
    sid = await workload(jp_fetch, jp_ws_fetch)
    lines = await wait_for(jp_serverapp, "terminal.close")  # the socket's close reaches the server last
    app = sandbox_app(jp_serverapp)
    for line in lines:
        assert set(line) == KEYS | {"provider"}, line
        assert line["deployment"] and line["server"] and line["time"].endswith("Z")
    mine = [line for line in lines if line["session"] == sid]
    kinds = [line["kind"] for line in mine]
    for kind in ("session.create", "exec.start", "exec.end", "file.put", "file.get", "terminal.open"):
        assert kind in kinds, kinds
    assert "session.destroy" in kinds and "terminal.close" in kinds and "admin" in kinds
    create = next(line for line in mine if line["kind"] == "session.create")
    assert (
        create["owner"] == "alice" and create["consumer"] == "user:alice" and create["provider"] == provider
    )
    assert create["data"]["spec"]["env"] == ["TAI_AUDIT_TEST_SECRET"]  # the name, never the value
    starts = [line["data"]["argv"] for line in mine if line["kind"] == "exec.start"]
    assert ["echo", "[scrubbed]"] in starts and ["sh", "-c", "printf abc; exit 3"] in starts
    ended = next(line for line in mine if line["kind"] == "exec.end" and line["data"]["exit_code"] == 3)
    assert ended["data"]["stdout_bytes"] == 3 and ended["data"]["stderr_bytes"] == 0
    assert "stdout" not in ended["data"]  # output bytes never reach the log
    put = next(line for line in mine if line["kind"] == "file.put")
    assert put["data"]["path"] == "notes.txt" and put["data"]["size"] in (12, None)
    got = next(line for line in mine if line["kind"] == "file.get")
    assert got["data"] == {"path": "notes.txt", "size": 12}
    opened = next(line for line in mine if line["kind"] == "terminal.open")
    assert opened["actor"] == "alice" and opened["data"]["exec"].startswith("exe-")
    refusal = next(line for line in lines if line["kind"] == "refusal")
    assert refusal["owner"] == "bob" and refusal["session"] == sid
    assert refusal["data"]["door"] == "rest" and refusal["data"]["status"] == 404
    admin = next(line for line in mine if line["kind"] == "admin")
    assert admin["owner"] == "alice" and admin["actor"] == "admin" and "POST" in admin["data"]["action"]
    assert [line["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert SECRET.encode() not in raw_bytes(audit_path)
    # the CLI verifies the untouched log
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_tai_sandbox.cli", "audit", "verify", str(audit_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact" in done.stdout
    assert app.audit_log is not None


async def test_rest_pages_by_seq_and_a_user_reads_only_their_own_lines(jp_fetch, jp_ws_fetch, jp_serverapp):
    sid = await workload(jp_fetch, jp_ws_fetch)
    every = await wait_for(jp_serverapp, "terminal.close")
    # the admin pages back through every line, newest page first
    pages, before = [], None
    while True:
        params = {"limit": "3", **({"before": str(before)} if before else {})}
        status, body = await call(jp_fetch, "audit", params=params, headers=as_user("admin"))
        assert status == 200, body
        assert len(body["lines"]) <= 3
        pages.append(body["lines"])
        if not body["more"]:
            break
        before = body["lines"][0]["seq"]
    seen = [line["seq"] for page in reversed(pages) for line in page]
    assert seen == [line["seq"] for line in every[: len(seen)]] and len(seen) >= len(every)
    # forward from a seq
    status, body = await call(
        jp_fetch, "audit", params={"after": "2", "limit": "2"}, headers=as_user("admin")
    )
    assert [line["seq"] for line in body["lines"]] == [3, 4] and body["more"]
    # filters: session, kind, user (owner or actor)
    status, body = await call(
        jp_fetch, "audit", params={"session": sid, "kind": "exec.end"}, headers=as_user("admin")
    )
    assert body["lines"] and all(
        line["kind"] == "exec.end" and line["session"] == sid for line in body["lines"]
    )
    status, body = await call(jp_fetch, "audit", params={"user": "admin"}, headers=as_user("admin"))
    assert any(line["kind"] == "admin" for line in body["lines"])
    # alice reads her own lines; bob none of hers (only his refusal), and may not ask for hers
    status, body = await call(jp_fetch, "audit", params={"limit": "1000"}, headers=as_user("alice"))
    assert status == 200 and body["lines"] and all(line["owner"] == "alice" for line in body["lines"])
    status, body = await call(jp_fetch, "audit", params={"limit": "1000"}, headers=as_user("bob"))
    assert status == 200 and body["lines"] and all(line["owner"] == "bob" for line in body["lines"])
    assert not any(line["session"] == sid and line["kind"] != "refusal" for line in body["lines"])
    status, body = await call(jp_fetch, "audit", params={"user": "alice"}, headers=as_user("bob"))
    assert (status, body["error"]) == (403, "SandboxForbiddenError")
    status, body = await call(jp_fetch, "audit", params={"since": "yesterday"}, headers=as_user("admin"))
    assert (status, body["error"]) == (400, "SandboxRequestError")
    status, body = await call(jp_fetch, "audit", params={"limit": "0"}, headers=as_user("admin"))
    assert (status, body["error"]) == (400, "SandboxRequestError")
