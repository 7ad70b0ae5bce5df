"""The egress audit sink: lines appended to the operator's file, the last ones kept in memory and queried by
owner, session, time and count; a restarted server reads the file's last lines back."""

from __future__ import annotations

import datetime
import json

import pytest

from jupyter_tai_sandbox.egress_audit import EgressAudit, record_time


def line(n: int, owner: str = "alice", session: str = "sbx-a", **extra) -> dict:
    return {
        "time": f"2026-12-05T10:00:{n:02d}.123456789Z",
        "owner": owner,
        "session": session,
        "kind": "tls",
        "host": f"h{n}.example.com",
        "port": 443,
        "decision": "allow",
        "reason": "allowed",
        **extra,
    }


def test_times_are_read_as_rfc3339_with_nanoseconds_or_epoch_seconds():
    assert record_time("2026-12-05T10:00:01.5Z") == pytest.approx(record_time("2026-12-05T10:00:01Z") + 0.5)
    assert record_time("2026-12-05T10:00:01.123456789+00:00") == pytest.approx(
        datetime.datetime(2026, 12, 5, 10, 0, 1, 123456, tzinfo=datetime.UTC).timestamp()
    )
    assert record_time(12.5) == 12.5 and record_time("12.5") == 12.5
    assert record_time("yesterday") is None and record_time(True) is None


def test_lines_go_to_the_file_and_queries_filter_them(tmp_path):
    path = tmp_path / "deep" / "audit.jsonl"
    audit = EgressAudit(str(path))
    for n in range(6):
        audit.audit(line(n, owner="alice" if n % 2 else "bob", session=f"sbx-{n % 3}"))
    assert [json.loads(t)["host"] for t in path.read_text().splitlines()] == [
        f"h{n}.example.com" for n in range(6)
    ]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [r["host"] for r in audit.query(owner="alice")] == [
        "h1.example.com",
        "h3.example.com",
        "h5.example.com",
    ]
    assert [r["host"] for r in audit.query(session="sbx-0")] == ["h0.example.com", "h3.example.com"]
    assert [r["host"] for r in audit.query(since="2026-12-05T10:00:04Z")] == [
        "h4.example.com",
        "h5.example.com",
    ]
    assert [r["host"] for r in audit.query(limit=2)] == ["h4.example.com", "h5.example.com"], (
        "the newest, in order"
    )
    with pytest.raises(ValueError, match="since"):
        audit.query(since="soon")
    # a restarted server reads the file's last lines back
    assert EgressAudit(str(path)).query() == audit.query()


def test_memory_keeps_the_last_lines_and_no_file_is_kept_without_a_path(tmp_path):
    audit = EgressAudit(None, keep=3)
    for n in range(5):
        audit.audit(line(n))
    assert [r["host"] for r in audit.query()] == ["h2.example.com", "h3.example.com", "h4.example.com"]
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_written_keeps_the_lines_in_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    audit = EgressAudit(str(blocker / "audit.jsonl"))  # a folder that is a file
    audit.audit(line(1))
    audit.audit(line(2))
    assert len(audit.query()) == 2
    assert sum("cannot append" in r.message for r in caplog.records) == 1, "said once"
