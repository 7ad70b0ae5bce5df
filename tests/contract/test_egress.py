"""The egress policy as data (contract/egress.py): entries parsed, normalised, matched and covered; the policy
and its secret grants to and from JSON; SessionSpec.egress, its public JSON through a container's labels."""

from __future__ import annotations

import json

import pytest

from jupyter_tai_sandbox.contract import EgressPolicy, SandboxSpecRejectedError, SecretGrant, SessionSpec
from jupyter_tai_sandbox.contract.egress import (
    MAX_ENTRIES,
    PLACEHOLDER_PATTERN,
    entries_match,
    new_placeholder,
    parse_entry,
    uncovered,
)
from jupyter_tai_sandbox.providers._docker_sandbox import spec_from_labels
from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_SPEC, session_labels


def grant(name="github", env="GH_TOKEN", hosts=("api.github.com",), **flags):
    return SecretGrant(name, env, new_placeholder(), hosts, **flags)


def test_entries_are_normalised_lower_case_idna_without_the_trailing_dot():
    policy = EgressPolicy(allow=["PyPI.org.", "*.GitHub.com", "bücher.de", "db.example.com:5432", "pypi.org"])
    assert policy.allow == ("pypi.org", "*.github.com", "xn--bcher-kva.de", "db.example.com:5432")
    assert EgressPolicy().allow is None and EgressPolicy(allow=[]).allow == ()


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("10.0.0.1", "IP literal"),
        ("::1", "IP literal"),
        ("[::1]:443", "IP literal"),
        ("127.1", "IP literal"),
        ("a..example.com", "empty label"),
        (".example.com", "empty label"),
        ("a*.example.com", "whole first label"),
        ("www.*.example.com", "whole first label"),
        ("example.com:0", "1 to 65535"),
        ("example.com:65536", "1 to 65535"),
        ("example.com:http", "1 to 65535"),
        ("example.com:443", "not a raw port"),
        ("example.com:53", "not a raw port"),
        ("*:22", "raw port needs a named host"),
        ("", "empty name"),
        ("exa mple.com", "no spaces"),
        ("-" * 64 + ".com", "label"),
        ("a." * 127 + "com", "253"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry, why):
    with pytest.raises(SandboxSpecRejectedError, match=why) as caught:
        EgressPolicy(allow=[entry])
    assert repr(entry[:300]) in str(caught.value)


def test_star_is_for_allow_only_and_the_lists_are_bounded():
    with pytest.raises(SandboxSpecRejectedError, match="allow only"):
        EgressPolicy(deny=["*"])
    with pytest.raises(SandboxSpecRejectedError, match=f"more than {MAX_ENTRIES}"):
        EgressPolicy(allow=[f"h{i}.example.com" for i in range(MAX_ENTRIES + 1)])
    assert (
        len(EgressPolicy(allow=[f"h{i}.example.com" for i in range(MAX_ENTRIES)]).allow or ()) == MAX_ENTRIES
    )
    with pytest.raises(SandboxSpecRejectedError, match="list of host names"):
        EgressPolicy(allow="pypi.org")  # type: ignore[arg-type]


def test_matching_names_ports_and_deny_over_allow():
    policy = EgressPolicy(
        allow=["pypi.org", "*.github.com", "db.example.com:5432"],
        deny=["evil.github.com", "x.github.com:8080"],
    )
    assert policy.allows("pypi.org") and policy.allows("PYPI.ORG.", 80)
    assert not policy.allows("pypi.org", 22) and not policy.allows("files.pypi.org")
    assert policy.allows("api.github.com") and policy.allows("a.b.github.com")
    assert not policy.allows("github.com"), "*.x is the names under x, not x itself"
    assert not policy.allows("evil.github.com") and not policy.allows("evil.github.com", 80)
    assert policy.allows("db.example.com", 5432) and not policy.allows("db.example.com", 443)
    assert not policy.allows("notgithub.com"), "a suffix match is on a label boundary"
    anything = EgressPolicy(deny=["evil.example.com"])
    assert anything.allows("whatever.org") and not anything.allows("whatever.org", 22)
    assert not anything.allows("evil.example.com")
    assert entries_match(["*.example.com:9000"], "a.example.com", 9000)
    assert not entries_match(["*.example.com:9000"], "example.com", 9000)


def test_a_ceiling_covers_an_entry_only_when_it_admits_everything_the_entry_does():
    ceiling = ("*.github.com", "pypi.org", "db.example.com:5432")
    assert (
        uncovered(ceiling, ["api.github.com", "*.eu.github.com", "pypi.org", "db.example.com:5432"]) is None
    )
    assert uncovered(ceiling, ["github.com"]) == "github.com"
    assert uncovered(ceiling, ["*.github.com"]) is None
    assert uncovered(ceiling, ["files.pypi.org"]) == "files.pypi.org"
    assert uncovered(ceiling, ["db.example.com:5433"]) == "db.example.com:5433"
    assert uncovered(ceiling, ["*"]) == "*"
    # no allow-list in the ceiling: any name on 80/443, never a raw port
    assert uncovered(None, ["anything.org", "*.x.org", "*"]) is None
    assert uncovered(None, ["db.example.com:5432"]) == "db.example.com:5432"
    assert parse_entry("*").covers(parse_entry("a.b")) and not parse_entry("a.b").covers(parse_entry("*"))


def test_a_secret_grant_is_checked_and_round_trips():
    g = grant(hosts=["API.GitHub.com."], query=True)
    assert g.hosts == ("api.github.com",) and PLACEHOLDER_PATTERN.match(g.placeholder)
    assert SecretGrant.from_json(g.to_json()) == g
    assert new_placeholder() != new_placeholder()
    for bad, why in (
        ({"name": "../etc"}, "secret name"),
        ({"env": "1BAD"}, "environment variable"),
        ({"placeholder": "short"}, "placeholder"),
        ({"hosts": []}, "name the hosts"),
        ({"hosts": ["*"]}, "allow only"),
        ({"hosts": ["api.github.com:8443"]}, "port is not allowed"),
        ({"query": "yes"}, "true or false"),
    ):
        fields = {**g.to_json(), **bad}
        with pytest.raises(SandboxSpecRejectedError, match=why):
            SecretGrant.from_json(fields)
    with pytest.raises(SandboxSpecRejectedError, match="at most once"):
        EgressPolicy(secrets=(grant(), grant()))


def test_the_policy_round_trips_through_json():
    policy = EgressPolicy(allow=["pypi.org"], deny=["evil.org"], secrets=(grant(body=True),))
    data = policy.to_json()
    assert data == {
        "allow": ["pypi.org"],
        "deny": ["evil.org"],
        "secrets": [policy.secrets[0].to_json()],
    }
    assert EgressPolicy.from_json(data) == policy
    assert EgressPolicy.from_json({"allow": None}).to_json() == {"allow": None, "deny": [], "secrets": []}
    with pytest.raises(SandboxSpecRejectedError, match="unknown egress field"):
        EgressPolicy.from_json({"allowed": ["x.org"]})
    with pytest.raises(SandboxSpecRejectedError, match="granted by the operator"):
        EgressPolicy.from_json(data, secrets=False)


def test_a_specs_egress_needs_network_egress_and_a_request_names_no_secret():
    spec = SessionSpec(egress={"allow": ["pypi.org"]})
    assert spec.egress == EgressPolicy(allow=("pypi.org",))
    assert SessionSpec().egress is None and SessionSpec().to_json()["egress"] is None
    with pytest.raises(SandboxSpecRejectedError, match="needs network='egress'"):
        SessionSpec(network="internal", egress=EgressPolicy())
    body = {"network": "egress", "egress": {"allow": ["pypi.org"], "deny": []}}
    assert SessionSpec.from_json(body, request=True).egress == EgressPolicy(allow=("pypi.org",))
    with_secret = {"egress": {"allow": None, "deny": [], "secrets": [grant().to_json()]}}
    with pytest.raises(SandboxSpecRejectedError, match="granted by the operator"):
        SessionSpec.from_json(with_secret, request=True)
    assert SessionSpec.from_json(with_secret).egress is not None  # a recorded spec (labels) keeps its grants


def test_the_public_json_in_a_containers_labels_keeps_placeholders_and_never_a_value():
    g = grant()
    spec = SessionSpec(
        owner="alice",
        consumer="user:alice",
        env={"GH_TOKEN": g.placeholder, "PLAIN": "v"},
        egress=EgressPolicy(allow=["*.github.com"], deny=["gist.github.com"], secrets=(g,)),
    )
    labels = session_labels("sbx-0123456789abcdef", spec, 1.0, 2.0, {})
    recorded = json.loads(labels[LABEL_SPEC])
    assert recorded["env"] == ["GH_TOKEN", "PLAIN"], "env values are never in a label"
    assert recorded["egress"]["secrets"][0] == {**g.to_json()}, "the grant is there: name and placeholder"
    env = [f"GH_TOKEN={g.placeholder}", "PLAIN=v"]
    back = spec_from_labels(labels, env)
    assert back == spec
    # a session recorded before egress policies existed: no egress field in its label
    del recorded["egress"]
    assert spec_from_labels({**labels, LABEL_SPEC: json.dumps(recorded)}, env).egress is None
