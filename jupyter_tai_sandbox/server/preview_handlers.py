"""Web previews: every HTTP method to a port inside a session (see :mod:`jupyter_tai_sandbox.previews`).

:class:`PortProxyHandler` admits a request in ``prepare`` (auth, the Authorizer, the owner rules, the
limits), opens the port and sends the request head; the body streams to the app as it arrives
(``data_received`` waits on the app); the method then reads the response head and streams the body back,
flushing each chunk before it reads the next. A request with ``Upgrade: websocket`` is handed to the
websocket half (:class:`~jupyter_tai_sandbox.previews.ws_relay.WebSocketRelayMixin`) once admitted.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.auth.utils import HTTP_METHOD_TO_AUTH_ACTION
from tornado import web
from tornado.iostream import StreamClosedError

from ..contract import (
    SandboxError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxSession,
    SandboxUnsupportedError,
)
from ..errors import (
    PreviewBodyTooLargeError,
    PreviewGrantError,
    PreviewIdleTimeoutError,
    PreviewSessionGoneError,
    PreviewUpstreamError,
)
from ..previews.http_upstream import HttpUpstream
from ..previews.origin import COOKIE_NAME, GRANT_PATH, Grant, PreviewCookies, safe_next
from ..sessions import _SESSION_ID, Caller
from .handler_base import AUTH_RESOURCE
from .handlers import SESSION_ID, SandboxAPIHandler

if TYPE_CHECKING:
    from ..previews.settings import PreviewSettings

from ..previews.ws_relay import WebSocketRelayMixin

#: the route's segment after the session id: the app sees the path after the port
PORTS_SEGMENT = "ports"
#: the same, the app seeing the full request path (previews.urls.port_path(..., absolute=True))
ABSOLUTE_SEGMENT = "absolute-ports"

__all__ = [
    "CSP_SANDBOX",
    "PortProxyHandler",
    "PreviewHostHandler",
    "install_preview_host",
    "preview_handlers",
]

#: the sandbox every proxied document gets: no allow-same-origin, so its origin is opaque
CSP_SANDBOX = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads allow-popups-to-escape-sandbox"

#: hop-by-hop headers (RFC 9110 7.6.1), never passed either way, with those the proxy sets itself
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "expect",
    }
)
#: the user's Jupyter credentials: never to the app
_CREDENTIALS = frozenset({"cookie", "authorization", "x-xsrftoken", "x-csrftoken"})
_FORWARDED = (
    "x-forwarded-prefix",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-for",
    "x-forwarded-port",
)
#: response headers of the app the proxy replaces or drops
_RESPONSE_DROPPED = frozenset({"referrer-policy", "x-content-type-options", "server", "date"})
#: the route's part of a request path (the prefix the app's path follows)
_PREFIX = re.compile(rf".*?/api/sandbox/sessions/[^/]+/(?P<kind>{PORTS_SEGMENT}|{ABSOLUTE_SEGMENT})/[^/]+")
#: closes of app connections under way (a handler may end before its close has)
_CLOSING: set[asyncio.Future[None]] = set()


def without_token(query: str) -> str:
    """The query string without its ``token`` parameter(s), the rest byte for byte."""
    parts = [part for part in query.split("&") if part.split("=", 1)[0] != "token"]
    return "&".join(part for part in parts if part)


@web.stream_request_body
class PortProxyHandler(WebSocketRelayMixin, SandboxAPIHandler):
    """``/api/sandbox/sessions/{id}/ports/{port}/{path}`` (and ``absolute-ports``): the app on ``port``."""

    _http: HttpUpstream | None = None
    _held: tuple[str, str] | None = None
    _received = 0
    _websocket = False
    _proxying = False
    _refused: SandboxError | None = None

    @property
    def preview_settings(self) -> PreviewSettings:
        return cast("PreviewSettings", cast("Any", self.sandbox_app).previews)

    async def prepare(self) -> None:  # type: ignore[override]  # APIHandler's, which drops JupyterHandler's keyword
        await super().prepare()
        if self._finished:
            return
        bare = self.path_kwargs.get("path") is None
        if bare and self.request.method in ("GET", "HEAD") and not self.is_websocket_upgrade():
            # the app's root without its slash: its relative links would resolve one level up
            query = self.request.query
            self.redirect(self.request.path + "/" + ("?" + query if query else ""))
            return
        await self._admit()

    async def _admit(self) -> None:
        user = self.current_user
        if not user:
            raise web.HTTPError(403)
        method = self.request.method or "GET"
        self._websocket = self.is_websocket_upgrade()
        action = "execute" if self._websocket else HTTP_METHOD_TO_AUTH_ACTION.get(method, "write")
        await self._authorize(user, action)
        kwargs = self.path_kwargs
        session_id, given = kwargs["session_id"], kwargs["port"]
        port = int(given) if given.isdigit() and len(given) <= 5 else 0
        if not 0 < port < 65536:
            raise SandboxRequestError(f"port {given[:20]!r}: a TCP port, 1 to 65535", field="port")
        settings = self.preview_settings
        limit = settings.max_request_body_bytes
        length = self.request.headers.get("Content-Length")
        if limit and length is not None and length.isdigit() and int(length) > limit:
            raise PreviewBodyTooLargeError(
                f"the request body is {length} bytes; the limit is {limit} (PreviewSettings.max_request_body_bytes)"
            )
        session = await self._session(session_id, manage=method not in ("GET", "HEAD", "OPTIONS"))
        caller = await self.caller()
        if session.opens_ports and self._to_own_origin(session_id):
            await self._redirect_to_own_origin(session_id, port, caller)
            return
        settings.hold(session_id, caller.name)
        self._held = (session_id, caller.name)
        self.session = session
        self.port = port
        self.touch()
        if not session.opens_ports:
            raise SandboxUnsupportedError(
                f"session {session_id}'s provider cannot open its ports: no web preview", operation="ports"
            )
        if self._websocket:
            return
        connection = self.request.connection
        if limit:
            connection.set_max_body_size(limit + (1 << 20))  # type: ignore[union-attr]  # an HTTP1Connection
        where = f"port {port} of session {session_id}"
        try:
            opened = await session.open_port(port)
        except ConnectionRefusedError:
            raise PreviewUpstreamError(f"nothing is listening on {where}") from None
        except (ConnectionError, OSError) as e:
            raise PreviewUpstreamError(f"{where} cannot be reached: {e}") from None
        self._http = HttpUpstream(opened, where=where, idle_timeout=settings.idle_timeout_seconds)
        await self._http.send_head(method, self.target(), self.forwarded_headers())

    async def _authorize(self, user: Any, action: str) -> None:
        """The Authorizer's ``action`` on the sessions resource for ``user``, or 403."""
        if not await ensure_async(self.authorizer.is_authorized(self, user, action, AUTH_RESOURCE)):
            raise web.HTTPError(403, f"User is not authorized to {action} on resource: {AUTH_RESOURCE}.")

    def _to_own_origin(self, session_id: str) -> bool:
        """With PreviewSettings.origin_template set, a browser's GET of a document goes to the session port's
        own origin (a script's or a tool's request, and a websocket, are relayed here as before)."""
        template = self.preview_settings.origin
        if template is None or self._websocket or self.request.method not in ("GET", "HEAD"):
            return False
        if not template.fits(session_id):
            return False
        dest = self.request.headers.get("Sec-Fetch-Dest")
        if dest is not None:
            return dest in ("document", "iframe", "frame")
        return "text/html" in self.request.headers.get("Accept", "")

    async def _redirect_to_own_origin(self, session_id: str, port: int, caller: Caller) -> None:
        """A redirect to the session port's origin with a one-time code for this user, session and port."""
        settings = self.preview_settings
        user = self.current_user
        actions = frozenset(
            [
                action
                for action in ("read", "write", "execute")
                if await ensure_async(self.authorizer.is_authorized(self, user, action, AUTH_RESOURCE))
            ]
        )
        code = settings.codes.issue(caller.name, caller.admin_actions, actions, session_id, port)
        path, query = self._split_path()[1] or "/", without_token(self.request.query)
        next_path = path + ("?" + query if query else "")
        origin = preview_origin(settings, self.request, session_id, port)
        assert origin is not None
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "no-referrer")
        self.redirect(f"{origin}{GRANT_PATH}?" + urlencode({"code": code, "next": next_path}))

    async def _session(self, session_id: str, *, manage: bool) -> SandboxSession:
        """The caller's session; another user's live one 404; a well-formed id with no live session 410."""
        caller = await self.caller()
        try:
            return await self.sessions.get(session_id, caller, manage=manage)
        except SandboxNotFoundError as e:
            if not _SESSION_ID.fullmatch(session_id):
                raise
            try:
                await self.sandbox_app.access.require().get(session_id)
            except SandboxNotFoundError:
                raise PreviewSessionGoneError(
                    f"this preview's session is gone: session {session_id} was destroyed, reached its TTL, "
                    "or never existed"
                ) from e
            raise  # another user's live session: the 404 of an unknown one

    def _split_path(self) -> tuple[str, str]:
        """The request path (as the browser sent it, still percent-encoded) as the route's prefix and the
        rest (the app's path when the prefix is stripped)."""
        path = self.request.path
        found = _PREFIX.match(path)
        assert found is not None  # the route matched it
        return found.group(0), path[found.end() :]

    def target(self) -> str:
        """The request-target the app sees: the path after the port (or the whole path under
        absolute-ports), the query kept without ``token``."""
        path = self.request.path if self.absolute else (self._split_path()[1] or "/")
        query = without_token(self.request.query)
        return path + ("?" + query if query else "")

    @property
    def absolute(self) -> bool:
        """Under absolute-ports: the app sees the whole request path."""
        found = _PREFIX.match(self.request.path)
        return found is not None and found.group("kind") == ABSOLUTE_SEGMENT

    def prefix(self) -> str:
        """The path the proxy strips (the app's root as the browser sees it), without a trailing slash."""
        return self._split_path()[0]

    def forwarded_headers(self) -> list[tuple[str, str]]:
        """The browser's end-to-end headers for the app: hop-by-hop ones, the credentials and any
        X-Forwarded-* the browser sent dropped; the proxy's own X-Forwarded-* added."""
        request = self.request
        connection_named = {
            name.strip().lower() for name in request.headers.get("Connection", "").split(",") if name.strip()
        }
        headers = [("Host", f"127.0.0.1:{self.port}")]
        for name, value in request.headers.get_all():
            lowered = name.lower()
            if lowered in _HOP_BY_HOP or lowered in _CREDENTIALS or lowered in connection_named:
                continue
            if lowered in _FORWARDED:
                continue
            headers.append((name, value))
        if "Content-Length" not in request.headers and "chunked" in request.headers.get(
            "Transfer-Encoding", ""
        ):
            headers.append(("Transfer-Encoding", "chunked"))
        host = request.host
        default_port = "443" if request.protocol == "https" else "80"
        port = host.rsplit(":", 1)[1] if ":" in host and not host.endswith("]") else default_port
        headers += [
            ("X-Forwarded-Prefix", self.prefix()),
            ("X-Forwarded-Host", host),
            ("X-Forwarded-Proto", request.protocol),
            ("X-Forwarded-For", request.remote_ip or ""),
            ("X-Forwarded-Port", port),
        ]
        return headers

    async def data_received(self, chunk: bytes) -> None:
        upstream = self._http
        if upstream is None:
            return
        if self._refused is not None:
            return
        self._received += len(chunk)
        limit = self.preview_settings.max_request_body_bytes
        if limit and self._received > limit:
            # answered by the method once the body is in (an error raised here would only cut the connection)
            self._refused = PreviewBodyTooLargeError(
                f"the request body exceeds the limit of {limit} bytes (PreviewSettings.max_request_body_bytes)"
            )
            return
        try:
            await upstream.send_body(chunk)
        except (PreviewUpstreamError, PreviewIdleTimeoutError) as e:
            self._refused = e

    async def _proxy(self, *args: Any, **kwargs: Any) -> None:
        if self._websocket:
            assert self.request.method == "GET"
            await self.relay_websocket(
                session=self.session,
                port=self.port,
                target=self.target(),
                headers=self.forwarded_headers(),
                settings=self.preview_settings,
                release=self._release_hold,
            )
            return
        upstream = self._http
        assert upstream is not None  # made by prepare
        if self._refused is not None:
            raise self._refused
        await upstream.end_body()
        response = await upstream.response()
        settings = self.preview_settings
        limit = settings.max_response_bytes
        self.clear()  # tornado's and Jupyter's defaults (Content-Type, the API's CSP): the app's own instead
        self.clear_header("Content-Type")
        self.set_status(response.status, response.reason or "Unknown")
        connection_named = {
            name.strip().lower()
            for name, value in response.headers
            if name.lower() == "connection"
            for name in value.split(",")
        }
        dropped_cookie = False
        app_headers = {name.lower() for name, _ in response.headers}
        for name, value in response.headers:
            lowered = name.lower()
            if lowered in ("set-cookie", "set-cookie2"):
                kept = self.app_cookie(value)
                if kept is None:
                    dropped_cookie = True
                else:
                    self.add_header("Set-Cookie", kept)
                continue
            if lowered == "content-length" and limit and value.isdigit() and int(value) > limit:
                raise PreviewUpstreamError(
                    f"the app's response is {value} bytes; the limit is {limit} (PreviewSettings.max_response_bytes)"
                )
            if lowered in _HOP_BY_HOP or lowered in connection_named or lowered in self.response_dropped:
                continue
            if lowered == "content-security-policy":
                continue  # added after the proxy's own, below
            self.add_header(name, value)
        if self.sandboxed:
            self.set_header("Content-Security-Policy", CSP_SANDBOX)
        for name, value in response.headers:
            if name.lower() == "content-security-policy":
                self.add_header("Content-Security-Policy", value)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.security_headers(app_headers)
        if dropped_cookie:
            self._log_cookie_dropped()
        self._proxying = True
        sent = 0
        try:
            async for chunk in upstream.body():
                sent += len(chunk)
                if limit and sent > limit:
                    self.log.warning(
                        "preview %s: the response passed PreviewSettings.max_response_bytes (%d): cut",
                        upstream.where,
                        limit,
                    )
                    self.request.connection.close()  # type: ignore[union-attr]
                    return
                self.write(chunk)
                await self.flush()
        except PreviewUpstreamError as e:
            self.log.info("preview %s: %s", upstream.where, e)
            self.request.connection.close()  # type: ignore[union-attr]  # the browser sees it cut short
            return
        except StreamClosedError:
            return  # the browser went away
        self.finish()

    get = post = put = patch = delete = head = options = _proxy  # type: ignore[assignment]

    #: responses get the opaque-origin CSP sandbox (the Jupyter origin's route)
    sandboxed = True
    #: the app's response headers the proxy replaces or drops
    response_dropped: frozenset[str] = _RESPONSE_DROPPED

    def app_cookie(self, value: str) -> str | None:
        """The app's Set-Cookie as passed to the browser, or None to drop it (on the Jupyter origin: all)."""
        return None

    def security_headers(self, app_headers: set[str]) -> None:
        """The proxy's own headers after the app's (``app_headers``: the names the app sent, lower case)."""
        self.set_header("Referrer-Policy", "no-referrer")

    _cookie_logged: set[str] = set()

    def _log_cookie_dropped(self) -> None:
        session_id = self.path_kwargs["session_id"]
        if session_id not in PortProxyHandler._cookie_logged:
            PortProxyHandler._cookie_logged.add(session_id)
            self.log.info(
                "preview of session %s: the app's Set-Cookie is dropped (previews keep no cookies)",
                session_id,
            )

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        if self._proxying:  # the app's Content-Type stays (APIHandler's would set JSON)
            self.update_api_activity()
            return web.RequestHandler.finish(self, *args, **kwargs)
        return super().finish(*args, **kwargs)

    def on_finish(self) -> None:
        self._release()

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self._release()

    def _release_hold(self) -> None:
        if self._held is not None:
            self.preview_settings.release(*self._held)
            self._held = None

    def _release(self) -> None:
        if not self._websocket:  # a websocket's relay gives its hold back when it ends
            self._release_hold()
        upstream, self._http = self._http, None
        if upstream is not None:
            closing = asyncio.ensure_future(upstream.close())
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)


PORT = r"(?P<port>[^/]+)"
#: the app's path after the port (optional: .../ports/8000 is the app's root too)
APP_PATH = r"(?:/(?P<path>.*))?"

preview_handlers = [
    (rf"/api/sandbox/sessions/{SESSION_ID}/{PORTS_SEGMENT}/{PORT}{APP_PATH}", PortProxyHandler),
    (rf"/api/sandbox/sessions/{SESSION_ID}/{ABSOLUTE_SEGMENT}/{PORT}{APP_PATH}", PortProxyHandler),
]


def preview_origin(settings: PreviewSettings, request: Any, session_id: str, port: int) -> str | None:
    """The origin of ``port`` of ``session_id`` under PreviewSettings.origin_template for a browser that
    reached Jupyter at ``request``'s host (``{server_port}``: its port), or None (no template, or an id that
    cannot be part of a host name: the opaque-origin route then)."""
    template = settings.origin
    if template is None or not template.fits(session_id):
        return None
    host = request.host
    server_port = (
        host.rsplit(":", 1)[1]
        if ":" in host and not host.endswith("]")
        else ("443" if request.protocol == "https" else "80")
    )
    return template.origin(session_id, port, server_port)


#: the methods that change nothing (no Origin check on the preview host)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@web.stream_request_body
class PreviewHostHandler(PortProxyHandler):
    """Every request on a session port's own origin (PreviewSettings.origin_template): the one-time code
    exchanged for the host's cookie at :data:`~jupyter_tai_sandbox.previews.origin.GRANT_PATH`, and every other
    path relayed to the app once the cookie and the session's owner are checked. Not jupyter_server's login:
    Jupyter's cookies never reach this host (they are host-only), and its token is no credential here."""

    sandboxed = False
    #: the app's own cookies (this host's, without the preview cookie) reach its websocket handshake too
    forwards_app_cookies = True
    response_dropped = frozenset({"x-content-type-options", "server", "date"})
    _grant: Grant | None = None
    _own_origin = ""

    def get_current_user(self) -> Any:  # the cookie's user, not jupyter_server's
        return self._grant.user if self._grant is not None else None

    def set_default_headers(self) -> None:
        """Not Jupyter's (its CSP's ``frame-ancestors 'self'`` would keep the JupyterLab tab from framing
        the preview, and the operator's ServerApp headers are for Jupyter's pages): tornado's, and nosniff."""
        web.RequestHandler.set_default_headers(self)
        self.set_header("X-Content-Type-Options", "nosniff")

    def check_xsrf_cookie(self) -> None:
        """No Jupyter XSRF here (the app has its own rules); an unsafe method from another origin is refused in
        prepare."""

    def check_origin(self, origin: str | None = None) -> bool:
        """A websocket, and an unsafe method that names an Origin, must come from this very origin."""
        given = origin if origin is not None else self.request.headers.get("Origin")
        if given is None:
            return not self.is_websocket_upgrade()
        return given == self._own_origin

    async def prepare(self) -> None:  # type: ignore[override]
        settings = self.preview_settings
        template = settings.origin
        found = template.parse(self.request.host_name) if template is not None else None
        if template is None or found is None:
            raise web.HTTPError(404)
        session_id, port = found
        self._own_origin = f"{template.scheme}://{self.request.host.lower()}"
        self.path_kwargs.update(session_id=session_id, port=str(port))
        if self.request.path == GRANT_PATH:
            self._exchange(session_id, port)
            return
        cookies = self._cookies()
        for value in self._cookie_values():
            self._grant = cookies.check(value, session_id, port)
            if self._grant is not None:
                break
        else:
            raise PreviewGrantError(
                f"no valid preview cookie for port {port} of session {session_id} on this host: open the "
                "preview from Jupyter again (the panel's Open, %sandbox open, SandboxClient.port_url)"
            )
        self._current_user = self._grant.user
        self._caller = Caller(self._grant.user, self._grant.admin_actions)
        if (self.request.method or "GET") not in _SAFE_METHODS and not self.check_origin():
            raise PreviewGrantError(
                f"a {self.request.method} from another origin is refused on a preview origin"
            )
        await self._admit()

    def _to_own_origin(self, session_id: str) -> bool:
        return False  # here already

    async def _authorize(self, user: Any, action: str) -> None:
        grant = self._grant
        if grant is None or action not in grant.actions:
            raise PreviewGrantError(
                f"the Authorizer did not grant {action!r} on the sessions resource when this preview was opened"
            )

    def _cookies(self) -> PreviewCookies:
        settings = self.preview_settings
        made: PreviewCookies | None = getattr(settings, "_cookies", None)
        if made is None or made.max_age != settings.origin_cookie_seconds:
            secret = self.settings.get("cookie_secret") or secrets.token_bytes(32)
            if isinstance(secret, str):
                secret = secret.encode()
            made = PreviewCookies(secret, settings.origin_cookie_seconds)
            settings._cookies = made  # type: ignore[attr-defined]
        return made

    def _cookie_values(self) -> list[str]:
        values = []
        for header in self.request.headers.get_list("Cookie"):
            for part in header.split(";"):
                name, _, value = part.strip().partition("=")
                if name == COOKIE_NAME:
                    values.append(value.strip())
        return values

    def _exchange(self, session_id: str, port: int) -> None:
        """The grant path: a one-time code for this session port becomes the host's cookie, then the app's
        ``next`` path (on this host only)."""
        if self.request.method not in ("GET", "HEAD"):
            raise web.HTTPError(405)
        settings = self.preview_settings
        grant = settings.codes.redeem(self.get_query_argument("code", ""), session_id, port)
        if grant is None:
            raise PreviewGrantError(
                "this preview link was used already, has expired, or is for another session port (a link from "
                "Jupyter is good once, for a few seconds): open the preview from Jupyter again"
            )
        max_age = int(settings.origin_cookie_seconds)
        value = self._cookies().make(grant)
        # host-only (no Domain), HttpOnly; Secure and SameSite=None so the JupyterLab tab's iframe (another
        # site) sends it, Partitioned so it works where third-party cookies are blocked (browsers take Secure
        # cookies on http://*.localhost too)
        self.add_header(
            "Set-Cookie",
            f"{COOKIE_NAME}={value}; Path=/; Max-Age={max_age}; HttpOnly; Secure; SameSite=None; Partitioned",
        )
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "no-referrer")
        self._proxying = True  # a plain redirect, not the API's JSON
        self.redirect(safe_next(self.get_query_argument("next", None)))

    def _split_path(self) -> tuple[str, str]:
        return "", self.request.path

    @property
    def absolute(self) -> bool:
        return False

    def forwarded_headers(self) -> list[tuple[str, str]]:
        """As on the Jupyter route, without X-Forwarded-Prefix (the app is at this origin's root), and with the
        app's own cookies (this host's, never the preview cookie)."""
        headers = [
            (name, value) for name, value in super().forwarded_headers() if name != "X-Forwarded-Prefix"
        ]
        own = [
            part.strip()
            for header in self.request.headers.get_list("Cookie")
            for part in header.split(";")
            if part.strip() and part.strip().partition("=")[0] != COOKIE_NAME
        ]
        if own:
            headers.insert(1, ("Cookie", "; ".join(own)))
        return headers

    def app_cookie(self, value: str) -> str | None:
        """The app's cookie, host-only (a Domain attribute dropped, so it never reaches another preview), and
        one the JupyterLab tab's iframe (another site) keeps: without a SameSite of its own it gets
        ``SameSite=None; Secure; Partitioned`` (sent only under the top-level site it was set under). One named
        as the preview cookie is dropped."""
        parts = [part.strip() for part in value.split(";")]
        name = parts[0].partition("=")[0].strip()
        if name.lower() == COOKIE_NAME.lower():
            return None
        kept = [parts[0]] + [
            part for part in parts[1:] if part and part.partition("=")[0].strip().lower() != "domain"
        ]
        named = {part.partition("=")[0].strip().lower() for part in kept[1:]}
        if "samesite" not in named:
            kept.append("SameSite=None")
            if "secure" not in named:
                kept.append("Secure")
            if "partitioned" not in named:
                kept.append("Partitioned")
        return "; ".join(kept)

    def security_headers(self, app_headers: set[str]) -> None:
        if "referrer-policy" not in app_headers:
            self.set_header("Referrer-Policy", "same-origin")
        if "cross-origin-resource-policy" not in app_headers:
            self.set_header("Cross-Origin-Resource-Policy", "same-origin")

    def _log_cookie_dropped(self) -> None:
        self.log.info(
            "preview of session %s: an app cookie named %s dropped",
            self.path_kwargs["session_id"],
            COOKIE_NAME,
        )

    get = post = put = patch = delete = head = options = allow_unauthenticated(PortProxyHandler._proxy)


def install_preview_host(web_app: Any, settings: PreviewSettings, name: str) -> None:
    """With PreviewSettings.origin_template set, the preview hosts' route, matched by Host before every other
    rule of the server (jupyter_server's own and its extensions' match any host, so an app's ``/api/...`` or
    ``/static/...`` would otherwise reach Jupyter's handlers)."""
    template = settings.origin
    if template is None:
        return
    rules = web_app.default_router.rules
    before = list(rules)
    web_app.add_handlers(template.host_pattern, [(r"/.*", PreviewHostHandler, {"name": name})])
    added = [rule for rule in rules if rule not in before]
    for rule in added:
        rules.remove(rule)
    rules[0:0] = added
