"""The operator's configuration of sandboxed coding agents: :class:`SandboxAgents` (traitlets).

``SandboxApp`` loads it with its own config; each entry of ``personas`` is checked at load
(:meth:`~jupyter_tai_sandbox.agents.spec.AgentPersonaSpec.from_config`), so a bad one stops the server's
start with the setting's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from traitlets import Bool, Dict, Float, List, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..images import AGENTS_IMAGE
from .spec import AgentPersonaSpec, AgentSpecError

DEFAULT_REGISTRIES = ["registry.npmjs.org", "pypi.org", "files.pythonhosted.org"]


class SandboxAgents(LoggingConfigurable):
    """Coding agents in a sandbox: jupyter-ai's ACP personas (Claude Code, Codex, any ACP agent) whose whole agent
    process runs in a sandbox session of the chatting user, one entry of ``personas`` each; their sessions carry
    the consumer label ``agent:<key>``, their model key stays at the egress gateway."""

    personas = Dict(
        key_trait=Unicode(),
        value_trait=Dict(),
        help="""The sandboxed coding agents shown in jupyter-ai's chat: key -> persona settings. The key (lowercase
        letters, digits, '-') names the sessions' consumer label agent:<key> and the persona class
        Sandboxed<Key>Persona. Settings: "preset" ("claude" or "codex": command, model hosts, env), "name",
        "description", "avatar" (an svg/png path on the server), "command" (the agent's argv in the session),
        "image" (default SandboxAgents.default_image), "isolation" (container or vm; never less), "cpu",
        "memory_mb", "ttl_seconds", "egress_allow" (default: the model's hosts and SandboxAgents.registries),
        "egress_deny", "model_hosts", "secrets" (names in SandboxPolicy.secrets, granted to agent:<key> at
        start: the model key stays at the egress gateway), "env" (plain variables), "scope" ("chat": one
        session per chat, default; "persona": one per persona and user), "persistent" (keep the workspace
        when a session ends), "copy_in" (a contents folder, relative to the chat's folder, copied in at each
        session start), "mcp_servers" (MCP servers given to the agent; none by default). Example:
        {"claude": {"preset": "claude", "secrets": ["anthropic"]}}.""",
    ).tag(config=True)

    registries = List(
        Unicode(),
        help="""Package registries every agent may reach besides its model's hosts (egress allow entries), unless
        a persona sets its own egress_allow.""",
    ).tag(config=True)

    default_image = Unicode(
        AGENTS_IMAGE,
        help="""The image of an agent's session when its persona names none (`jupyter tai-sandbox build-image
        --agents` builds it, with the common ACP agents installed).""",
    ).tag(config=True)

    start_timeout_seconds = Float(
        120.0,
        help="""Seconds for an agent to come up: its session made, its command started and the ACP handshake
        answered. Past it the chat says why and the session is destroyed.""",
    ).tag(config=True)

    terminal_timeout_seconds = Float(
        600.0,
        help="""The deadline of each terminal command an agent runs in its session (ACP terminal/create), in
        seconds; within SandboxPolicy.max_timeout_seconds.""",
    ).tag(config=True)

    plugin_personas = Bool(
        True,
        help="""At start, also look for sandboxed personas that plugins register on jupyter-ai's
        jupyter_ai.personas entry points (subclasses of SandboxedAcpPersona, in distributions that require
        jupyter-tai-sandbox), to grant their secrets and egress rules like the configured ones'.""",
    ).tag(config=True)

    @default("registries")
    def _registries_default(self) -> list[str]:
        return list(DEFAULT_REGISTRIES)

    @validate("personas")
    def _check_personas(self, proposal: Any) -> dict[str, Any]:
        value = proposal["value"]
        for key, entry in value.items():
            AgentPersonaSpec.from_config(key, entry)  # AgentSpecError (a ValueError for traitlets' sake too)
        return dict(value)

    def grant(self, policy: Any, specs: Sequence[AgentPersonaSpec]) -> list[str]:
        """Put the personas' needs in the operator's ``policy`` (a SandboxPolicy), at the server's start: each
        secret a persona names is granted to its consumer ``agent:<key>`` (a name not in SandboxPolicy.secrets
        is an AgentSpecError naming it), and a consumer with no rule of its own in SandboxPolicy.egress_rules
        gets the persona's network list as its rule (the operator's own rule for ``agent:<key>``, when set, stays
        the ceiling). What was done, one line each, for the log."""
        done: list[str] = []
        secrets = dict(policy.secrets)
        for spec in specs:
            for name in spec.secrets:
                entry = secrets.get(name)
                if entry is None:
                    known = ", ".join(sorted(secrets)) or "none"
                    raise AgentSpecError(
                        f"SandboxAgents.personas[{spec.key!r}].secrets: {name!r} is not a secret of "
                        f"SandboxPolicy.secrets (TAI_MCP_SANDBOX_SECRETS; known: {known}): declare it there (its "
                        "hosts and where its value comes from)",
                        field="secrets",
                    )
                consumers = list(entry["consumers"])
                if "*" not in consumers and spec.consumer not in consumers:
                    secrets[name] = {**entry, "consumers": [*consumers, spec.consumer]}
                    done.append(f"secret {name} granted to {spec.consumer}")
        if secrets != policy.secrets:
            policy.secrets = secrets
        rules = dict(policy.egress_rules)
        for spec in specs:
            if spec.consumer not in rules:
                allow = list(spec.allow_list(self.registries))
                rules[spec.consumer] = {"allow": allow, "deny": list(spec.egress_deny)}
                done.append(f"egress rule of {spec.consumer}: allow {', '.join(allow) or 'nothing'}")
        if rules != policy.egress_rules:
            policy.egress_rules = rules
        return done

    def specs(self) -> list[AgentPersonaSpec]:
        """Every configured persona's spec, in the config's order."""
        return [AgentPersonaSpec.from_config(key, entry) for key, entry in self.personas.items()]


__all__ = ["DEFAULT_REGISTRIES", "SandboxAgents"]
