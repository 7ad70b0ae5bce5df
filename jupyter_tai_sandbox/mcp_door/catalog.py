"""The MCP door's tools: session tools, the code tools of the registry, and authoring.

Plain classes, no MCP types here: :class:`DoorTools` lists tool descriptions
(name, description, JSON Schema) and runs a call for a :class:`DoorRequest`
(who asks, and what the server's Authorizer grants them). Every rule is the
REST door's:

* session tools go through :class:`~jupyter_tai_sandbox.sessions.SessionRegistry`
  with the caller (owners, 404 for another user's session, bound consumer, quota);
* ``sandbox_exec``, ``sandbox_status`` and every preset run through
  :meth:`ToolRegistry.run <jupyter_tai_sandbox.tools.ToolRegistry.run>` (the fence);
* ``preset_put`` / ``preset_remove`` go through ``ToolRegistry.author`` / ``remove``;
* each tool needs its REST action on ``jupyter_tai_sandbox:sessions``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_server.utils import url_path_join

from ..contract import EgressPolicy, ExecRequest, SandboxRequestError, SandboxUnavailableError, SessionSpec
from ..errors import SandboxForbiddenError
from ..gate import GatedSession
from ..policy import SCRUBBED
from ..previews.listening import listening_ports
from ..previews.urls import port_path
from ..sessions import AUTH_RESOURCE, Caller
from ..tools import BASE_TOOLS, Decided, Preset, validate_input
from ..transcripts import notebook_filename, session_notebook
from .tool_specs import AUTHORING_TOOLS, DOOR_TOOLS, SESSION_TOOLS, ToolSpec


class DoorHost(Protocol):
    """What the tools use of the door (SandboxMCP), named without importing it."""

    app: Any
    max_output_bytes: int

    def tools_changed(self) -> None: ...

    def warn_once(self, message: str) -> None: ...


DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class DoorRequest:
    """Who an MCP request acts for: the principal, and its actions on the sessions resource."""

    caller: Caller
    session_actions: frozenset[str] = frozenset({"read", "write", "execute"})

    def require(self, action: str, what: str) -> None:
        if action not in self.session_actions:
            raise SandboxForbiddenError(
                f"not allowed to {what}: needs {action!r} on {AUTH_RESOURCE}, which this server's "
                "authorizer does not grant you"
            )

    def principal(self) -> Decided:
        """The caller at the tool chokepoints: its admin actions decide the fence."""
        caller = self.caller
        return Decided(
            name=f"user {caller.name!r}", door="mcp", allowed=caller.admin_actions, owner=caller.name
        )


# ------------------------------------------------------------------ output


def client_schema(schema: Any) -> Any:
    """``schema`` as every major MCP client accepts it: no ``type`` list, no null in an ``enum``.

    An optional field's ``["string", "null"]`` becomes ``"string"`` (leave the field out instead of sending
    null; the door still reads a null as absent); two or more types become an ``anyOf``.
    """
    if isinstance(schema, list):
        return [client_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: client_schema(value) for key, value in schema.items()}
    kinds = out.get("type")
    if isinstance(kinds, list):
        kinds = [kind for kind in kinds if kind != "null"] or ["null"]
        if len(kinds) == 1:
            out["type"] = kinds[0]
        else:
            del out["type"]
            one_of_the_types = [{"type": kind} for kind in kinds]
            if "anyOf" in out:
                out["allOf"] = [*out.get("allOf", []), {"anyOf": one_of_the_types}]
            else:
                out["anyOf"] = one_of_the_types
    enum = out.get("enum")
    if isinstance(enum, list) and None in enum and len(enum) > 1:
        out["enum"] = [value for value in enum if value is not None]
    return out


def clip(data: bytes, limit: int) -> tuple[str, bool]:
    """``data`` as text, cut in the middle (with a marker) past ``limit`` bytes."""
    if not limit or len(data) <= limit:
        return data.decode(errors="replace"), False
    head, tail = data[: limit // 2], data[len(data) - (limit - limit // 2) :]
    marker = f"\n[... {len(data) - limit} bytes truncated (SandboxMCP.max_output_bytes) ...]\n"
    return head.decode(errors="replace") + marker + tail.decode(errors="replace"), True


def session_id_of(arguments: Any) -> str | None:
    value = arguments.get("session_id") if isinstance(arguments, Mapping) else None
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------- tools


class DoorTools:
    """List and run the door's tools for one request (the rules live in the registries)."""

    def __init__(self, door: DoorHost) -> None:
        self.door = door

    @property
    def app(self) -> Any:
        return self.door.app

    # --- listing

    def registry_tools(self, viewer: Decided | None = None) -> list[ToolSpec]:
        """``sandbox_exec``, ``sandbox_status`` and every preset ``viewer`` sees (the shared ones, and its
        own private ones), with their declared schemas."""
        out = []
        for base in BASE_TOOLS.values():
            out.append(
                ToolSpec(
                    base.name,
                    _fenced_note(base.description, base.fenced),
                    base.input_schema,
                    action="execute",
                )
            )
        for name, preset in sorted(self.app.tools.presets(viewer).items()):
            if name in DOOR_TOOLS:
                self.door.warn_once(
                    f"preset {name!r} has the name of an MCP door tool: it is not listed over MCP"
                )
                continue
            fenced = bool(BASE_TOOLS.get(preset.base) and BASE_TOOLS[preset.base].fenced)
            out.append(
                ToolSpec(name, _fenced_note(preset.description, fenced), preset.schema(), action="execute")
            )
        return out

    def list_tools(self, viewer: Decided | None = None) -> list[ToolSpec]:
        return [*SESSION_TOOLS, *self.registry_tools(viewer), *AUTHORING_TOOLS]

    # --- calling

    async def call(self, request: DoorRequest, name: str, arguments: Any) -> dict[str, Any]:
        """Run one tool call; SandboxError subclasses for every refusal (mapped by the caller)."""
        spec = DOOR_TOOLS.get(name)
        if spec is None:
            request.require("execute", f"run the tool {name!r}")
            self.app.touch()
            return await self._run_registry_tool(request, name, arguments)
        request.require(spec.action, f"use {name}")
        data = validate_input(spec.input_schema, arguments)
        self.app.touch()
        method = getattr(self, "_" + name)
        return await method(request, data)

    async def _run_registry_tool(self, request: DoorRequest, name: str, arguments: Any) -> dict[str, Any]:
        result = await self.app.tools.run(name, arguments, principal=request.principal())
        limit = self.door.max_output_bytes
        if isinstance(result, dict) and isinstance(result.get("stdout"), str):
            result = dict(result)
            for stream in ("stdout", "stderr"):
                raw = result.get(stream, "").encode(errors="surrogatepass")
                result[stream], cut = clip(raw, limit)
                result[f"{stream}_bytes"] = len(raw)
                result[f"{stream}_truncated"] = cut
        return result

    # session tools ------------------------------------------------------

    async def _session(self, request: DoorRequest, data: Mapping[str, Any], *, manage: bool) -> Any:
        return await self.app.registry.get(data["session_id"], request.caller, manage=manage)

    async def _session_create(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        registry = self.app.registry
        spec = SessionSpec.from_json(data, request=True)
        session = await registry.create(spec, request.caller)
        return dict((await session.info()).to_json())

    def _exec_request(self, data: Mapping[str, Any], *, interactive: bool) -> ExecRequest:
        """The request as the agent gave it; the gated session applies the ceiling, the output limit
        and the scrub. Without ``timeout_seconds``: DEFAULT_TIMEOUT, or the ceiling when lower."""
        body: dict[str, Any] = {k: data[k] for k in ("argv", "env", "cwd") if k in data}
        if "script" in data:
            body["argv"] = ["sh", "-c", data["script"]]
        timeout = data.get("timeout_seconds")
        if timeout is None:
            ceiling = self.app.policy.max_timeout_seconds
            timeout = min(DEFAULT_TIMEOUT, ceiling) if ceiling else DEFAULT_TIMEOUT
        body["timeout_seconds"] = timeout
        request = ExecRequest.from_json(body, interactive=interactive)
        if not interactive and data.get("stdin") is not None:
            request = dataclasses.replace(request, stdin=data["stdin"].encode(errors="surrogatepass"))
        return request

    async def _session_exec(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        exec_request = self._exec_request(data, interactive=False)
        session = await self._session(request, data, manage=True)
        result = await session.run(
            exec_request
        )  # a GatedExecResult: scrubbed, with the command's byte counts
        self.app.touch()
        answer: dict[str, Any] = {"session_id": session.id, "exit_code": result.exit_code}
        if result.reason is not None:
            answer["reason"] = result.reason  # "killed: out of memory (the session's limit is N MiB)"
        for stream in ("stdout", "stderr"):
            answer[stream], answer[f"{stream}_truncated"] = clip(
                getattr(result, stream), self.door.max_output_bytes
            )
            answer[f"{stream}_bytes"] = getattr(result, f"{stream}_bytes")
        answer["truncated"] = answer["stdout_truncated"] or answer["stderr_truncated"]
        return answer

    async def _session_exec_start(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        exec_request = self._exec_request(data, interactive=True)
        session = await self._session(request, data, manage=True)
        # the server's one live-command registry: the websocket's commands share its caps and policy
        execs = self.app.execs
        with execs.reserve(
            request.caller.name, session.id
        ):  # the slot is held from here, before the first await
            ticket = execs.ticket(request.caller.name, session.id, exec_request, "mcp")
            handle = await session.start(ticket.labelled(exec_request))
            try:
                if data.get("stdin") is not None:
                    await handle.write(data["stdin"].encode(errors="surrogatepass"))
                await handle.close_stdin()
            except BaseException:
                await handle.kill()
                raise
            command = execs.add(handle, ticket)
        return {
            "handle": command.id,
            "session_id": session.id,
            "timeout_seconds": exec_request.timeout_seconds,
            "deadline": command.deadline,
            "next": "session_exec_poll with this handle and offset 0",
        }

    async def _session_exec_poll(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        command = await self.app.execs.find(data["handle"], request.caller)
        self.app.touch()
        return await command.poll(data["offset"], float(data["wait_seconds"]), data["max_bytes"])

    async def _session_exec_kill(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        command = await self.app.execs.find(data["handle"], request.caller)
        await command.kill({"error": "CommandKilled", "message": f"killed by {request.caller.name!r}"})
        return {
            "handle": command.id,
            "session_id": command.session_id,
            "running": command.running,
            "exit_code": command.exit_code,
        }

    async def _session_read_file(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(request, data, manage=False)
        limit = data["max_bytes"]
        values = _injected(self.app.policy)
        # with the scrub on, read a value's length past the cut, so a value crossing it is replaced whole
        want = limit + (max(len(v) for v in values) - 1 if values else 0)
        chunks, size = [], 0
        async for chunk in session.iter_file(data["path"], min(want, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
            if size > want:
                break
        raw = b"".join(chunks)
        truncated = len(raw) > limit
        content = _scrub_prefix(raw, limit, values) if values else raw[:limit]
        text = (
            base64.b64encode(content).decode()
            if data["encoding"] == "base64"
            else content.decode(errors="replace")
        )
        return {
            "session_id": session.id,
            "path": data["path"],
            "encoding": data["encoding"],
            "content": text,
            "bytes": len(content),
            "truncated": truncated,
        }

    async def _session_write_file(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        if data["encoding"] == "base64":
            try:
                content = base64.b64decode(data["content"], validate=True)
            except (binascii.Error, ValueError):
                raise SandboxRequestError("content: not valid base64", field="content") from None
        else:
            content = data["content"].encode(errors="surrogatepass")
        session = await self._session(request, data, manage=True)
        await session.put_file(data["path"], content)
        return {"session_id": session.id, "path": data["path"], "size": len(content)}

    async def _session_list_files(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(request, data, manage=False)
        return {
            "session_id": session.id,
            "path": data["path"],
            "entries": await session.list_files(data["path"]),
        }

    async def _session_destroy(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(request, data, manage=True)
        await self.app.execs.kill_session(session.id)
        await self.app.registry.destroy(session, remove_workspace=data["remove_workspace"])
        return {"session_id": session.id, "destroyed": True}

    async def _session_pause(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(request, data, manage=True)
        return dict((await session.pause()).to_json())

    async def _session_resume(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(request, data, manage=True)
        return dict((await session.resume()).to_json())

    async def _session_fork(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        source = await self._session(request, data, manage=True)
        fork = await self.app.registry.fork(source, request.caller)
        return dict((await fork.info()).to_json())

    async def _session_set_egress(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        policy = EgressPolicy.from_json(
            {"allow": data.get("allow"), "deny": data.get("deny") or []}, secrets=False
        )
        session = await self._session(request, data, manage=True)
        if not isinstance(session, GatedSession):  # pragma: no cover - the registry hands out gated sessions
            raise SandboxUnavailableError("the session is not behind the policy gate")
        info = await session.change_egress(allow=policy.allow, deny=policy.deny)
        return dict(info.to_json())

    async def _session_port_url(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session = await self._session(request, data, manage=False)
        port = data["port"]
        listening = {p.port: p for p in await listening_ports(session)}
        path = port_path(session.id, port, data["path"], absolute=data["absolute"])
        found = listening.get(port)
        return {
            "session_id": session.id,
            "port": port,
            "url": url_path_join(self.app.serverapp.base_url, path),
            "listening": found is not None,
            "address": None if found is None else found.address,
        }

    async def _session_transcript(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        session_id = data["session_id"]
        notebook = await session_notebook(
            self.app, request.caller, session_id, lambda: self._session(request, data, manage=False)
        )
        meta = notebook["metadata"]["jupyter_tai_sandbox"]
        return {
            "session_id": meta["session"],
            "filename": notebook_filename(meta["session"]),
            "commands": meta["commands"],
            "truncated": meta["truncated"],
            "notebook": notebook,
        }

    async def _session_status(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        if "session_id" in data:
            session = await self._session(request, data, manage=False)
            return dict((await session.info()).to_json())
        infos = await self.app.registry.list(request.caller)
        return {
            "provider": self.app.access.status_info(show_credentials=request.caller.sees_all),
            "sessions": [info.to_json() for info in infos],
        }

    # authoring ------------------------------------------------------------

    async def _preset_put(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        tools = self.app.tools
        preset: Preset = await asyncio.to_thread(
            tools.author,
            data["definition"],
            principal=request.principal(),
            name=data["name"],
            replace=data["replace"],
        )
        self.door.tools_changed()
        return preset.to_json()

    async def _preset_remove(self, request: DoorRequest, data: dict[str, Any]) -> dict[str, Any]:
        await asyncio.to_thread(self.app.tools.remove, data["name"], principal=request.principal())
        self.door.tools_changed()
        return {"name": data["name"], "removed": True}


def _fenced_note(description: str, fenced: bool) -> str:
    return f"{description} (admin tier: running it needs the server's admin grant)" if fenced else description


def _injected(policy: Any) -> list[bytes]:
    """The injected values the scrub replaces (longest first), or none when the scrub is off."""
    if not policy.scrub_transcript:
        return []
    return sorted({v.encode() for v in policy.injected_values() if v}, key=len, reverse=True)


def _scrub_prefix(raw: bytes, limit: int, values: list[bytes]) -> bytes:
    """The scrubbed form of ``raw[:limit]``; a value that starts before the cut is replaced whole.

    ``raw`` holds up to a value's length past ``limit``, so no part of a value crossing the cut is answered.
    """
    pattern = re.compile(b"|".join(re.escape(v) for v in values))
    out, position = bytearray(), 0
    for match in pattern.finditer(raw):
        if match.start() >= limit:
            break
        out += raw[position : match.start()] + SCRUBBED.encode()
        position = match.end()
    if position < limit:
        out += raw[position:limit]
    return bytes(out)


def scrub_result(policy: Any, value: Any) -> Any:
    """Every string of a tool answer (names in a listing, messages, info) with injected values replaced.

    The one exit of the door's answers, so no tool result carries an injected value when the scrub
    is on, whatever the tool (the tools scrub exact bytes first where counts matter).
    """
    if not policy.scrub_transcript:
        return value
    if isinstance(value, str):
        return policy.scrub(value)
    if isinstance(value, dict):
        return {
            policy.scrub(k) if isinstance(k, str) else k: scrub_result(policy, v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [scrub_result(policy, v) for v in value]
    return value
