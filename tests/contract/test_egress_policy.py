"""SandboxPolicy's egress settings: egress_rules (ceiling and default per consumer), secrets (placeholders in the
session, real values on the server only, a rotating file), egress_audit_path; effective_spec decides a
session's policy once (again: no change), effective_egress narrows a live change, and each provider that cannot
enforce a policy refuses it in its own words."""

from __future__ import annotations

import json
import os

import pytest

from jupyter_tai_sandbox.contract import (
    NETWORK_ORDER,
    EgressPolicy,
    SandboxSpecRejectedError,
    SessionLimits,
    SessionSpec,
)
from jupyter_tai_sandbox.contract.egress import PLACEHOLDER_PATTERN
from jupyter_tai_sandbox.policy import SCRUBBED, SandboxPolicy, within_limits
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.providers.swarm import SwarmSandbox

#: a provider with an egress gateway that sets no other bound
GATEWAY = SessionLimits(
    kind="test",
    settings="TestSandbox",
    max_isolation="vm",
    networks=frozenset(NETWORK_ORDER),
    supports_limits=True,
    egress_policy=True,
)

RULES = {
    "*": {"allow": ["*.github.com", "pypi.org", "files.pythonhosted.org", "db.example.com:5432"], "deny": []},
    "user:bob": {"deny": ["evil.example.com"]},
    "user:carol": {"allow": ["pypi.org"], "deny": ["upload.pypi.org"]},
}


def policy(**traits) -> SandboxPolicy:
    traits.setdefault("egress_audit_path", "")
    return SandboxPolicy(**traits)


def decided(p: SandboxPolicy, spec: SessionSpec, limits: SessionLimits = GATEWAY) -> SessionSpec:
    return p.effective_spec(spec, limits)


def test_no_rule_no_secret_no_request_is_plain_egress():
    p = policy()
    assert decided(p, SessionSpec(consumer="user:alice")).egress is None
    assert decided(
        p, SessionSpec(consumer="user:alice", egress={"allow": ["x.org:22"]})
    ).egress == EgressPolicy(allow=("x.org:22",)), (
        "with no rule there is no ceiling: any policy narrows plain egress"
    )


def test_the_most_specific_rule_is_the_default_and_the_ceiling():
    p = policy(egress_rules=RULES)
    alice = decided(p, SessionSpec(consumer="user:alice"))
    assert alice.egress == EgressPolicy(allow=tuple(RULES["*"]["allow"]))
    bob = decided(p, SessionSpec(consumer="user:bob/notebook"))
    assert bob.egress == EgressPolicy(allow=None, deny=("evil.example.com",)), (
        "user:bob/SUB is under user:bob"
    )
    carol = decided(p, SessionSpec(consumer="user:carol", egress={"deny": ["extra.org"]}))
    assert carol.egress == EgressPolicy(allow=("pypi.org",), deny=("upload.pypi.org", "extra.org"))
    narrowed = decided(p, SessionSpec(consumer="user:alice", egress={"allow": ["api.github.com"]}))
    assert narrowed.egress == EgressPolicy(allow=("api.github.com",))
    with pytest.raises(SandboxSpecRejectedError, match=r"'github.com' is over the operator's ceiling"):
        decided(p, SessionSpec(consumer="user:alice", egress={"allow": ["api.github.com", "github.com"]}))
    with pytest.raises(SandboxSpecRejectedError, match=r"'x.org:22' is over"):
        decided(p, SessionSpec(consumer="user:bob", egress={"allow": ["x.org:22"]}))
    assert decided(p, SessionSpec(consumer="user:bob", egress={"allow": ["anything.org"]})).egress is not None
    # internal and none have no egress to filter
    assert decided(p, SessionSpec(consumer="user:alice", network="internal")).egress is None


def test_deciding_a_decided_spec_changes_nothing():
    p = policy(egress_rules=RULES, secrets={"gh": {"hosts": ["api.github.com"], "from_env": "HOME"}})
    once = decided(p, SessionSpec(consumer="user:carol", egress={"deny": ["extra.org"]}))
    assert decided(p, once) == once
    assert once.egress is not None and once.egress.secrets[0].placeholder == once.env["gh"]


def test_a_granted_secret_is_a_placeholder_in_the_session_and_a_grant_in_its_policy(monkeypatch):
    monkeypatch.setenv("TEST_GH_TOKEN", "ghp_the_real_value")
    p = policy(
        secrets={
            "github": {
                "hosts": ["api.github.com", "*.githubusercontent.com"],
                "from_env": "TEST_GH_TOKEN",
                "env": "GH_TOKEN",
                "consumers": ["user:alice"],
                "query": True,
            },
        }
    )
    spec = decided(p, SessionSpec(consumer="user:alice"))
    assert spec.egress is not None and spec.egress.allow is None, (
        "a secret alone gives a policy, allow any name"
    )
    (grant,) = spec.egress.secrets
    assert (grant.name, grant.env, grant.hosts, grant.query, grant.body) == (
        "github",
        "GH_TOKEN",
        ("api.github.com", "*.githubusercontent.com"),
        True,
        False,
    )
    assert PLACEHOLDER_PATTERN.match(grant.placeholder) and spec.env["GH_TOKEN"] == grant.placeholder
    assert "ghp_the_real_value" not in json.dumps(spec.to_json()), "the real value is nowhere in the spec"
    other = decided(p, SessionSpec(consumer="user:alice"))
    assert other.env["GH_TOKEN"] != grant.placeholder, "a placeholder is per session"
    assert decided(p, SessionSpec(consumer="user:bob")).egress is None, "not granted to bob"
    assert p.secret_value("github") == "ghp_the_real_value"
    assert "ghp_the_real_value" in p.injected_values(), "the scrub knows the real value"
    assert grant.placeholder not in p.injected_values(), "and not the placeholder, which names nothing"


def test_a_grant_the_policy_does_not_give_is_refused_and_one_it_gives_keeps_its_placeholder(monkeypatch):
    monkeypatch.setenv("TEST_TOKEN", "v")
    p = policy(secrets={"tok": {"hosts": ["api.example.com"], "from_env": "TEST_TOKEN", "env": "TOK"}})
    spec = decided(p, SessionSpec(consumer="user:alice"))
    assert decided(p, spec).env["TOK"] == spec.env["TOK"]
    stray = spec.replace(
        egress=spec.egress.replace(
            secrets=(
                spec.egress.secrets[0].__class__(
                    "other", "OTHER", spec.egress.secrets[0].placeholder, ("x.org",)
                ),
            )
        )
    )
    with pytest.raises(SandboxSpecRejectedError, match="other are not granted"):
        decided(p, stray)


def test_a_granted_secret_without_a_value_refuses_the_session_naming_its_source(monkeypatch, tmp_path):
    monkeypatch.delenv("TEST_MISSING", raising=False)
    p = policy(secrets={"gone": {"hosts": ["api.example.com"], "from_env": "TEST_MISSING", "env": "GONE"}})
    with pytest.raises(SandboxSpecRejectedError, match=r"secret gone .* environment variable TEST_MISSING"):
        decided(p, SessionSpec(consumer="user:alice"))
    p = policy(secrets={"f": {"hosts": ["api.example.com"], "from_file": str(tmp_path / "nope"), "env": "F"}})
    with pytest.raises(SandboxSpecRejectedError, match=r"file .*nope"):
        decided(p, SessionSpec(consumer="user:alice"))


def test_a_file_secret_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "token"
    path.write_text("first-value\n")
    p = policy(secrets={"tok": {"hosts": ["api.example.com"], "from_file": str(path)}})
    assert p.secret_value("tok") == "first-value"
    path.write_text("second-value-longer\n")
    assert p.secret_value("tok") == "second-value-longer"
    replaced = tmp_path / "token.new"
    replaced.write_text("third")
    os.replace(replaced, path)  # how a secret manager rotates it: a rename
    assert p.secret_value("tok") == "third"
    assert p.injected_values() == ["third"]
    assert p.secret_value("unknown") is None


def test_the_scrub_replaces_a_secrets_real_value(monkeypatch):
    monkeypatch.setenv("TEST_SCRUB_SECRET", "sk-live-0123456789")
    p = policy(
        scrub_transcript=True,
        secrets={"k": {"hosts": ["api.example.com"], "from_env": "TEST_SCRUB_SECRET", "env": "K"}},
    )
    assert p.scrub("token sk-live-0123456789 end") == f"token {SCRUBBED} end"


def test_a_live_change_is_narrowed_like_a_create_and_keeps_the_secrets(monkeypatch):
    monkeypatch.setenv("TEST_TOKEN", "v")
    p = policy(
        egress_rules=RULES,
        secrets={"tok": {"hosts": ["api.github.com"], "from_env": "TEST_TOKEN", "env": "TOK"}},
    )
    spec = decided(p, SessionSpec(consumer="user:carol"))
    changed = p.effective_egress(spec, ["pypi.org"], ["bad.pypi.org"])
    assert changed == EgressPolicy(
        allow=("pypi.org",), deny=("upload.pypi.org", "bad.pypi.org"), secrets=spec.egress.secrets
    )
    assert p.effective_egress(spec).allow == ("pypi.org",), "allow None: the rule's"
    with pytest.raises(SandboxSpecRejectedError, match=r"'github\.com' is over"):
        p.effective_egress(spec, ["github.com"])
    with pytest.raises(SandboxSpecRejectedError, match="IP literal"):
        p.effective_egress(spec, ["10.0.0.1"])
    with pytest.raises(SandboxSpecRejectedError, match="no egress to set a policy on"):
        p.effective_egress(SessionSpec(network="none"), ["pypi.org"])


def test_settings_read_their_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("TAI_MCP_SANDBOX_EGRESS_RULES", '{"tool:agent": {"allow": ["PyPI.org"]}}')
    monkeypatch.setenv(
        "TAI_MCP_SANDBOX_SECRETS", '{"gh": {"hosts": ["api.github.com"], "from_env": "X", "env": "GH_TOKEN"}}'
    )
    monkeypatch.setenv("TAI_MCP_SANDBOX_EGRESS_AUDIT", str(tmp_path / "audit.jsonl"))
    p = SandboxPolicy()
    assert p.egress_rules == {"tool:agent": {"allow": ["pypi.org"], "deny": []}}
    assert p.secrets["gh"] == {
        "hosts": ["api.github.com"],
        "from_env": "X",
        "env": "GH_TOKEN",
        "consumers": ["*"],
        "query": False,
        "body": False,
    }
    assert p.egress_audit_path == str(tmp_path / "audit.jsonl")
    monkeypatch.delenv("TAI_MCP_SANDBOX_EGRESS_AUDIT")
    assert SandboxPolicy().egress_audit_path.endswith("tai-sandbox-egress-audit.jsonl")
    monkeypatch.setenv("TAI_MCP_SANDBOX_EGRESS_AUDIT", "")
    assert SandboxPolicy().egress_audit_path == ""
    monkeypatch.setenv("TAI_MCP_SANDBOX_EGRESS_RULES", "{not json")
    with pytest.raises(ValueError, match="TAI_MCP_SANDBOX_EGRESS_RULES must be JSON"):
        SandboxPolicy().egress_rules  # noqa: B018


@pytest.mark.parametrize(
    ("trait", "value", "why"),
    [
        ("egress_rules", {"alice": {"allow": ["x.org"]}}, "names no kind"),
        ("egress_rules", {"*": {"allow": ["10.0.0.1"]}}, "IP literal"),
        ("egress_rules", {"*": {"allowed": ["x.org"]}}, "must be an object"),
        ("secrets", {"gh": {"hosts": ["api.github.com"]}}, "exactly one of from_env"),
        ("secrets", {"gh": {"hosts": [], "from_env": "X"}}, "name the hosts"),
        ("secrets", {"gh-token": {"hosts": ["a.org"], "from_env": "X"}}, "set env"),
        ("secrets", {"gh": {"hosts": ["a.org"], "from_env": "X", "consumers": ["alice"]}}, "names no kind"),
        ("secrets", {"gh": {"hosts": ["a.org"], "from_env": "X", "tls": True}}, "unknown field"),
        (
            "secrets",
            {
                "a": {"hosts": ["a.org"], "from_env": "X", "env": "T"},
                "b": {"hosts": ["b.org"], "from_env": "Y", "env": "T"},
            },
            "same env",
        ),
    ],
)
def test_a_bad_setting_is_refused_at_configuration(trait, value, why):
    with pytest.raises(Exception, match=why):
        SandboxPolicy(**{trait: value})


def test_the_status_shows_rules_and_secret_names_to_admins_only(monkeypatch):
    p = policy(egress_rules=RULES, secrets={"gh": {"hosts": ["api.github.com"], "from_env": "SOME_VAR"}})
    admin = p.public_json(show_credentials=True)
    assert admin["egress_rules"]["user:carol"] == {"allow": ["pypi.org"], "deny": ["upload.pypi.org"]}
    assert admin["secrets"] == {
        "gh": {"hosts": ["api.github.com"], "env": "gh", "consumers": ["*"], "query": False, "body": False}
    }, "never the source"
    assert "egress_rules" not in p.public_json(show_credentials=False)


@pytest.mark.parametrize(
    ("provider", "words"),
    [
        (
            LocalSandbox,
            "the local provider runs on the host's network and cannot enforce an egress allow-list",
        ),
        (SwarmSandbox, "the swarm provider cannot enforce an egress allow-list yet; use docker"),
    ],
)
def test_a_provider_without_a_gateway_refuses_a_policy_in_its_own_words(provider, words):
    limits = provider().session_limits()
    assert not limits.egress_policy
    spec = SessionSpec(egress={"allow": ["pypi.org"]}, image=limits.default_image)
    with pytest.raises(SandboxSpecRejectedError, match=words):
        within_limits(spec, limits)
    within_limits(spec.replace(egress=None), limits)  # the same spec without a policy is fine


def test_a_secret_granted_on_a_provider_without_a_gateway_refuses_the_session(monkeypatch):
    monkeypatch.setenv("TEST_TOKEN", "v")
    p = policy(isolation="none", secrets={"tok": {"hosts": ["a.org"], "from_env": "TEST_TOKEN", "env": "T"}})
    limits = LocalSandbox().session_limits()
    with pytest.raises(SandboxSpecRejectedError, match=r"a secret SandboxPolicy\.secrets grants"):
        p.effective_spec(SessionSpec(consumer="user:alice"), limits)
    assert p.effective_spec(SessionSpec(consumer="user:alice", network="egress"), GATEWAY).egress is not None
