"""A sandboxed persona's configuration: every bad field named, the presets, what the server's start puts in
the policy (the secrets' consumer agent:<key>, the egress rule), a start refused for a secret the policy
lacks, the persona manager hook, and a plugin's subclass."""

from __future__ import annotations

import json
import logging

import pytest

from jupyter_tai_sandbox.agents import AGENT_PRESETS, AgentPersonaSpec, AgentSpecError, SandboxAgents
from jupyter_tai_sandbox.labels import AGENT, agent_label, credential_key_problem, kind_of
from jupyter_tai_sandbox.policy import SandboxPolicy
from tests.agents.test_agent_persona import CHAT_EXTENSIONS
from tests.support.live_server import LiveServer


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"preset": "claude", "cpu": -1}, "cpu", "positive number"),
        ({"preset": "claude", "memory_mb": 1.5}, "memory_mb", "whole number"),
        ({"preset": "nope"}, "preset", "known: claude, codex"),
        ({"preset": "claude", "isolation": "none"}, "isolation", "at least in a container"),
        ({"name": "x"}, "command", "required"),
        ({"preset": "claude", "egress_allow": ["bad host!"]}, "egress_allow", "bad host!"),
        ({"preset": "claude", "scope": "server"}, "scope", "'chat'"),
        ({"preset": "claude", "copy_in": "../up"}, "copy_in", "inside it"),
        ({"preset": "claude", "env": {"1X": "y"}}, "env", "no environment variable name"),
        ({"preset": "claude", "avatar": "/nonexistent.svg"}, "avatar", "no file"),
        ({"preset": "claude", "mcp_servers": [{"command": "x"}]}, "mcp_servers", "with a name"),
        ({"preset": "claude", "colour": "red"}, "colour", "unknown setting"),
    ],
)
def test_a_bad_field_is_refused_naming_it(entry, field, words):
    with pytest.raises(AgentSpecError) as caught:
        AgentPersonaSpec.from_config("claude", entry)
    assert caught.value.field == field
    assert "SandboxAgents.personas['claude']" in str(caught.value) and words in str(caught.value)


def test_a_bad_key_is_refused_before_anything_else():
    with pytest.raises(AgentSpecError, match="key 'Claude'") as caught:
        SandboxAgents(personas={"Claude": {}})
    assert caught.value.field == "key"


def test_a_preset_gives_command_hosts_and_env_and_the_entry_wins():
    spec = AgentPersonaSpec.from_config(
        "my-claude", {"preset": "claude", "name": "Mine", "env": {"DISABLE_TELEMETRY": "0", "X": "1"}}
    )
    assert spec.command == ("claude-code-acp",) and spec.name == "Mine"
    assert spec.env["IS_SANDBOX"] == "1" and spec.env["DISABLE_TELEMETRY"] == "0" and spec.env["X"] == "1"
    assert spec.consumer == "agent:my-claude" and spec.class_name == "SandboxedMyClaudePersona"
    assert spec.allow_list(["pypi.org"]) == ("api.anthropic.com", "pypi.org")
    assert set(AGENT_PRESETS) == {"claude", "codex"}
    explicit = AgentPersonaSpec.from_config("c", {"preset": "codex", "egress_allow": ["api.openai.com"]})
    assert explicit.allow_list(["pypi.org"]) == ("api.openai.com",)


def test_the_agent_kind_is_a_typed_label():
    assert agent_label("claude") == "agent:claude" and kind_of("agent:claude") == AGENT
    assert credential_key_problem("agent:claude") is None
    policy = SandboxPolicy(
        credentials={"agent:claude": ["X"]},
        egress_rules={"agent:claude": {"allow": ["api.anthropic.com"]}},
        secrets={"k": {"hosts": ["api.anthropic.com"], "from_env": "K", "consumers": ["agent:claude"]}},
    )
    assert policy.granted_secrets("agent:claude") == ["k"] and policy.granted_secrets("user:claude") == []


def test_the_start_grants_the_secrets_and_sets_the_egress_rule_unless_the_operator_has_one():
    policy = SandboxPolicy(
        secrets={
            "anthropic": {
                "hosts": ["api.anthropic.com"],
                "from_env": "ANTHROPIC_KEY",
                "consumers": ["user:x"],
            },
            "shared": {"hosts": ["api.openai.com"], "from_env": "OPENAI_KEY"},
        },
        egress_rules={"*": {"allow": ["pypi.org"]}, "agent:codex": {"allow": ["api.openai.com"]}},
    )
    agents = SandboxAgents(
        personas={
            "claude": {"preset": "claude", "secrets": ["anthropic"]},
            "codex": {"preset": "codex", "secrets": ["shared"]},
        }
    )
    done = agents.grant(policy, agents.specs())
    assert policy.secrets["anthropic"]["consumers"] == ["user:x", "agent:claude"]
    assert policy.secrets["shared"]["consumers"] == ["*"]  # '*' covers it already
    assert policy.egress_rules["agent:claude"] == {
        "allow": ["api.anthropic.com", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org"],
        "deny": [],
    }
    assert policy.egress_rules["agent:codex"] == {"allow": ["api.openai.com"], "deny": []}  # the operator's
    assert policy.egress_rules["*"] == {"allow": ["pypi.org"], "deny": []}
    assert "secret anthropic granted to agent:claude" in done
    with pytest.raises(
        AgentSpecError, match=r"'missing' is not a secret of SandboxPolicy\.secrets"
    ) as caught:
        agents.grant(
            policy, [AgentPersonaSpec.from_config("x", {"preset": "claude", "secrets": ["missing"]})]
        )
    assert caught.value.field == "secrets" and "known: anthropic, shared" in str(caught.value)


def test_the_persona_manager_hook_adds_each_configured_persona(caplog):
    from jupyter_ai_persona_manager.persona_manager import PersonaManager  # type: ignore[import-untyped]

    from jupyter_tai_sandbox.agents.persona import SandboxedAcpPersona, persona_class
    from jupyter_tai_sandbox.agents.persona_manager import with_sandbox_agents

    claude = persona_class(AgentPersonaSpec.from_config("claude", {"preset": "claude"}))
    codex = persona_class(AgentPersonaSpec.from_config("codex", {"preset": "codex"}))
    assert (
        claude.__module__ == "jupyter_tai_sandbox.agents.persona"
        and claude.__name__ == "SandboxedClaudePersona"
    )
    assert (
        issubclass(claude, SandboxedAcpPersona) and claude.agent is not None and claude.agent.key == "claude"
    )
    manager = with_sandbox_agents(PersonaManager, [claude])
    assert issubclass(manager, PersonaManager) and manager.sandbox_persona_classes == (claude,)
    # applied again (a second server in the process): one layer, the classes together
    again = with_sandbox_agents(manager, [codex])
    assert again.__mro__[1] is PersonaManager and again.sandbox_persona_classes == (claude, codex)


def test_a_plugin_subclass_names_its_agent_and_a_class_without_one_is_refused():
    from jupyter_tai_sandbox.agents.persona import SandboxedAcpPersona

    class MyAgentPersona(SandboxedAcpPersona):
        agent = AgentPersonaSpec(
            key="my-agent", name="My agent", command=("my-acp", "--stdio"), scope="persona"
        )

    assert MyAgentPersona.agent.consumer == "agent:my-agent"
    with pytest.raises(TypeError, match="set the class attribute agent"):
        SandboxedAcpPersona(parent=None, chat=None)


def test_without_the_chat_extensions_the_start_says_what_to_enable(caplog):
    from jupyter_tai_sandbox.agents.persona_manager import install

    class NoExtensions:
        class extension_manager:
            extensions: dict = {}

    spec = AgentPersonaSpec.from_config("claude", {"preset": "claude"})
    log = logging.getLogger("test-agents-install")
    with caplog.at_level(logging.WARNING, logger="test-agents-install"):
        assert install(NoExtensions(), [spec], log) is None
    assert "jupyterlab_chat, jupyter_ai_router, jupyter_ai_persona_manager" in caplog.text


def test_a_persona_naming_a_secret_the_policy_lacks_stops_the_extension(tmp_path):
    (tmp_path / "config").mkdir()
    config = {
        "ServerApp": {"jpserver_extensions": dict(CHAT_EXTENSIONS)},
        "SandboxApp": {"provider": "local"},
        "SandboxPolicy": {"isolation": "none", "secrets": {}},
        "SandboxAgents": {"personas": {"claude": {"preset": "claude", "secrets": ["anthropic"]}}},
    }
    (tmp_path / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
    live = LiveServer(tmp_path).start()
    try:
        status, _ = live.call("GET", "sessions")
        log = live.log_path.read_text()
    finally:
        live.stop()
    assert (
        "SandboxAgents.personas['claude'].secrets: 'anthropic' is not a secret of SandboxPolicy.secrets"
        in log
    )
    assert status == 404  # the extension did not load: no sandbox routes
