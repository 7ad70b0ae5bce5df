"""Tornado to ASGI: the MCP route is a jupyter_server APIHandler that hands its request to the SDK.

Why an adapter and not the SDK's transport class directly: the transport
(``StreamableHTTPServerTransport``) is itself an ASGI callable, and the session
manager in front of it (session ids, owners, idle expiry, the 2025 and 2026
protocol eras) is too; speaking ASGI once, here, reuses all of it. The adapter
is small because tornado has already parsed the request: the scope is built
from it, ``receive`` hands over the body and then waits for the client to go,
``send`` maps onto ``set_status``/``write``/``flush``/``finish`` (SSE events
are flushed one by one).

Everything jupyter_server applies to its own API routes happens before the SDK
sees a byte: ``check_host``, authentication (token header, or cookie + XSRF on
POST/DELETE), the Authorizer (``read`` on ``jupyter_tai_sandbox:sessions`` to
reach the door; each tool asks for its own action). Origin is stricter than
the other API routes: a token does not excuse a foreign ``Origin`` (MCP's
DNS-rebinding rule); only ``ServerApp.allow_origin`` / ``allow_origin_pat``
admit one, and CORS headers are sent only for those, never a wildcard or an echo.

A refusal (no or a wrong token, the Authorizer, the door off, a quota) keeps its
HTTP status, and its body is a JSON-RPC error carrying this API's error body as
``data``: for any other non-2xx body the `mcp` SDK shows only "Server returned
an error response", while a JSON-RPC error's message reaches the caller as the
``MCPError`` it raises. A wrong token stays 403, not 401: a client holding an
OAuth provider starts OAuth discovery on 401, which Jupyter's token does not speak.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import APIHandler, origin_matches_pat
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..contract import SandboxError, SandboxUnavailableError
from ..errors import error_body, error_status
from ..server.handler_base import AUTH_RESOURCE, JSONErrorsMixin, SandboxHandlerMixin

MCP_PATH = r"/api/sandbox/mcp"
_SESSION_ACTIONS = ("read", "write", "execute")
#: request headers the SDK never needs: the Jupyter credential stays in tornado
_PRIVATE_HEADERS = frozenset({"authorization", "cookie", "x-xsrftoken", "x-csrftoken"})
#: response headers tornado computes itself
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})
_MCP_HEADERS = (
    "accept, content-type, authorization, x-xsrftoken, mcp-session-id, mcp-protocol-version, last-event-id"
)
#: JSON-RPC error codes of a refused HTTP request: the client's mistake, or the server's
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603


def jsonrpc_refusal(body: dict[str, Any], status: int, request_id: Any = None) -> dict[str, Any]:
    """A refused request's error body (``{"error", "message", ...}``) as a JSON-RPC error answering
    ``request_id`` (null when unknown): its message names the error and why; ``data`` holds the body and status."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": INVALID_REQUEST if status < 500 else INTERNAL_ERROR,
            "message": f"{body.get('error')}: {body.get('message')} (HTTP {status})",
            "data": {**body, "status": status},
        },
    }


def _request_id(raw: bytes | None) -> Any:
    """The JSON-RPC id of a request body, when it has one of the allowed types (else None)."""
    try:
        message = json.loads(raw or b"")
    except (ValueError, RecursionError):
        return None
    request_id = message.get("id") if isinstance(message, dict) else None
    return request_id if isinstance(request_id, (str, int)) and not isinstance(request_id, bool) else None


class JSONRPCErrorsMixin(JSONErrorsMixin):
    """This API's errors, each wrapped in a JSON-RPC error (see the module's docstring)."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        status = error_status(error, status_code)
        if status == 403 and not isinstance(error, SandboxError):
            error = self._authentication_error(error) or error
        request = self.request
        request_id = _request_id(request.body) if request.method == "POST" else None
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(jsonrpc_refusal(error_body(error, status), status, request_id)))


def door_of(app: Any) -> Any:
    return getattr(app, "mcp_door", None)


class MCPHandler(JSONRPCErrorsMixin, SandboxHandlerMixin, APIHandler):
    """``/api/sandbox/mcp``: MCP Streamable HTTP (POST messages, GET the event stream, DELETE the session)."""

    auth_resource = AUTH_RESOURCE
    _closed: asyncio.Event | None = None
    _body_sent = False
    _response_started = False
    _response_done = False
    _content_type = "application/json"

    # ------------------------------------------------------------ origin / CORS

    def skip_check_origin(self) -> bool:
        """Origin is checked for every request, token or cookie (only OPTIONS preflights skip it)."""
        return self.request.method == "OPTIONS"

    def set_cors_headers(self) -> None:
        """CORS only for the operator's allow_origin / allow_origin_pat: no wildcard of ours, no echo."""
        origin = self.get_origin()
        allowed = None
        if self.allow_origin:
            allowed = self.allow_origin
        elif self.allow_origin_pat and origin and origin_matches_pat(self.allow_origin_pat, origin):
            allowed = origin
        if allowed:
            self.set_header("Access-Control-Allow-Origin", allowed)
            self.set_header("Access-Control-Expose-Headers", "mcp-session-id, mcp-protocol-version")
            if self.allow_credentials:
                self.set_header("Access-Control-Allow-Credentials", "true")

    @allow_unauthenticated
    def options(self, *args: Any, **kwargs: Any) -> None:
        """A CORS preflight (it carries no credentials): the allowed headers; the origin as set_cors_headers."""
        self.set_header("Access-Control-Allow-Headers", _MCP_HEADERS)
        self.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
        self.set_status(204)
        self.finish()

    # ------------------------------------------------------------ methods

    @web.authenticated
    @authorized(action="read")
    async def post(self) -> None:
        await self._bridge()

    @web.authenticated
    @authorized(action="read")
    async def get(self) -> None:
        await self._bridge()

    @web.authenticated
    @authorized(action="read")
    async def delete(self) -> None:
        await self._bridge()
        if self.get_status() < 400:
            door_of(self.sandbox_app).forget_session(self.request.headers.get("Mcp-Session-Id"))

    def on_connection_close(self) -> None:
        self._closing.set()
        super().on_connection_close()

    # ------------------------------------------------------------ the adapter

    @property
    def _closing(self) -> asyncio.Event:
        if self._closed is None:
            self._closed = asyncio.Event()
        return self._closed

    async def _session_actions(self) -> frozenset[str]:
        user = self.current_user
        granted = set()
        for action in _SESSION_ACTIONS:
            if await ensure_async(self.authorizer.is_authorized(self, user, action, AUTH_RESOURCE)):
                granted.add(action)
        return frozenset(granted)

    async def _bridge(self) -> None:
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from mcp.server.auth.provider import AccessToken

        from .catalog import DoorRequest
        from .door import SCOPE_KEY

        door = door_of(self.sandbox_app)
        if door is None or not door.enabled:
            raise SandboxUnavailableError(
                "the MCP door is off on this server (SandboxMCP.enabled = False); the operator can turn it on"
            )
        caller = await self.caller()
        door_request = DoorRequest(caller=caller, session_actions=await self._session_actions())
        request = self.request
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.get_all()
            if name.lower() not in _PRIVATE_HEADERS
        ]
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.protocol,
            "path": request.path,
            "raw_path": request.path.encode("latin-1"),
            "query_string": request.query.encode("latin-1"),
            "root_path": url_path_join(self.base_url, "").rstrip("/"),
            "headers": headers,
            "client": (request.remote_ip, 0),
            "server": None,
            "state": {},
            # the SDK binds each MCP session to the principal that opened it (another's id answers 404)
            "user": AuthenticatedUser(
                AccessToken(token="", client_id=caller.name, scopes=[], subject=caller.name)
            ),
            SCOPE_KEY: door_request,
        }
        try:
            await door.asgi(scope, self._receive, self._send)
        except Exception:
            if not self._response_started:
                # failed before the SDK answered (a quota at admission): this API's JSON error and status
                self._response_done = True
            raise
        finally:
            self._closing.set()
            if not self._response_done:
                self._response_done = True
                if not self._finished:
                    self.finish()

    async def _receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.request.body or b"", "more_body": False}
        await self._closing.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._response_started = True
            self.set_status(message["status"])
            for raw_name, raw_value in message.get("headers", []):
                name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
                lower = name.lower()
                if lower in _HOP_HEADERS:
                    continue
                if lower == "content-type":
                    self._content_type = value
                if lower == "set-cookie":
                    self.add_header(name, value)
                else:
                    self.set_header(name, value)
            return
        if kind != "http.response.body" or self._response_done:
            return
        body = message.get("body", b"")
        if self._closing.is_set() and not self._finished:
            # the client went away: nothing more to say
            self._response_done = True
            return
        if body:
            self.write(body)
        if message.get("more_body", False):
            try:
                await self.flush()
            except StreamClosedError:
                self._closing.set()
        else:
            self._response_done = True
            self.finish(set_content_type=self._content_type)


class MCPUnavailableHandler(JSONRPCErrorsMixin, SandboxHandlerMixin, APIHandler):
    """The route when the `mcp` package is not installed: 503 saying what to install."""

    auth_resource = AUTH_RESOURCE

    def initialize(self, *args: Any, reason: str = "", **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self.reason = reason

    @web.authenticated
    @authorized(action="read")
    async def post(self) -> None:
        raise SandboxUnavailableError(self.reason)

    get = delete = post
