"""The operator's settings of web previews (``c.PreviewSettings...``), and the connections they count."""

from __future__ import annotations

import collections
from typing import Any

from traitlets import Float, Integer, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..errors import PreviewConnectionsError
from .origin import GrantCodes, OriginTemplate

__all__ = ["PreviewSettings"]


class PreviewSettings(LoggingConfigurable):
    """Limits of web previews (a session's web app at /api/sandbox/sessions/{id}/ports/{port}/): every refusal
    is a typed error whose message names the setting."""

    _origin: OriginTemplate | None = None

    max_request_body_bytes = Integer(
        256 << 20,
        help="""Largest request body one preview request may send to the app, in bytes (streamed, never held
        whole); more is refused with 413 PreviewBodyTooLargeError. 0 means no limit.""",
    ).tag(config=True)

    max_response_bytes = Integer(
        0,
        help="""Most bytes of one response of the app a preview passes on (streamed, a chunk at a time): one
        announcing more is refused with 502 PreviewUpstreamError, one that grows past it is cut. 0 means no
        limit.""",
    ).tag(config=True)

    max_ws_frame_bytes = Integer(
        16 << 20,
        help="Largest websocket message a preview relays either way, in bytes; a larger one closes the socket (1009).",
    ).tag(config=True)

    idle_timeout_seconds = Float(
        300.0,
        help="""Seconds a preview's connection to the app may pass without a byte either way: then it is
        closed (before the response head: 504 PreviewIdleTimeoutError).""",
    ).tag(config=True)

    max_connections_per_session = Integer(
        64,
        help="""Most preview connections (HTTP requests under way and websockets) one session may hold at once;
        one more is refused with 429 PreviewConnectionsError. 0 means no cap.""",
    ).tag(config=True)

    max_connections_per_user = Integer(
        256,
        help="""Most preview connections one user may hold at once, all their sessions together; one more is
        refused with 429 PreviewConnectionsError. 0 means no cap.""",
    ).tag(config=True)

    origin_template = Unicode(
        "",
        help="""Empty (the default): previews are served on the Jupyter origin, kept apart from it by an
        opaque-origin CSP sandbox (an app's own script files, fetches and websockets are refused there). Set:
        each session port gets an origin of its own, e.g. 'https://{session}-{port}.previews.example.org' or,
        on one machine, 'http://{session}-{port}.preview.localhost:{server_port}'. {session} and {port} (the
        session id and the app's port) go in the host's first label; {server_port} (the port of the Jupyter
        URL the browser used) may be the origin's port. http:// only under .localhost. The operator serves
        that wildcard name (DNS, a wildcard certificate, a reverse proxy passing Host) to this server; a
        document opened on the Jupyter route is redirected there with a one-time code. Checked at start.""",
    ).tag(config=True)

    origin_cookie_seconds = Float(
        8 * 3600.0,
        help="""With origin_template set: how long the cookie a preview origin gives the browser (for that
        session port only) stays valid, in seconds; then the preview must be opened from Jupyter again. The
        session's owner is checked again on every request either way.""",
    ).tag(config=True)

    @validate("origin_template")
    def _valid_template(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if value:
            try:
                OriginTemplate(value)
            except ValueError as e:
                raise TraitError(str(e)) from None
        return value

    @property
    def origin(self) -> OriginTemplate | None:
        """The per-session origin template, or None (the opaque-origin mode)."""
        value = self.origin_template.strip()
        if not value:
            return None
        if self._origin is None or self._origin.template != value:
            self._origin = OriginTemplate(value)
        return self._origin

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._per_session: collections.Counter[str] = collections.Counter()
        self._per_user: collections.Counter[str] = collections.Counter()
        self._origin = None
        #: the one-time codes of the per-session origins (in this server's memory)
        self.codes = GrantCodes()
        self.origin  # noqa: B018  # a template set in a config file is checked now, at start

    def hold(self, session_id: str, user: str) -> None:
        """Count one connection of ``user`` to ``session_id``, or refuse it (429); give it back with
        :meth:`release`."""
        for count, key, limit, setting in (
            (self._per_session, session_id, self.max_connections_per_session, "max_connections_per_session"),
            (self._per_user, user, self.max_connections_per_user, "max_connections_per_user"),
        ):
            if limit and count[key] >= limit:
                raise PreviewConnectionsError(
                    f"{count[key]} preview connections are open, the most allowed "
                    f"(PreviewSettings.{setting} = {limit}): close one first"
                )
        self._per_session[session_id] += 1
        self._per_user[user] += 1

    def release(self, session_id: str, user: str) -> None:
        for count, key in ((self._per_session, session_id), (self._per_user, user)):
            count[key] -= 1
            if count[key] <= 0:
                del count[key]
