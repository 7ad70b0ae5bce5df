"""The MCP server of the door: the SDK's low-level ``Server``, its Streamable HTTP session manager, audit.

The SDK's ``StreamableHTTPSessionManager`` is an ASGI app whose ``run()``
lifespan must be entered by the host before the first request and left at
shutdown, in one task (it holds an anyio task group). :class:`SandboxMCP` runs
it in a task of its own, started with the extension (or by the first request)
and stopped with it. Tornado reaches it through :mod:`.bridge`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from traitlets import Bool, Float, Integer, default
from traitlets.config import LoggingConfigurable

from .. import events as ev
from .._version import __version__
from ..contract import SandboxError
from ..errors import SandboxQuotaError, error_body, error_status
from .catalog import DoorRequest, DoorTools, ToolSpec, client_schema, scrub_result, session_id_of

#: where the bridge puts the request's DoorRequest in the ASGI scope
SCOPE_KEY = "jupyter_tai_sandbox.request"
_MAX_LISTENERS = 1000

INSTRUCTIONS = """Sandbox sessions on this Jupyter server. session_create gives a workspace; run commands
with session_exec (short) or session_exec_start + session_exec_poll (long); move files with
session_read_file / session_write_file; session_destroy when done. Code tools (sandbox_exec and the
operator's presets) run in a fresh session each; some need the server's admin grant."""


class _DoorServer(Server[Any]):
    """The low-level server, advertising tools.listChanged (the door notifies on preset changes)."""

    def create_initialization_options(
        self, notification_options=None, experimental_capabilities=None, extensions=None
    ):
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class _DoorSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with a ceiling per principal beside its server-wide ``max_sessions``.

    The SDK admits a new MCP session under its creation lock, in one step with no await
    (``_admit_session``), and keeps the principal that opened each one (``_session_owners``):
    counting there refuses concurrent ``initialize`` calls of one user exactly at the ceiling.
    """

    def __init__(self, *args: Any, max_sessions_per_user: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_sessions_per_user = max_sessions_per_user

    def sessions_of(self, requestor: Any) -> int:
        return sum(1 for owner in self._session_owners.values() if owner == requestor)

    def _admit_session(self, requestor: Any) -> Any:
        limit = self.max_sessions_per_user
        if limit and requestor is not None:
            held = self.sessions_of(requestor)
            if held >= limit:
                raise SandboxQuotaError(
                    f"you already hold {held} open MCP sessions, the most one user may hold "
                    f"(SandboxMCP.max_sessions_per_user = {limit}): end one (DELETE with its Mcp-Session-Id) "
                    f"or let one expire (SandboxMCP.session_idle_timeout_seconds = {self.session_idle_timeout or 0:g} s)"
                )
        return super()._admit_session(requestor)


class SandboxMCP(LoggingConfigurable):
    """The MCP door: Streamable HTTP at /api/sandbox/mcp on the Jupyter port, behind Jupyter's auth."""

    enabled = Bool(
        True,
        help="""Serve the MCP door at /api/sandbox/mcp (needs the `mcp` package: pip install
        'jupyter-tai-sandbox[mcp]'). It is behind the server's authentication and Authorizer like every
        sandbox route; False answers 503 there.""",
    ).tag(config=True)

    json_response = Bool(
        False,
        help="Answer each MCP POST with one JSON body instead of a Server-Sent Events stream.",
    ).tag(config=True)

    session_idle_timeout_seconds = Float(
        1800.0,
        help="Seconds an MCP session (Mcp-Session-Id) may stay idle before it is closed; the client re-initializes.",
    ).tag(config=True)

    max_sessions = Integer(
        1000, help="Most MCP sessions open at once; one more answers 503 until one ends."
    ).tag(config=True)

    max_sessions_per_user = Integer(
        20,
        help="""Most MCP sessions one user (principal) may hold open at once; one more initialize is refused
        with 429 SandboxQuotaError until one of theirs ends (DELETE) or expires (session_idle_timeout_seconds), so one
        user cannot fill max_sessions for everyone. 0 means no ceiling per user (max_sessions still applies).""",
    ).tag(config=True)

    max_request_bytes = Integer(
        8 << 20,
        help="Largest MCP request body in bytes (a session_write_file's content travels in it); larger gets 413.",
    ).tag(config=True)

    max_output_bytes = Integer(
        64 << 10,
        help="""Most bytes of each output stream (stdout, stderr) an MCP tool answer carries; longer output is cut
        in the middle with a marker, and the answer keeps the full byte counts. 0: no cut (the server's
        SandboxApp.max_output_bytes still stops a command past it).""",
    ).tag(config=True)

    tools_poll_interval_seconds = Float(
        5.0,
        help="""Seconds between two looks at the preset store, so presets authored over REST or the CLI reach
        MCP clients as notifications/tools/list_changed. 0: only changes made over MCP notify.""",
    ).tag(config=True)

    audit = Bool(
        True, help="Log every MCP tool call: user, tool, session and outcome (scrubbed when the scrub is on)."
    ).tag(config=True)

    @default("log")
    def _log_default(self) -> logging.Logger:
        parent_log = getattr(self.parent, "log", None)
        return parent_log if parent_log is not None else logging.getLogger("jupyter_tai_sandbox.mcp")

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(parent=app, **kwargs)
        self.app = app
        self.tools = DoorTools(self)
        self.server = _DoorServer(
            "jupyter-tai-sandbox",
            version=__version__,
            title="Jupyter sandbox sessions",
            instructions=INSTRUCTIONS,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )
        self.manager: StreamableHTTPSessionManager | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._start_lock = asyncio.Lock()
        self._ready = False
        self._listeners: OrderedDict[str, Any] = OrderedDict()
        self._warned: set[str] = set()
        self._fingerprint: str | None = None
        self._pending: set[asyncio.Future[None]] = set()
        #: extra audit sinks (tests, an operator's hook): called with each audit record
        self.audit_sinks: list[Callable[[dict[str, Any]], None]] = []

    # ------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """The lifespan is entered (requests can be served), not merely starting."""
        return self._ready and self._task is not None and not self._task.done() and self.manager is not None

    async def start(self) -> None:
        """Enter the session manager's lifespan in a task of its own (idempotent)."""
        async with self._start_lock:
            if self.running:
                return
            self.manager = _DoorSessionManager(
                app=self.server,
                max_sessions_per_user=self.max_sessions_per_user,
                json_response=self.json_response,
                stateless=False,
                security_settings=None,  # Host, Origin and auth are checked by the tornado handler
                session_idle_timeout=self.session_idle_timeout_seconds or None,
                max_request_body_size=self.max_request_bytes,
                max_sessions=self.max_sessions or None,
            )
            ready = asyncio.Event()
            self._stop = stop = asyncio.Event()
            manager = self.manager

            async def lifespan() -> None:
                async with manager.run():
                    ready.set()
                    watcher = asyncio.create_task(self._watch_tools())
                    try:
                        await stop.wait()
                    finally:
                        watcher.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await watcher

            self._task = asyncio.create_task(lifespan(), name="jupyter_tai_sandbox-mcp")
            started = asyncio.ensure_future(ready.wait())
            await asyncio.wait({started, self._task}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.is_set():
                started.cancel()
                self._task.result()  # raises the lifespan's failure
            self._fingerprint = await asyncio.to_thread(self._tools_fingerprint)
            self._ready = True  # concurrent first requests wait on the lock until here
            self.log.info("jupyter_tai_sandbox: MCP door at /api/sandbox/mcp (Streamable HTTP)")

    async def stop(self) -> None:
        """Leave the lifespan (open MCP sessions end); the app's live-command registry kills the commands."""
        self._ready = False
        task, self._task = self._task, None
        if task is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(task, 10)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
        except Exception as e:  # the SDK's shutdown failing must not stop the server's
            self.log.warning("jupyter_tai_sandbox: the MCP door stopped with %s", e)
        self.manager = None
        self._listeners.clear()

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self.running:
            await self.start()
        assert self.manager is not None
        await self.manager.handle_request(scope, receive, send)

    # ------------------------------------------------------------ list changes

    def _tools_fingerprint(self) -> str:
        """Every preset, shared and private (each listener re-lists what it may see)."""
        return self.app.tools.fingerprint()

    def tools_changed(self) -> None:
        """A preset changed through the door: tell the clients now."""
        task = asyncio.ensure_future(self._check_tools())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _check_tools(self) -> None:
        try:
            fingerprint = await asyncio.to_thread(self._tools_fingerprint)
        except SandboxError as e:
            self.log.warning("jupyter_tai_sandbox: MCP door cannot read the tools: %s", e)
            return
        if fingerprint == self._fingerprint:
            return
        self._fingerprint = fingerprint
        for mcp_session_id, session in list(self._listeners.items()):
            try:
                await session.send_tool_list_changed()
            except Exception as e:  # best effort: a gone client must not stop the others
                self.log.debug("jupyter_tai_sandbox: list_changed to MCP session %s: %s", mcp_session_id, e)
                self._listeners.pop(mcp_session_id, None)

    async def _watch_tools(self) -> None:
        while self.tools_poll_interval_seconds > 0:
            await asyncio.sleep(self.tools_poll_interval_seconds)
            await self._check_tools()

    def forget_session(self, mcp_session_id: str | None) -> None:
        if mcp_session_id:
            self._listeners.pop(mcp_session_id, None)

    def _listen(self, ctx: Any) -> None:
        request = ctx.request
        mcp_session_id = request.headers.get("mcp-session-id") if request is not None else None
        if not mcp_session_id:
            return  # the 2026 per-request era: no standalone stream to notify on
        self._listeners[mcp_session_id] = ctx.session
        self._listeners.move_to_end(mcp_session_id)
        while len(self._listeners) > _MAX_LISTENERS:
            self._listeners.popitem(last=False)

    def warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            self.log.warning("jupyter_tai_sandbox: %s", message)

    # ------------------------------------------------------------ MCP handlers

    @staticmethod
    def _door_request(ctx: Any) -> DoorRequest:
        request = getattr(ctx, "request", None)
        door_request = request.scope.get(SCOPE_KEY) if request is not None else None
        if not isinstance(door_request, DoorRequest):
            # only the authenticated tornado handler builds requests; nothing else reaches here
            raise MCPError(code=types.INVALID_REQUEST, message="unauthenticated MCP request")
        return door_request

    async def _on_list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        request = self._door_request(ctx)
        self._listen(ctx)
        try:
            specs = await asyncio.to_thread(self.tools.list_tools, request.principal())
        except SandboxError as e:
            raise MCPError(code=types.INTERNAL_ERROR, message=f"{type(e).__name__}: {e}") from None
        return types.ListToolsResult(tools=[_tool(spec) for spec in specs], ttl_ms=0, cache_scope="private")

    async def _on_call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        request = self._door_request(ctx)
        name, arguments = params.name, params.arguments if params.arguments is not None else {}
        record: dict[str, Any] = {
            "user": request.caller.name,
            "tool": name,
            "session": session_id_of(arguments),
        }
        policy = self.app.policy
        try:
            result = scrub_result(policy, await self.tools.call(request, name, arguments))
        except SandboxError as e:
            status = error_status(e)
            body = scrub_result(policy, error_body(e, status))
            if status == 404 and body.get("error") == "SandboxNotFoundError" and _is_unknown_tool(e, name):
                record["outcome"] = "unknown tool"
                self._audit(record)
                raise MCPError(
                    code=types.INVALID_PARAMS,
                    message=f"unknown tool {name!r}: tools/list lists them",
                    data={"tool": name},
                ) from None
            record["outcome"] = f"error {body['error']}" + (
                f" field={body['field']}" if body.get("field") else ""
            )
            self._audit(record)
            self._tell_refusal(request, name, record.get("session"), body, status)
            return _error_result(body)
        except MCPError:
            raise
        except Exception:  # never a traceback to the client: logged here, a plain error there
            self.log.exception("jupyter_tai_sandbox: MCP tool %s failed", name)
            record["outcome"] = "error InternalError"
            self._audit(record)
            return _error_result(
                {"error": "InternalError", "message": "the tool failed; the server log says why"}
            )
        record["session"] = (
            record["session"]
            or result.get("session_id")
            or (result.get("id") if name == "session_create" else None)
        )
        outcome = "ok"
        if isinstance(result.get("exit_code"), int):
            outcome += f" exit_code={result['exit_code']}"
        if result.get("handle"):
            outcome += f" handle={result['handle']}"
        record["outcome"] = outcome
        self._audit(record)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(result, ensure_ascii=False))],
            structured_content=result,
            is_error=False,
        )

    def _tell_refusal(
        self, request: DoorRequest, tool: str, session: Any, body: dict[str, Any], status: int
    ) -> None:
        """A refused tool call, told to the gate's listeners (the audit log), door "mcp"."""
        gate = getattr(getattr(self.app, "access", None), "gate", None)
        if gate is None or not gate.events.active:
            return
        name = request.caller.name
        gate.tell(
            ev.REFUSAL,
            session=session if isinstance(session, str) else None,
            owner=name,
            actor=name,
            door="mcp",
            error=body.get("error"),
            message=body.get("message"),
            status=status,
            request=f"tool {tool}",
        )

    def _audit(self, record: dict[str, Any]) -> None:
        if not self.audit:
            return
        line = "MCP tool call: user={user!r} tool={tool!r} session={session} outcome={outcome}".format(
            **record
        )
        scrub = getattr(self.app.policy, "scrub", None)
        if scrub is not None:
            line = scrub(line)
            record = {k: scrub(v) if isinstance(v, str) else v for k, v in record.items()}
        self.log.info("jupyter_tai_sandbox: %s", line)
        for sink in self.audit_sinks:
            sink(record)


def _is_unknown_tool(error: Exception, name: str) -> bool:
    return str(error).startswith(f"no tool named {name!r}")


def _tool(spec: ToolSpec) -> types.Tool:
    annotations = None
    if spec.read_only or spec.destructive:
        annotations = types.ToolAnnotations(
            read_only_hint=spec.read_only or None, destructive_hint=spec.destructive or None
        )
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=client_schema(spec.input_schema),
        annotations=annotations,
    )


def _error_result(body: dict[str, Any]) -> types.CallToolResult:
    """A refusal as the tool's answer (isError), so the agent reads what to change."""
    text = f"{body.get('error')}: {body.get('message')}"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=body, is_error=True
    )
