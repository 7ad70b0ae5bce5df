"""A coding agent's persona as the operator declares it: :class:`AgentPersonaSpec`, and the presets of the
common agents (:data:`AGENT_PRESETS`).

A spec comes from one entry of ``SandboxAgents.personas`` (:meth:`AgentPersonaSpec.from_config`), or is
written by a plugin author as the ``agent`` attribute of a :class:`~jupyter_tai_sandbox.agents.persona.
SandboxedAcpPersona` subclass. Every field is checked once, on construction: a bad one raises
:class:`AgentSpecError` naming it (``SandboxAgents.personas['claude'].cpu: ...``), so a typo stops the
server's start instead of the first chat message. Nothing here imports jupyter-ai.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ..contract import EgressPolicy, SandboxError, SandboxRequestError
from ..contract.values import ISOLATION_ORDER, is_positive_number, isolation_rank
from ..labels import agent_label

#: a persona's key: its consumer label ``agent:<key>`` and its class name ``Sandboxed<Key>Persona``
KEY_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SCOPES = ("chat", "persona")
#: the isolation a coding agent needs at least: its process runs the model's commands
MIN_ISOLATION = "container"

#: The common ACP agents: the command in the agents image, the model's hosts (allowed by default), plain env.
#: A config entry names one with ``"preset": "claude"``; its own fields win over the preset's.
AGENT_PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "claude": {
            "name": "Claude Code (sandboxed)",
            "description": "Claude Code over ACP (@zed-industries/claude-code-acp), in your sandbox session.",
            "command": ["claude-code-acp"],
            "model_hosts": ["api.anthropic.com"],
            "env": {
                # claude-code refuses to run as root unless told it is in a sandbox (it is)
                "IS_SANDBOX": "1",
                "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
            },
        },
        "codex": {
            "name": "Codex (sandboxed)",
            "description": "OpenAI Codex over ACP (@zed-industries/codex-acp), in your sandbox session.",
            "command": ["codex-acp"],
            "model_hosts": ["api.openai.com"],
            "env": {},
        },
    }
)

#: the fields of a SandboxAgents.personas entry ("preset" picks one of AGENT_PRESETS)
CONFIG_FIELDS = (
    "preset",
    "name",
    "command",
    "description",
    "avatar",
    "image",
    "isolation",
    "cpu",
    "memory_mb",
    "ttl_seconds",
    "egress_allow",
    "egress_deny",
    "model_hosts",
    "secrets",
    "env",
    "scope",
    "persistent",
    "copy_in",
    "mcp_servers",
)


class AgentSpecError(SandboxRequestError):
    """A coding agent's persona is configured wrong; ``field`` names the setting (``SandboxAgents.personas[
    'claude'].cpu``)."""


def _strings(value: Any, where: str, *, empty: bool = True) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise AgentSpecError(f"{where}: a list of strings, not {type(value).__name__}", field=where)
    items = tuple(value)
    for item in items:
        if not isinstance(item, str) or not item or "\x00" in item:
            raise AgentSpecError(f"{where}: every entry is a non-empty string, not {item!r}", field=where)
    if not empty and not items:
        raise AgentSpecError(f"{where}: empty; name at least one", field=where)
    return items


@dataclass(frozen=True)
class AgentPersonaSpec:
    """One sandboxed coding agent (an ACP agent command run in the chatting user's sandbox session).

    ``egress_allow`` None: the model's hosts (``model_hosts``, the preset's) and the package registries the
    operator lists (``SandboxAgents.registries``); the agent reaches nothing else. ``secrets`` name entries of
    ``SandboxPolicy.secrets`` (the model's key): each is granted to the consumer ``agent:<key>`` when the
    server starts, so the session holds a placeholder and the egress gateway puts the real value in requests to
    the secret's hosts only. ``env`` is plain environment (never a secret). ``scope``: ``chat`` (one session
    and agent per chat) or ``persona`` (one per persona and user, shared by that user's chats).
    ``persistent``: the workspace (and the agent's home in it) outlives the session. ``copy_in``: a contents
    folder, relative to the chat's folder, copied into the workspace when a session starts.
    """

    key: str
    name: str
    command: tuple[str, ...]
    description: str = ""
    avatar: str | None = None
    image: str | None = None
    isolation: str = MIN_ISOLATION
    cpu: float | None = None
    memory_mb: int | None = None
    ttl_seconds: float | None = None
    egress_allow: tuple[str, ...] | None = None
    egress_deny: tuple[str, ...] = ()
    model_hosts: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    scope: Literal["chat", "persona"] = "chat"
    persistent: bool = False
    copy_in: str | None = None
    mcp_servers: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        key = self.key
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            raise AgentSpecError(
                f"SandboxAgents.personas key {key!r}: lowercase letters, digits and '-', at most 32, starting "
                "with a letter or digit (it names the consumer label agent:<key> and the persona's class)",
                field="key",
            )
        where = f"SandboxAgents.personas[{key!r}]"
        put = object.__setattr__
        if not isinstance(self.name, str) or not self.name.strip():
            raise AgentSpecError(
                f"{where}.name: the name shown in the chat, a non-empty string", field="name"
            )
        put(self, "command", _strings(self.command, f"{where}.command", empty=False))
        if not isinstance(self.description, str):
            raise AgentSpecError(f"{where}.description: a string", field="description")
        if self.avatar is not None:
            if not isinstance(self.avatar, str) or not os.path.isfile(self.avatar):
                raise AgentSpecError(
                    f"{where}.avatar: {self.avatar!r} is no file on the server (an svg, png or jpg path)",
                    field="avatar",
                )
            if not self.avatar.lower().endswith((".svg", ".png", ".jpg", ".jpeg")):
                raise AgentSpecError(f"{where}.avatar: an svg, png or jpg file", field="avatar")
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()):
            raise AgentSpecError(
                f"{where}.image: an image name, or unset for the agents image", field="image"
            )
        if self.isolation not in ISOLATION_ORDER or isolation_rank(self.isolation) < isolation_rank(
            MIN_ISOLATION
        ):
            raise AgentSpecError(
                f"{where}.isolation: {self.isolation!r}; a coding agent runs at least in a container "
                f"(container or vm): it runs the model's commands",
                field="isolation",
            )
        for name in ("cpu", "ttl_seconds"):
            value = getattr(self, name)
            if value is not None and not is_positive_number(value):
                raise AgentSpecError(f"{where}.{name}: a positive number, not {value!r}", field=name)
        memory = self.memory_mb
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0):
            raise AgentSpecError(
                f"{where}.memory_mb: a positive whole number of MiB, not {memory!r}", field="memory_mb"
            )
        allow = None if self.egress_allow is None else _strings(self.egress_allow, f"{where}.egress_allow")
        deny = _strings(self.egress_deny, f"{where}.egress_deny")
        hosts = _strings(self.model_hosts, f"{where}.model_hosts")
        for name, entries in (("egress_allow", allow), ("egress_deny", deny), ("model_hosts", hosts)):
            try:
                if name == "egress_deny":
                    EgressPolicy(allow=(), deny=entries or ())
                else:
                    EgressPolicy(allow=entries)
            except SandboxError as e:
                raise AgentSpecError(f"{where}.{name}: {e}", field=name) from None
        put(self, "egress_allow", allow)
        put(self, "egress_deny", deny)
        put(self, "model_hosts", hosts)
        put(self, "secrets", _strings(self.secrets, f"{where}.secrets"))
        if not isinstance(self.env, Mapping):
            raise AgentSpecError(f"{where}.env: an object of variable names to strings", field="env")
        for name, value in self.env.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise AgentSpecError(f"{where}.env: {name!r} is no environment variable name", field="env")
            if not isinstance(value, str) or "\x00" in value:
                raise AgentSpecError(f"{where}.env[{name!r}]: a string", field="env")
        put(self, "env", MappingProxyType(dict(self.env)))
        if self.scope not in SCOPES:
            raise AgentSpecError(
                f"{where}.scope: {self.scope!r}; 'chat' (one session per chat) or 'persona' (one per "
                "persona, shared by the user's chats)",
                field="scope",
            )
        if not isinstance(self.persistent, bool):
            raise AgentSpecError(f"{where}.persistent: true or false", field="persistent")
        if self.copy_in is not None:
            path = self.copy_in
            normal = posixpath.normpath(path) if isinstance(path, str) and path else ""
            if not normal or normal.startswith(("/", "..")) or "\x00" in normal:
                raise AgentSpecError(
                    f"{where}.copy_in: {path!r}; a contents folder relative to the chat's folder, inside it",
                    field="copy_in",
                )
            put(self, "copy_in", normal)
        servers = self.mcp_servers
        if isinstance(servers, (str, bytes, Mapping)) or not isinstance(servers, Sequence):
            raise AgentSpecError(f"{where}.mcp_servers: a list of MCP server objects", field="mcp_servers")
        for server in servers:
            if not isinstance(server, Mapping) or not isinstance(server.get("name"), str):
                raise AgentSpecError(
                    f"{where}.mcp_servers: each entry is an MCP server object with a name "
                    '({"name", "command", "args", "env"} or {"type": "http", "name", "url", "headers"})',
                    field="mcp_servers",
                )
        put(self, "mcp_servers", tuple(MappingProxyType(dict(s)) for s in servers))

    # ------------------------------------------------------------- derived

    @property
    def consumer(self) -> str:
        """The consumer label of the agent's sessions (``agent:<key>``)."""
        return agent_label(self.key)

    @property
    def class_name(self) -> str:
        """The persona's class name, ``Sandboxed<Key>Persona`` (``my-agent`` -> ``SandboxedMyAgentPersona``)."""
        return "Sandboxed" + "".join(part.capitalize() for part in self.key.split("-")) + "Persona"

    def allow_list(self, registries: Sequence[str] = ()) -> tuple[str, ...]:
        """The agent's egress allow-list: ``egress_allow`` as given, else the model's hosts and ``registries``."""
        if self.egress_allow is not None:
            return self.egress_allow
        return tuple(dict.fromkeys([*self.model_hosts, *registries]))

    # ------------------------------------------------------------- config

    @classmethod
    def from_config(cls, key: str, entry: Any) -> AgentPersonaSpec:
        """The spec of ``SandboxAgents.personas[key]``: the preset it names, overlaid with its own fields
        (``env`` merged, the entry's values winning)."""
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            cls(key=key, name="-", command=("-",))  # the key's own error
        where = f"SandboxAgents.personas[{key!r}]"
        if not isinstance(entry, Mapping):
            raise AgentSpecError(f"{where}: an object of persona settings", field="personas")
        unknown = sorted(str(k) for k in entry if k not in CONFIG_FIELDS)
        if unknown:
            raise AgentSpecError(
                f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(CONFIG_FIELDS)}",
                field=unknown[0],
            )
        values: dict[str, Any] = {}
        preset_name = entry.get("preset")
        if preset_name is not None:
            preset = AGENT_PRESETS.get(preset_name) if isinstance(preset_name, str) else None
            if preset is None:
                raise AgentSpecError(
                    f"{where}.preset: {preset_name!r} is no preset; known: {', '.join(AGENT_PRESETS)}",
                    field="preset",
                )
            values.update({k: v for k, v in preset.items()})
        for name, value in entry.items():
            if name == "preset":
                continue
            if name == "env" and isinstance(value, Mapping) and isinstance(values.get("env"), Mapping):
                value = {**values["env"], **value}
            values[name] = value
        for required in ("name", "command"):
            if required not in values:
                raise AgentSpecError(
                    f"{where}.{required}: required (or name a preset: {', '.join(AGENT_PRESETS)})",
                    field=required,
                )
        for name in ("command", "egress_allow", "egress_deny", "model_hosts", "secrets", "mcp_servers"):
            value = values.get(name)
            if isinstance(value, list):
                values[name] = tuple(value)
        for name in ("cpu", "ttl_seconds"):
            value = values.get(name)
            if is_positive_number(value) and not isinstance(value, float):
                values[name] = float(value)
        if isinstance(values.get("ttl_seconds"), float) and not math.isfinite(values["ttl_seconds"]):
            raise AgentSpecError(f"{where}.ttl_seconds: a finite number of seconds", field="ttl_seconds")
        return cls(key=key, **values)


__all__ = ["AGENT_PRESETS", "CONFIG_FIELDS", "KEY_PATTERN", "SCOPES", "AgentPersonaSpec", "AgentSpecError"]
