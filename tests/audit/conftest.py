"""A server of users (alice, bob, admin) whose audit log is the test's own file, with a credential whose value
must never reach the log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import sandbox_app, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers

#: the credential's value: injected into every session, and never in the audit log
SECRET = "audit-s3cret-9f1c2e"


@pytest.fixture
def audit_path(tmp_path) -> Path:
    return tmp_path / "audit" / "audit.jsonl"


@pytest.fixture
def audit_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
def jp_server_config(provider, tmp_path, monkeypatch, audit_path, audit_settings):
    monkeypatch.setenv("TAI_AUDIT_TEST_SECRET", SECRET)
    return server_config(
        provider,
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={"credentials": {"*": ["TAI_AUDIT_TEST_SECRET"]}},
        AuditSettings={"path": str(audit_path), **audit_settings},
    )


def flushed_lines(jp_serverapp) -> list[dict[str, Any]]:
    """Every line of the server's audit log (its rotated files first), once what is queued is written."""
    from jupyter_tai_sandbox.audit.log import iter_records

    log = sandbox_app(jp_serverapp).audit_log
    assert log is not None and log.flush(10)
    return list(iter_records(log.path))


def raw_bytes(path: Path) -> bytes:
    folder = path.parent
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith(path.name))


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)
