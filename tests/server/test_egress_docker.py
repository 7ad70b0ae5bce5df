"""The egress policy over REST on the docker provider, end to end on a real engine: a create body's policy
within the operator's rule reaches the owner's gateway (DNS answers the allowed name only), the granted
secret is a placeholder in the session, a PATCH applies within a second at the gateway and one over the rule
is 400 naming the entry, and the gateway's audit lines come back at GET /api/sandbox/egress/audit."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.docker import client, nothing_left
from tests.support.server import call, exec_call, server_config

__all__ = ["client", "nothing_left"]

pytestmark = [pytest.mark.docker, pytest.mark.slow(60), pytest.mark.usefixtures("nothing_left")]

REAL = "rest-Egress-Real-Token-42"


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_EGRESS_REST_TOKEN", REAL)
    return server_config(
        "docker",
        tmp_path / "sandboxes",
        SandboxPolicy={
            "isolation": "container",
            "egress_rules": {"*": {"allow": ["*.allowed.test"], "deny": ["no.allowed.test"]}},
            "secrets": {
                "tok": {"hosts": ["api.allowed.test"], "from_env": "TEST_EGRESS_REST_TOKEN", "env": "TOK"}
            },
            "egress_audit_path": str(tmp_path / "audit.jsonl"),
        },
    )


async def resolves(jp_fetch, sid: str, name: str) -> bool:
    status, result = await exec_call(jp_fetch, sid, ["nslookup", name], timeout_seconds=20)
    assert status == 200, result
    return result["exit_code"] == 0


async def resolves_within(jp_fetch, sid: str, name: str, want: bool, seconds: float = 1.5) -> bool:
    deadline = time.monotonic() + seconds
    while (await resolves(jp_fetch, sid, name)) != want:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_a_policy_over_rest_is_enforced_changed_and_audited(jp_fetch):
    status, info = await call(
        jp_fetch,
        "sessions",
        method="POST",
        body={"ttl_seconds": 300, "egress": {"allow": ["a.allowed.test"]}},
    )
    assert status == 201, info
    sid = info["id"]
    try:
        egress = info["spec"]["egress"]
        assert (egress["allow"], egress["deny"]) == (["a.allowed.test"], ["no.allowed.test"])
        (grant,) = egress["secrets"]
        assert (grant["name"], grant["env"], grant["hosts"]) == ("tok", "TOK", ["api.allowed.test"])
        status, result = await exec_call(jp_fetch, sid, ["sh", "-c", "echo $TOK"])
        assert status == 200, result
        assert result["stdout"].strip() == grant["placeholder"] and REAL not in result["stdout"]

        assert await resolves(jp_fetch, sid, "a.allowed.test")
        assert not await resolves(jp_fetch, sid, "b.allowed.test")

        status, changed = await call(
            jp_fetch, "sessions", sid, method="PATCH", body={"egress": {"allow": ["b.allowed.test"]}}
        )
        assert status == 200, changed
        assert changed["spec"]["egress"]["allow"] == ["b.allowed.test"]
        assert changed["spec"]["egress"]["secrets"] == [grant], "the session's secrets are kept"
        assert await resolves_within(jp_fetch, sid, "b.allowed.test", True), (
            "the change applies within a second"
        )
        assert await resolves_within(jp_fetch, sid, "a.allowed.test", False)
        await asyncio.sleep(1.1)  # the gateway keeps one DNS audit line per client and name a second
        assert await resolves(jp_fetch, sid, "b.allowed.test")
        status, body = await call(jp_fetch, "sessions", sid, params={"usage": "0"})
        assert body["spec"]["egress"]["allow"] == ["b.allowed.test"], "the session's info shows it"

        status, body = await call(
            jp_fetch, "sessions", sid, method="PATCH", body={"egress": {"allow": ["evil.example.org"]}}
        )
        assert status == 400 and "'evil.example.org' is over the operator's ceiling" in body["message"], body

        deadline = time.monotonic() + 10
        while True:
            status, audit = await call(jp_fetch, "egress", "audit", params={"session": sid})
            assert status == 200, audit
            seen = {(line["kind"], line["host"], line["decision"]) for line in audit["lines"]}
            if {("dns", "b.allowed.test", "allow"), ("dns", "b.allowed.test", "refuse")} <= seen:
                break
            if time.monotonic() > deadline:
                _, everything = await call(jp_fetch, "egress", "audit")
                raise AssertionError(
                    f"the gateway's audit did not come back: {sorted(seen)}; all: {everything}"
                )
            await asyncio.sleep(0.5)
        assert REAL not in str(audit)
    finally:
        status, body = await call(jp_fetch, "sessions", sid, method="DELETE")
        assert status == 204, body
