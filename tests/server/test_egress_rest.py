"""The egress policy over REST, on a real server (local provider, several users by header): a spec's egress
refused by a provider without a gateway in its words, entries and secrets in a body refused, PATCH
sessions/{id} with egress (over the ceiling 400 naming the entry, the provider's refusal, another user's 404),
GET egress/audit (a user sees their own sessions' lines, an admin everyone's), the status row."""

from __future__ import annotations

import json

import pytest

from tests.support.api_spec import check
from tests.support.server import call, exec_call, sandbox_app, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

SECRET_FILE_VALUE = "rotating-Secret-Value-1"


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET_FILE_VALUE + "\n")
    return path


@pytest.fixture
def jp_server_config(tmp_path, secret_file):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={
            "scrub_transcript": True,
            "egress_rules": {
                "user:carol": {"allow": ["*.github.com", "pypi.org"], "deny": ["gist.github.com"]}
            },
            # granted to a tool only: alice's sessions have none, so the local provider serves them
            "secrets": {
                "svc": {
                    "hosts": ["api.example.com"],
                    "from_file": str(secret_file),
                    "consumers": ["tool:svc"],
                }
            },
            "egress_audit_path": str(tmp_path / "audit.jsonl"),
        },
    )


async def create(jp_fetch, user, **spec):
    return await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300, **spec}, headers=as_user(user)
    )


async def patch(jp_fetch, user, sid, body):
    return await call(jp_fetch, "sessions", sid, method="PATCH", body=body, headers=as_user(user))


async def test_a_spec_with_egress_is_refused_by_a_provider_without_a_gateway(jp_fetch):
    status, body = await create(jp_fetch, "alice", egress={"allow": ["pypi.org"]})
    assert status == 400 and body["error"] == "SandboxSpecRejectedError", body
    assert "the local provider runs on the host's network" in body["message"]
    # carol's consumer has a rule: her sessions get its policy, which local cannot enforce either
    status, body = await create(jp_fetch, "carol")
    assert status == 400 and "cannot enforce an egress allow-list" in body["message"]
    status, body = await create(jp_fetch, "alice")
    assert status == 201 and body["spec"]["egress"] is None, (
        "no rule, no secret, none asked for: plain egress"
    )


@pytest.mark.parametrize(
    ("egress", "words"),
    [
        ({"allow": ["10.0.0.1"]}, "egress allow entry '10.0.0.1': an IP literal"),
        ({"allow": ["a*.example.com"]}, "'*' only as the whole first label"),
        ({"deny": ["*"]}, "'*' (any name) is for allow only"),
        ({"allow": ["x.org:99999"]}, "1 to 65535"),
        ({"allowed": ["x.org"]}, "unknown egress field"),
        ({"secrets": [{"name": "svc"}]}, "granted by the operator"),
    ],
)
async def test_a_bad_egress_in_a_body_is_400_naming_it(jp_fetch, egress, words):
    status, body = await create(jp_fetch, "alice", egress=egress)
    assert status == 400 and body["error"] == "SandboxSpecRejectedError" and words in body["message"], body


async def test_egress_with_another_network_is_400(jp_fetch):
    status, body = await create(jp_fetch, "alice", network="internal", egress={"allow": ["pypi.org"]})
    assert status == 400 and "needs network='egress'" in body["message"], body


async def test_patch_egress_is_narrowed_then_refused_by_the_provider(jp_fetch, jp_serverapp):
    status, info = await create(jp_fetch, "alice")
    sid = info["id"]
    status, body = await patch(jp_fetch, "alice", sid, {"egress": {"allow": ["api.github.com"], "deny": []}})
    assert status == 400 and "the local provider cannot change a session's egress policy" in body["message"]
    # the operator puts a rule on every consumer: a change over it is refused naming the entry, first
    sandbox_app(jp_serverapp).policy.egress_rules = {"*": {"allow": ["*.github.com"]}}
    status, body = await patch(
        jp_fetch, "alice", sid, {"egress": {"allow": ["api.github.com", "github.com"]}}
    )
    assert (
        status == 400 and "egress allow entry 'github.com' is over the operator's ceiling" in body["message"]
    )
    status, body = await patch(jp_fetch, "alice", sid, {"egress": {"allow": ["1.2.3.4"]}})
    assert status == 400 and "IP literal" in body["message"]
    status, body = await patch(jp_fetch, "alice", sid, {"egress": {"secrets": [{"name": "svc"}]}})
    assert status == 400 and "granted by the operator" in body["message"], body
    status, body = await patch(jp_fetch, "alice", sid, {"egress": {"allow": ["pypi.org"]}, "ttl": 5})
    assert status == 400 and body["error"] == "SandboxRequestError" and body["field"] == "ttl", body
    status, body = await patch(jp_fetch, "alice", sid, {})
    assert status == 400 and body["error"] == "SandboxRequestError", body
    # ttl_seconds alone still works as before
    status, body = await patch(jp_fetch, "alice", sid, {"ttl_seconds": 200})
    assert status == 200 and body["expires_at"] == pytest.approx(body["created_at"] + 200), body


async def test_another_users_or_an_unknown_session_is_404(jp_fetch):
    status, info = await create(jp_fetch, "alice")
    sid = info["id"]
    for user, target in (("bob", sid), ("alice", "sbx-0000000000000000"), ("alice", "nonsense")):
        status, body = await patch(jp_fetch, user, target, {"egress": {"allow": ["pypi.org"]}})
        assert status == 404, (user, target, body)


async def test_the_audit_shows_a_user_their_own_lines_and_an_admin_everyones(
    jp_fetch, jp_serverapp, tmp_path
):
    audit = sandbox_app(jp_serverapp).policy.egress_audit
    lines = [
        {
            "time": f"2026-12-05T10:00:0{n}Z",
            "deployment": "d",
            "owner": owner,
            "session": f"sbx-{owner}",
            "client": "10.0.0.2",
            "kind": "dns",
            "host": "pypi.org",
            "port": 53,
            "decision": "allow",
            "reason": "ok",
        }
        for n, owner in enumerate(["alice", "bob", "alice", "bob"])
    ]
    for record in lines:
        audit.audit(record)
    written = [json.loads(t) for t in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert written == lines, "the operator's file has every line"

    async def get(user, **params):
        return await call(jp_fetch, "egress", "audit", params=params, headers=as_user(user))

    status, body = await get("alice")
    assert status == 200 and body["lines"] == [lines[0], lines[2]], body
    status, body = await get("alice", owner="bob")
    assert status == 403 and body["error"] == "SandboxForbiddenError", body
    status, body = await get("admin")
    assert status == 200 and body["lines"] == lines
    status, body = await get("admin", owner="bob", since="2026-12-05T10:00:02Z")
    assert body["lines"] == [lines[3]]
    status, body = await get("admin", session="sbx-alice", limit="1")
    assert body["lines"] == [lines[2]]
    for params, field in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"), ({"since": "soon"}, "since")):
        status, body = await get("admin", **params)
        assert status == 400 and body["field"] == field, body


async def test_the_status_says_whether_the_provider_enforces_a_policy(jp_fetch):
    status, body = await call(jp_fetch, "status", headers=as_user("admin"))
    assert status == 200 and body["egress_policy"] is False
    assert body["policy"]["egress_rules"]["user:carol"]["deny"] == ["gist.github.com"]
    assert body["policy"]["secrets"]["svc"]["hosts"] == ["api.example.com"]
    assert "from_file" not in json.dumps(body), "never a secret's source"
    status, body = await call(jp_fetch, "status", headers=as_user("alice"))
    assert "egress_rules" not in body["policy"] and "secrets" not in body["policy"]


async def test_the_scrub_knows_a_secrets_real_value_and_follows_its_rotation(jp_fetch, secret_file):
    status, info = await create(jp_fetch, "alice")
    sid = info["id"]
    status, result = await exec_call(jp_fetch, sid, ["cat", str(secret_file)], headers=as_user("alice"))
    assert status == 200 and result["stdout"] == "[scrubbed]\n", result
    secret_file.write_text("rotated-Secret-Value-2-longer")
    status, result = await exec_call(
        jp_fetch,
        sid,
        ["sh", "-c", f"cat {secret_file}; echo; echo {SECRET_FILE_VALUE}"],
        headers=as_user("alice"),
    )
    assert result["stdout"] == f"[scrubbed]\n{SECRET_FILE_VALUE}\n", (
        "the new value is scrubbed, the old no more"
    )


async def test_the_answers_are_in_the_api_spec(jp_fetch, jp_serverapp):
    sandbox_app(jp_serverapp).policy.egress_audit.audit(
        {
            "time": "2026-12-05T10:00:00Z",
            "owner": "alice",
            "session": "sbx-0",
            "kind": "tls",
            "host": "pypi.org",
            "port": 443,
            "decision": "refuse",
            "reason": "not allowed",
        }
    )
    status, info = await create(jp_fetch, "alice")
    check("/sessions", "post", status, info)
    for body in ({"egress": {"allow": ["pypi.org"]}}, {"egress": {"allow": ["10.1.2.3"]}}, {"bogus": 1}):
        status, answer = await patch(jp_fetch, "alice", info["id"], body)
        check("/sessions/{session_id}", "patch", status, answer)
    for user, params in (
        ("alice", {}),
        ("admin", {"owner": "alice"}),
        ("alice", {"owner": "bob"}),
        ("admin", {"limit": "0"}),
    ):
        status, answer = await call(jp_fetch, "egress", "audit", params=params, headers=as_user(user))
        check("/egress/audit", "get", status, answer)
    status, answer = await call(jp_fetch, "status", headers=as_user("admin"))
    check("/status", "get", status, answer)
