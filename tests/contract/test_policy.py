import pytest

from jupyter_tai_sandbox.contract import NETWORK_ORDER, SandboxSpecRejectedError, SessionLimits, SessionSpec
from jupyter_tai_sandbox.policy import SCRUBBED, SandboxPolicy

#: a provider that gives everything and sets no bound: the policy's own decisions show alone
ANY_PROVIDER = SessionLimits(
    kind="test",
    settings="TestSandbox",
    max_isolation="vm",
    networks=frozenset(NETWORK_ORDER),
    supports_limits=True,
)


def decided(policy: SandboxPolicy, spec: SessionSpec) -> SessionSpec:
    return policy.effective_spec(spec, ANY_PROVIDER)


def test_defaults_are_container_floor_open_egress_durable_on_scrub_off():
    policy = SandboxPolicy()
    assert (policy.isolation, policy.egress, policy.durable, policy.scrub_transcript) == (
        "container",
        "egress",
        True,
        False,
    )
    assert policy.credentials == {}


def test_settings_read_their_environment_variables(monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX_ISOLATION", "none")
    monkeypatch.setenv("TAI_MCP_SANDBOX_EGRESS", "internal")
    monkeypatch.setenv("TAI_MCP_SANDBOX_DURABLE", "off")
    monkeypatch.setenv("TAI_MCP_SANDBOX_SCRUB_TRANSCRIPT", "1")
    monkeypatch.setenv("TAI_MCP_SANDBOX_CREDENTIALS", '{"tool:agent": ["API_TOKEN"]}')
    policy = SandboxPolicy()
    assert (policy.isolation, policy.egress, policy.durable, policy.scrub_transcript) == (
        "none",
        "internal",
        False,
        True,
    )
    assert policy.credentials == {"tool:agent": ["API_TOKEN"]}


def test_explicit_config_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX_ISOLATION", "none")
    assert SandboxPolicy(isolation="vm").isolation == "vm"


@pytest.mark.parametrize(
    ("setting", "value"),
    [("isolation", "paranoid"), ("egress", "sometimes"), ("credentials", {"tool:agent": "NOT_A_LIST"})],
)
def test_unknown_setting_values_are_refused(setting, value):
    with pytest.raises(Exception, match=setting if setting != "credentials" else "credentials"):
        SandboxPolicy(**{setting: value})


def test_bad_boolean_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX_DURABLE", "perhaps")
    with pytest.raises(ValueError, match="TAI_MCP_SANDBOX_DURABLE"):
        SandboxPolicy().durable  # noqa: B018


def test_egress_aliases_open_and_closed():
    assert SandboxPolicy(egress="open").egress == "egress"
    assert SandboxPolicy(egress="closed").egress == "none"


@pytest.mark.parametrize(
    ("floor", "requested", "effective"),
    [
        ("container", None, "container"),
        ("container", "none", "container"),
        ("container", "vm", "vm"),
        ("none", None, "none"),
        ("none", "container", "container"),
        ("vm", "container", "vm"),
    ],
)
def test_isolation_floor_raises_a_spec_to_at_least_the_floor(floor, requested, effective):
    spec = decided(SandboxPolicy(isolation=floor), SessionSpec(isolation=requested))
    assert spec.isolation == effective


@pytest.mark.parametrize(
    ("ceiling", "allowed", "rejected"),
    [
        ("egress", ["egress", "internal", "none"], []),
        ("internal", ["internal", "none"], ["egress"]),
        ("none", ["none"], ["egress", "internal"]),
    ],
)
def test_egress_ceiling_rejects_more_network_than_it_allows(ceiling, allowed, rejected):
    policy = SandboxPolicy(egress=ceiling)
    for network in allowed:
        assert decided(policy, SessionSpec(network=network)).network == network
    for network in rejected:
        with pytest.raises(SandboxSpecRejectedError, match="TAI_MCP_SANDBOX_EGRESS"):
            decided(policy, SessionSpec(network=network))


def test_durable_switch_off_rejects_persistent_sessions():
    persistent = SessionSpec(durability="persistent", workspace_key="work")
    assert decided(SandboxPolicy(durable=True), persistent).durability == "persistent"
    with pytest.raises(SandboxSpecRejectedError, match="TAI_MCP_SANDBOX_DURABLE"):
        decided(SandboxPolicy(durable=False), persistent)
    assert decided(SandboxPolicy(durable=False), SessionSpec()).durability == "ephemeral"


def test_credentials_are_injected_per_consumer(monkeypatch):
    monkeypatch.setenv("AGENT_TOKEN", "tok-agent")
    monkeypatch.setenv("SHARED_KEY", "tok-shared")
    monkeypatch.setenv("NOT_GRANTED", "tok-other")
    policy = SandboxPolicy(credentials={"tool:agent": ["AGENT_TOKEN"], "*": ["SHARED_KEY"]})
    agent = decided(policy, SessionSpec(consumer="tool:agent", env={"OWN": "1"}))
    assert agent.env == {"OWN": "1", "AGENT_TOKEN": "tok-agent", "SHARED_KEY": "tok-shared"}
    other = decided(policy, SessionSpec(consumer="user:notebook"))
    assert other.env == {"SHARED_KEY": "tok-shared"}


def test_a_granted_credential_missing_from_the_server_rejects_loudly(monkeypatch):
    monkeypatch.delenv("MISSING_TOKEN", raising=False)
    policy = SandboxPolicy(credentials={"tool:agent": ["MISSING_TOKEN"]})
    with pytest.raises(SandboxSpecRejectedError, match="MISSING_TOKEN"):
        decided(policy, SessionSpec(consumer="tool:agent"))


def test_scrubber_replaces_injected_credential_values(monkeypatch):
    monkeypatch.setenv("AGENT_TOKEN", "tok-123")
    monkeypatch.setenv("LONGER", "tok-123-and-more")
    text = "token=tok-123 other=tok-123-and-more plain"
    off = SandboxPolicy(credentials={"tool:agent": ["AGENT_TOKEN", "LONGER"]})
    assert off.scrub(text) == text  # scrub_transcript is off by default
    on = SandboxPolicy(credentials={"tool:agent": ["AGENT_TOKEN", "LONGER"]}, scrub_transcript=True)
    assert on.scrub(text) == f"token={SCRUBBED} other={SCRUBBED} plain"
    assert off.redact(text) == on.scrub(text)


def test_deciding_leaves_the_callers_spec_unchanged(monkeypatch):
    monkeypatch.setenv("AGENT_TOKEN", "tok")
    spec = SessionSpec(consumer="tool:agent")
    decided(SandboxPolicy(credentials={"tool:agent": ["AGENT_TOKEN"]}), spec)
    assert spec.env == {} and spec.isolation is None


def test_credentials_from_the_environment_are_checked_like_configured_ones(monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX_CREDENTIALS", '{"alice": ["API_TOKEN"]}')
    with pytest.raises(ValueError, match="names no kind"):
        SandboxPolicy().credentials  # noqa: B018
    monkeypatch.setenv("TAI_MCP_SANDBOX_CREDENTIALS", '{"user:alice": "API_TOKEN"}')
    with pytest.raises(ValueError, match="lists of environment variable names"):
        SandboxPolicy().credentials  # noqa: B018
