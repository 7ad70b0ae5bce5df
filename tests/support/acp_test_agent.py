"""The tests' minimal ACP agent: the ``acp`` package's agent side (``acp.run_agent``) over stdio, scripted.

Run it as ``python3 acp_test_agent.py [SCRIPT_FILE]``; the script is the JSON in that file, else in the
environment variable ``ACP_TEST_AGENT_SCRIPT``, else ``{}`` (every prompt echoed back). It needs the
``acp`` package (agent-client-protocol) and pydantic, and nothing of this repository.

Script format::

    {"turns": [[STEP, ...], [STEP, ...], ...]}

Prompt number N of a session (0-based) runs ``turns[N]`` (past the end: the last turn; no turns: ``echo``).
Each STEP is an object with ``"do"`` and its fields; most report one line of JSON as an agent message
chunk (``{"step": ..., ...}`` followed by a newline), so a test joins the chunks and reads a JSON line per
step. A failed client call reports ``{"step": ..., "error": {"code", "message", "data"}}``.

- ``{"do": "reply", "text": "..."}``: the text as an agent message chunk, as is (no JSON).
- ``{"do": "echo"}``: ``{"step": "echo", "text": <the prompt's text>, "resources": [{"uri", "name"}]}``.
- ``{"do": "info"}``: ``{"step": "info", "cwd", "mcp_servers": [names], "fs": bool, "terminal": bool}``
  (the session's ``cwd`` and MCP servers as session/new gave them, the client's capabilities).
- ``{"do": "read", "path": P, "line"?: N, "limit"?: N}``: fs/read_text_file -> ``{"content": ...}``.
- ``{"do": "write", "path": P, "content": C}``: fs/write_text_file -> ``{"ok": true}``.
- ``{"do": "terminal", "command": C, "args"?: [...], "cwd"?: D, "env"?: {K: V}, "output_byte_limit"?: N,
  "kill_after"?: S, "release"?: true}``: terminal/create; after ``kill_after`` seconds terminal/kill
  (without it: terminal/wait_for_exit); then terminal/output; then terminal/release unless ``release`` is
  false -> ``{"terminal_id", "output", "truncated", "exit_code", "signal"}``.
- ``{"do": "permission", "title": T, "options"?: [{"option_id", "name", "kind"}], "on_allow"?: [STEP],
  "on_reject"?: [STEP]}``: a tool call (pending) then session/request_permission ->
  ``{"outcome": "selected"|"cancelled", "option_id"}``; then ``on_allow`` when the chosen option's kind is
  ``allow_*``, else ``on_reject``. Default options: allow_once ``allow`` and reject_once ``reject``.
- ``{"do": "sleep", "seconds": S}``: a long step; a session/cancel ends it at once and the prompt returns
  stop_reason ``cancelled`` (reports ``{"step": "sleep", "cancelled": bool}``).
- ``{"do": "stderr", "text": T}``: writes T to stderr (not the ACP stream).
- ``{"do": "exit", "code"?: N}``: ends the agent at once (``os._exit``), mid-prompt, answering nothing.

Between steps a cancelled prompt stops too (stop_reason ``cancelled``); otherwise ``end_turn``.

To run it in a session whose image has Python 3.11 but not these packages (the project's Python image),
put :func:`bundle` there as a tar, unpack it to a folder, and start the agent with that folder as
``PYTHONPATH``: ``python3 FOLDER/acp_test_agent.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, run_agent, text_block, update_agent_message
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    EnvVariable,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallStart,
    ToolCallUpdate,
)

#: what the agent imports, beyond the standard library
PACKAGES = ("acp", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions")


def bundle() -> bytes:
    """A tar of this file and :data:`PACKAGES` as installed here (no caches), for a session without them."""
    import importlib
    import io
    import tarfile
    from pathlib import Path

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in PACKAGES:
            path = Path(importlib.import_module(name).__file__ or "")
            source = path.parent if path.name == "__init__.py" else path
            tar.add(source, arcname=source.name, filter=lambda t: None if "__pycache__" in t.name else t)
        tar.add(__file__, arcname="acp_test_agent.py")
    return out.getvalue()


def load_script() -> dict[str, Any]:
    if len(sys.argv) > 1:
        with open(sys.argv[1], encoding="utf-8") as f:
            return json.load(f)
    return json.loads(os.environ.get("ACP_TEST_AGENT_SCRIPT") or "{}")


class _Cancelled(Exception):
    pass


class ScriptedAgent:
    def __init__(self, script: dict[str, Any]) -> None:
        self.turns: list[list[dict[str, Any]]] = script.get("turns") or [[{"do": "echo"}]]
        self.conn: Any = None
        self.client_capabilities: Any = None
        self.sessions: dict[str, dict[str, Any]] = {}

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    # ------------------------------------------------------------ the agent side

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, **kwargs: Any) -> Any:
        self.client_capabilities = client_capabilities
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=True),
            agent_info=Implementation(name="acp-test-agent", title="ACP test agent", version="0"),
        )

    def _open(self, session_id: str, cwd: str, mcp_servers: Any) -> None:
        names = [getattr(s, "name", None) for s in (mcp_servers or [])]
        state = self.sessions.setdefault(session_id, {"prompts": 0})
        state.update(cwd=cwd, mcp_servers=names, cancel=asyncio.Event())

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> Any:
        session_id = uuid.uuid4().hex
        self._open(session_id, cwd, mcp_servers)
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any) -> Any:
        self._open(session_id, cwd, mcp_servers)
        return LoadSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        if session_id in self.sessions:
            self.sessions[session_id]["cancel"].set()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> Any:
        state = self.sessions[session_id]
        state["cancel"] = asyncio.Event()
        turn = self.turns[min(state["prompts"], len(self.turns) - 1)]
        state["prompts"] += 1
        try:
            await self._run(session_id, turn, prompt)
        except _Cancelled:
            return PromptResponse(stop_reason="cancelled")
        return PromptResponse(stop_reason="end_turn")

    # ------------------------------------------------------------ the steps

    async def _say(self, session_id: str, text: str) -> None:
        await self.conn.session_update(session_id=session_id, update=update_agent_message(text_block(text)))

    async def _report(self, session_id: str, step: str, **fields: Any) -> None:
        await self._say(session_id, json.dumps({"step": step, **fields}) + "\n")

    async def _run(self, session_id: str, steps: list[dict[str, Any]], prompt: list[Any]) -> None:
        state = self.sessions[session_id]
        for step in steps:
            if state["cancel"].is_set():
                raise _Cancelled
            do = step["do"]
            try:
                await self._step(session_id, do, step, prompt)
            except RequestError as e:
                error = {"code": e.code, "message": str(e), "data": e.data}
                await self._report(session_id, do, error=error)

    async def _step(self, session_id: str, do: str, step: dict[str, Any], prompt: list[Any]) -> None:
        conn, state = self.conn, self.sessions[session_id]
        if do == "reply":
            await self._say(session_id, step["text"])
        elif do == "echo":
            text = "".join(getattr(b, "text", "") for b in prompt if getattr(b, "type", "") == "text")
            resources = [
                {"uri": b.uri, "name": b.name} for b in prompt if getattr(b, "type", "") == "resource_link"
            ]
            await self._report(session_id, "echo", text=text, resources=resources)
        elif do == "info":
            caps = self.client_capabilities
            await self._report(
                session_id,
                "info",
                cwd=state["cwd"],
                mcp_servers=state["mcp_servers"],
                fs=bool(caps and caps.fs and caps.fs.read_text_file and caps.fs.write_text_file),
                terminal=bool(caps and caps.terminal),
            )
        elif do == "read":
            got = await conn.read_text_file(
                session_id=session_id, path=step["path"], line=step.get("line"), limit=step.get("limit")
            )
            await self._report(session_id, "read", content=got.content)
        elif do == "write":
            await conn.write_text_file(session_id=session_id, path=step["path"], content=step["content"])
            await self._report(session_id, "write", ok=True)
        elif do == "terminal":
            await self._terminal(session_id, step)
        elif do == "permission":
            await self._permission(session_id, step, prompt)
        elif do == "sleep":
            try:
                await asyncio.wait_for(state["cancel"].wait(), step["seconds"])
            except TimeoutError:
                await self._report(session_id, "sleep", cancelled=False)
            else:
                raise _Cancelled
        elif do == "stderr":
            sys.stderr.write(step["text"])
            sys.stderr.flush()
        elif do == "exit":
            os._exit(step.get("code", 1))
        else:
            raise ValueError(f"unknown step {do!r}")

    async def _terminal(self, session_id: str, step: dict[str, Any]) -> None:
        conn = self.conn
        env = [EnvVariable(name=k, value=v) for k, v in (step.get("env") or {}).items()]
        created = await conn.create_terminal(
            session_id=session_id,
            command=step["command"],
            args=step.get("args"),
            cwd=step.get("cwd"),
            env=env or None,
            output_byte_limit=step.get("output_byte_limit"),
        )
        tid = created.terminal_id
        if step.get("kill_after") is not None:
            await asyncio.sleep(step["kill_after"])
            await conn.kill_terminal(session_id=session_id, terminal_id=tid)
        else:
            await conn.wait_for_terminal_exit(session_id=session_id, terminal_id=tid)
        out = await conn.terminal_output(session_id=session_id, terminal_id=tid)
        if step.get("release", True):
            await conn.release_terminal(session_id=session_id, terminal_id=tid)
        status = out.exit_status
        await self._report(
            session_id,
            "terminal",
            terminal_id=tid,
            output=out.output,
            truncated=out.truncated,
            exit_code=status.exit_code if status else None,
            signal=status.signal if status else None,
        )

    async def _permission(self, session_id: str, step: dict[str, Any], prompt: list[Any]) -> None:
        tool_call_id = uuid.uuid4().hex
        title = step.get("title", "a scripted action")
        await self.conn.session_update(
            session_id=session_id,
            update=ToolCallStart(
                session_update="tool_call",
                tool_call_id=tool_call_id,
                title=title,
                kind="edit",
                status="pending",
            ),
        )
        options = [
            PermissionOption(**o)
            for o in step.get("options")
            or [
                {"option_id": "allow", "name": "Allow", "kind": "allow_once"},
                {"option_id": "reject", "name": "Reject", "kind": "reject_once"},
            ]
        ]
        answer = await self.conn.request_permission(
            session_id=session_id,
            tool_call=ToolCallUpdate(tool_call_id=tool_call_id, title=title, kind="edit", status="pending"),
            options=options,
        )
        outcome = answer.outcome
        chosen = outcome.option_id if isinstance(outcome, AllowedOutcome) else None
        await self._report(session_id, "permission", outcome=outcome.outcome, option_id=chosen)
        kind = next((o.kind for o in options if o.option_id == chosen), "")
        branch = step.get("on_allow") if kind.startswith("allow") else step.get("on_reject")
        if branch:
            await self._run(session_id, branch, prompt)


async def main() -> None:
    await run_agent(ScriptedAgent(load_script()))


if __name__ == "__main__":
    asyncio.run(main())
