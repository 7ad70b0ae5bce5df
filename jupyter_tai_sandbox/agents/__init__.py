"""Coding agents in a sandbox: jupyter-ai's ACP personas whose whole agent process runs in a session.

jupyter-ai 3 runs a coding agent (Claude Code, Codex, any Agent Client Protocol agent) as a persona of its
chat: a subprocess of the Jupyter server, with the server's privileges, whose file reads, writes and
terminals the ACP client serves on the server. Here the same persona runs the agent in a sandbox session of
the chatting user instead, and serves the agent's calls in that session.

**The spec** (:mod:`.spec`, :mod:`.settings`): the operator declares each agent in
``c.SandboxAgents.personas`` (or a plugin author as ``SandboxedAcpPersona.agent``): its command, image,
limits, network (the model's hosts and the listed package registries, nothing else by default), which of
``SandboxPolicy.secrets`` it gets (the model key stays at the egress gateway; the session holds a
placeholder) and its scope. Its sessions carry the consumer label ``agent:<key>``.

**The runtime** (:mod:`.runtime`): one per agent process. It creates the session through the server's
:class:`~jupyter_tai_sandbox.sessions.SessionRegistry` with the chatting user as owner (the panel lists it as
theirs; quotas and TTL apply), starts the agent command in it under the label ``acp:<key>``, or, after a
server restart, finds the session and attaches to the command still running there. The agent exiting on
its own is reported to the chat, and the session is destroyed (a persistent workspace is kept).

**The transport and client** (:mod:`.transport`, :mod:`.acp_client`, :mod:`.terminals`): the ACP stream
(JSON-RPC over stdio) is carried over the session's interactive exec, shaped like an
``asyncio.subprocess.Process``; ``fs/*`` calls are served by the session's file operations inside its
workspace and ``terminal/*`` by commands of the session; no Jupyter MCP server is handed to the agent.

**The persona** (:mod:`.persona`, :mod:`.persona_manager`): :class:`SandboxedAcpPersona` subclasses
jupyter-ai's ``BaseAcpPersona`` and replaces what it does on the host (spawning, killing by process group,
the chat folder as working tree). One class per configured persona is added to every chat by the persona
manager; ``scope`` ``chat`` gives each chat its own session and agent, ``persona`` one per user shared by
their chats. A persona serves one user: another user's message is refused in the chat. ``/sandbox status``,
``/sandbox copy-in PATH``, ``/sandbox copy-back [PATH]`` and ``/sandbox stop`` are answered by the persona
(:mod:`.handoff` moves files between the contents and the workspace), never sent to the agent.

Importing this package does not import jupyter-ai (the ``agents`` extra): :mod:`.persona` and
:mod:`.persona_manager` do.
"""

from __future__ import annotations

from .settings import SandboxAgents
from .spec import AGENT_PRESETS, AgentPersonaSpec, AgentSpecError

#: the pip extra that brings jupyter-ai's ACP client, persona manager, router and chat
EXTRA_HINT = 'pip install "jupyter-tai-sandbox[agents]"'

__all__ = ["AGENT_PRESETS", "EXTRA_HINT", "AgentPersonaSpec", "AgentSpecError", "SandboxAgents"]
