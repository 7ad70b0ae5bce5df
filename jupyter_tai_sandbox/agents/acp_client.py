"""The ACP client of a sandboxed agent: jupyter-ai's, with everything the agent asks for served in its session.

:class:`SandboxAcpClient` is jupyter-ai's ``JaiAcpClient`` (chat streaming, tool calls, permission prompts
through the chat, session load) with the capabilities that touched the server moved into the agent's
sandbox session:

- ``fs/read_text_file`` and ``fs/write_text_file`` go through the session's file calls (``get_file`` /
  ``put_file``); a path is resolved by the session (``resolve_path``), and one outside its workspace is
  refused with an ACP error naming the rule. ``line``/``limit`` work as jupyter-ai's (1-based line, a count
  of lines, universal newlines). Notebooks may be written: no Jupyter MCP server is offered to do it.
- terminals are commands of the session (:class:`~jupyter_tai_sandbox.agents.terminals.SessionTerminals`).
- MCP servers: only those the operator lists for the persona (none by default: jupyter-ai's own would hand
  the agent tools that run on the server).
- the agent's working directory (session/new, session/load) is the session's workspace, and the
  attachments of a prompt name files there (the chat's relative path under it), not under the server's root.

Nothing here reads or writes the server's filesystem.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from acp import RequestError
from acp.schema import (
    CreateTerminalResponse,
    EnvVariable,
    HttpMcpServer,
    KillTerminalResponse,
    LoadSessionResponse,
    McpServerStdio,
    NewSessionResponse,
    PromptResponse,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)
from jupyter_ai_acp_client.default_acp_client import JaiAcpClient

from ..contract import SandboxError, SandboxNotFoundError, SandboxPathError, SandboxSession
from .terminals import SessionTerminals
from .transport import AgentProcess

_LOG = logging.getLogger(__name__)

#: the largest file fs/read_text_file hands the agent (it travels in one JSON-RPC message)
DEFAULT_MAX_READ_BYTES = 16 << 20


@dataclass(frozen=True)
class _Attachment:
    """An attachment as jupyter-ai's prompt_and_reply reads one, its value already the workspace URI."""

    value: str
    type: str
    mimetype: str | None


def mcp_server_model(
    server: Mapping[str, Any] | McpServerStdio | HttpMcpServer,
) -> McpServerStdio | HttpMcpServer:
    """An operator's MCP server entry as the ACP model: ``{"name", "command", "args", "env"}`` (stdio, ``env``
    a mapping or ACP's ``[{"name", "value"}]``) or ``{"name", "url", "headers"}`` (http)."""
    if isinstance(server, (McpServerStdio, HttpMcpServer)):
        return server
    entry = dict(server)
    if "url" in entry:
        headers = entry.get("headers") or []
        if isinstance(headers, Mapping):
            headers = [{"name": k, "value": v} for k, v in headers.items()]
        return HttpMcpServer.model_validate({**entry, "type": "http", "headers": headers})
    env = entry.get("env") or []
    if isinstance(env, Mapping):
        env = [{"name": k, "value": v} for k, v in env.items()]
    return McpServerStdio.model_validate({"args": [], **entry, "env": env})


class SandboxAcpClient(JaiAcpClient):
    """jupyter-ai's ACP client with files, terminals and attachments in the agent's session (see the module).

    ``workspace`` is the session's workspace as its commands see it (the agent's cwd);
    ``timeout_seconds`` bounds each terminal's command; ``mcp_servers`` are the operator's entries
    (:func:`mcp_server_model`), offered to the agent on session/new and session/load.
    """

    def __init__(
        self,
        *args: Any,
        agent_subprocess: AgentProcess,
        event_loop: asyncio.AbstractEventLoop,
        session: SandboxSession,
        workspace: str,
        timeout_seconds: float,
        mcp_servers: Sequence[Mapping[str, Any] | McpServerStdio | HttpMcpServer] | None = None,
        max_terminals: int = 16,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        **kwargs: Any,
    ) -> None:
        self.session = session
        self.workspace = posixpath.normpath(workspace)
        self.max_read_bytes = max_read_bytes
        self._operator_mcp_servers = [mcp_server_model(s) for s in (mcp_servers or ())]
        super().__init__(*args, agent_subprocess=agent_subprocess, event_loop=event_loop, **kwargs)
        self.terminals = SessionTerminals(
            session, cwd=self.workspace, timeout_seconds=timeout_seconds, max_terminals=max_terminals
        )
        # jupyter-ai's end_session releases a session's terminals through this attribute: the session's
        # own terminals, so no host TerminalManager is left to run anything
        self._terminal_manager = self.terminals

    # ------------------------------------------------------------ MCP servers

    async def _get_mcp_servers(self, persona: Any) -> list[McpServerStdio | HttpMcpServer]:
        """Only the operator's servers (http ones only when the agent supports http)."""
        servers = list(self._operator_mcp_servers)
        if any(isinstance(s, HttpMcpServer) for s in servers):
            capabilities = await self.get_agent_capabilities()
            if not capabilities.mcp_capabilities.http:
                servers = [s for s in servers if not isinstance(s, HttpMcpServer)]
        return servers

    # ------------------------------------------------------------ ACP sessions

    async def create_session(self, persona: Any) -> NewSessionResponse:
        """session/new with the session's workspace as the agent's cwd (never the chat's folder on the
        server), for ``persona``."""
        conn = await self.get_connection()
        mcp_servers = await self._get_mcp_servers(persona)
        response: NewSessionResponse = await conn.new_session(cwd=self.workspace, mcp_servers=mcp_servers)
        self._personas_by_session[response.session_id] = persona
        return response

    async def _load_session_rpc(self, persona: Any, session_id: str) -> LoadSessionResponse:
        """session/load (jupyter-ai's load_session calls this once per id), with the workspace as cwd."""
        conn = await self.get_connection()
        mcp_servers = await self._get_mcp_servers(persona)
        response: LoadSessionResponse = await conn.load_session(
            cwd=self.workspace, session_id=session_id, mcp_servers=mcp_servers
        )
        self._personas_by_session[session_id] = persona
        return response

    # ------------------------------------------------------------ prompts

    def workspace_uri(self, relative: str) -> str | None:
        """``file://`` URI of a chat path under the workspace; None when it climbs out (lexical: no file is
        looked at, here or in the session)."""
        full = posixpath.normpath(posixpath.join(self.workspace, relative))
        if full != self.workspace and not full.startswith(self.workspace.rstrip("/") + "/"):
            return None
        return PurePosixPath(full).as_uri()

    async def prompt_and_reply(
        self,
        session_id: str,
        prompt: str,
        attachments: list[Any] | None = None,
        root_dir: str | None = None,
    ) -> PromptResponse:
        """jupyter-ai's, with each attachment's path taken under the session's workspace (``root_dir``, the
        server's root, is not used: its files are not the agent's)."""
        resolved: list[Any] | None = None
        if attachments:
            resolved = []
            for att in attachments:
                value = getattr(att, "value", "") or ""
                uri = self.workspace_uri(value) if value else None
                if uri is None and value:
                    _LOG.warning("attachment path %r leaves the session's workspace: passed as given", value)
                resolved.append(
                    _Attachment(uri or value, getattr(att, "type", "file"), getattr(att, "mimetype", None))
                )
        response: PromptResponse = await super().prompt_and_reply(
            session_id=session_id, prompt=prompt, attachments=resolved, root_dir=None
        )
        return response

    # ------------------------------------------------------------ files

    async def _session_path(self, path: str) -> str:
        if not path or not path.strip():
            raise RequestError.invalid_params({"path": "path cannot be empty"})
        try:
            return await self.session.resolve_path(path)
        except SandboxError as e:
            raise RequestError.invalid_params(
                {
                    "path": f"refused: the agent's files are its session's workspace ({self.workspace}) only: {e}"
                }
            ) from None

    async def read_text_file(
        self, path: str, session_id: str, limit: int | None = None, line: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        """fs/read_text_file from the session's workspace."""
        if line is not None and line < 1:
            raise RequestError.invalid_params({"line": "line must be >= 1 (1-indexed)"})
        if limit is not None and limit < 1:
            raise RequestError.invalid_params({"limit": "limit must be >= 1"})
        target = await self._session_path(path)
        data = bytearray()
        try:
            async for chunk in self.session.iter_file(target):
                data += chunk
                if len(data) > self.max_read_bytes:
                    raise RequestError.invalid_params(
                        {
                            "path": f"the file is larger than {self.max_read_bytes} bytes: read it in a terminal"
                        }
                    )
        except SandboxNotFoundError:
            raise RequestError.resource_not_found(path) from None
        except SandboxPathError as e:
            raise RequestError.invalid_params({"path": str(e)}) from None
        except SandboxError as e:
            raise RequestError.internal_error({"path": path, "error": str(e)}) from None
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError.invalid_params({"path": "not a UTF-8 text file"}) from None
        text = text.replace("\r\n", "\n").replace("\r", "\n")  # as Path.read_text's universal newlines
        lines = text.splitlines(keepends=True)
        start = (line - 1) if line is not None else 0
        lines = lines[start : start + limit] if limit is not None else lines[start:]
        return ReadTextFileResponse(content="".join(lines))

    async def write_text_file(
        self, content: str, path: str, session_id: str, **kwargs: Any
    ) -> WriteTextFileResponse | None:
        """fs/write_text_file into the session's workspace (parents made); notebooks included."""
        target = await self._session_path(path)
        try:
            await self.session.put_file(target, content.encode("utf-8"))
        except SandboxPathError as e:
            raise RequestError.invalid_params({"path": str(e)}) from None
        except SandboxError as e:
            raise RequestError.internal_error({"path": path, "error": str(e)}) from None
        return WriteTextFileResponse()

    # ------------------------------------------------------------ terminals

    async def create_terminal(
        self,
        command: str,
        session_id: str,
        args: list[str] | None = None,
        cwd: str | None = None,
        env: list[EnvVariable] | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> CreateTerminalResponse:
        return await self.terminals.create(session_id, command, args, cwd, env, output_byte_limit)

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> TerminalOutputResponse:
        return await self.terminals.output(session_id, terminal_id)

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        return await self.terminals.wait_for_exit(session_id, terminal_id)

    async def kill_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> KillTerminalResponse | None:
        return await self.terminals.kill(session_id, terminal_id)

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse | None:
        return await self.terminals.release(session_id, terminal_id)

    async def close(self) -> None:
        """Release (kill) every terminal of every ACP session: the agent's client is done."""
        await self.terminals.close()

    async def end_session(self, session_id: str) -> None:
        """jupyter-ai's cleanup, which releases (kills) the session's terminals in the sandbox session."""
        await super().end_session(session_id)
