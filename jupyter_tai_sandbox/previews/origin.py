"""Per-session preview origins: the template, the one-time codes and the preview host's own cookie.

With :attr:`.settings.PreviewSettings.origin_template` set (e.g. ``http://{session}-{port}.preview.localhost:{server_port}``
or ``https://{session}-{port}.previews.example.org``), a browser's document GET of the Jupyter-origin route
``/api/sandbox/sessions/{id}/ports/{port}/{path}`` (jupyter_server's auth, the owner rules) is redirected to
that session port's own origin with a **one-time code** (:class:`GrantCodes`: random, single use, valid
:data:`CODE_SECONDS`, bound to the user, the session and the port, kept in this server's memory), to
:data:`GRANT_PATH`. The preview host exchanges it for a cookie of its own (:class:`PreviewCookies`: host-only,
HttpOnly, Secure, SameSite=None, Partitioned, ``__Host-`` prefixed; an HMAC over the user, the actions the
Authorizer granted, the session, the port and an expiry) and redirects to the clean ``next`` path. Every
request on the preview host is checked against that cookie and the session's owner again, then proxied to the
port. Jupyter's own cookies are host-only, so they never reach a preview host.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "CODE_SECONDS",
    "COOKIE_NAME",
    "GRANT_PATH",
    "Grant",
    "GrantCodes",
    "OriginTemplate",
    "PreviewCookies",
    "safe_next",
]

#: the preview host's path that exchanges a one-time code for the host's cookie
GRANT_PATH = "/__tai_preview_grant"
#: how long a one-time code is valid, in seconds
CODE_SECONDS = 30.0
#: the preview host's cookie: ``__Host-`` (Secure, Path=/, no Domain: only that very host may set it, so a
#: page of another preview under the same parent domain can neither set nor shadow it)
COOKIE_NAME = "__Host-tai-preview"
#: a session id that fits in a DNS label (lower case; docker, swarm and vm ids are ``sbx-`` and hex)
_LABEL_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_HOST_CHARS = re.compile(r"[a-z0-9.-]+")


class OriginTemplate:
    """A validated ``PreviewSettings.origin_template``: ``scheme://host[:port]`` whose host holds ``{session}``
    and ``{port}`` (the session id and the app's port) and whose port may be ``{server_port}`` (the port of
    the Jupyter URL the browser used). ``http`` only for hosts under ``.localhost`` (browsers take Secure
    cookies there, and resolve it to loopback themselves); ``https`` anywhere."""

    def __init__(self, template: str) -> None:
        self.template = template
        where = f"PreviewSettings.origin_template = {template!r}"
        for name in _PLACEHOLDER.findall(template):
            if name not in ("session", "port", "server_port"):
                raise ValueError(
                    f"{where}: unknown placeholder {{{name}}} (use {{session}}, {{port}}, {{server_port}})"
                )
        probe = template.replace("{session}", "s").replace("{port}", "1").replace("{server_port}", "1")
        parts = urlsplit(probe)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{where}: an origin, http:// or https://host[:port]")
        if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
            raise ValueError(f"{where}: an origin only (no path, query, fragment or user)")
        self.scheme = parts.scheme
        netloc = template.split("://", 1)[1].rstrip("/")
        host, _, port = (
            netloc.rpartition(":") if re.search(r":(\d+|\{server_port\})$", netloc) else (netloc, "", "")
        )
        if "{server_port}" in host:
            raise ValueError(f"{where}: {{server_port}} belongs after the host, as its port")
        if host.count("{session}") != 1 or host.count("{port}") != 1:
            raise ValueError(f"{where}: the host must hold {{session}} and {{port}} once each")
        if host != host.lower() or not _HOST_CHARS.fullmatch(_PLACEHOLDER.sub("x", host)):
            raise ValueError(f"{where}: the host must be lower-case letters, digits, '-' and '.'")
        first_label = host.split(".", 1)[0]
        if "{session}" not in first_label or "{port}" not in first_label:
            raise ValueError(
                f"{where}: {{session}} and {{port}} must both be in the first label (one wildcard name and "
                "certificate, *.<the rest>, then covers every session port)"
            )
        rest = host.split(".", 1)[1] if "." in host else ""
        if not rest or ("." not in rest and rest != "localhost"):
            raise ValueError(f"{where}: the host needs a parent domain under the first label")
        if self.scheme == "http" and not (rest == "localhost" or rest.endswith(".localhost")):
            raise ValueError(
                f"{where}: http:// only under .localhost (browsers refuse the preview's Secure cookie over "
                "plain http elsewhere); use https:// with a wildcard certificate"
            )
        self.host = host
        self.port = port
        pattern = re.escape(host).replace(re.escape("{session}"), "(?P<session>[a-z0-9-]+?)")
        pattern = pattern.replace(re.escape("{port}"), "(?P<port>[1-9][0-9]{0,4})")
        self._host_re = re.compile(pattern)
        #: tornado's host pattern (matched against the request's host name, without its port)
        self.host_pattern = pattern + "$"

    @staticmethod
    def fits(session_id: str) -> bool:
        """A session id that can be part of a host name (others stay on the opaque-origin route)."""
        return bool(_LABEL_ID.fullmatch(session_id)) and len(session_id) <= 50

    def origin(self, session_id: str, port: int, server_port: str) -> str:
        host = self.host.replace("{session}", session_id).replace("{port}", str(port))
        given = self.port.replace("{server_port}", server_port)
        default = "443" if self.scheme == "https" else "80"
        return f"{self.scheme}://{host}" + (f":{given}" if given and given != default else "")

    def parse(self, host_name: str) -> tuple[str, int] | None:
        """(session id, port) of a preview host name, or None."""
        found = self._host_re.fullmatch(host_name.lower())
        if found is None:
            return None
        port = int(found.group("port"))
        return (found.group("session"), port) if 0 < port < 65536 else None


@dataclass(frozen=True)
class Grant:
    """What a code or a cookie grants: ``user`` (with the admin actions and the session actions the
    Authorizer gave it when the code was issued) the app on ``port`` of ``session``, until ``expires``."""

    user: str
    admin_actions: frozenset[str]
    actions: frozenset[str]
    session: str
    port: int
    expires: float


class GrantCodes:
    """One-time codes, in memory: each redeemable once, within :data:`CODE_SECONDS`, for its session port."""

    def __init__(self, seconds: float = CODE_SECONDS) -> None:
        self.seconds = seconds
        self._codes: dict[str, Grant] = {}

    def issue(
        self, user: str, admin_actions: frozenset[str], actions: frozenset[str], session: str, port: int
    ) -> str:
        now = time.monotonic()
        for code in [code for code, grant in self._codes.items() if grant.expires <= now]:
            del self._codes[code]
        code = secrets.token_urlsafe(32)
        self._codes[code] = Grant(user, admin_actions, actions, session, port, now + self.seconds)
        return code

    def redeem(self, code: str, session: str, port: int) -> Grant | None:
        """The code's grant, if it is live and for this session port; the code is spent either way."""
        grant = self._codes.pop(code, None)
        if (
            grant is None
            or grant.expires <= time.monotonic()
            or (grant.session, grant.port) != (session, port)
        ):
            return None
        return grant


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PreviewCookies:
    """The preview host's cookie value: ``payload.mac``, an HMAC-SHA256 (a key derived from the server's
    secret) over the user, their actions, the session, the port and an expiry (wall clock)."""

    def __init__(self, secret: bytes, max_age: float) -> None:
        self._key = hmac.new(secret, b"jupyter-tai-sandbox preview origin cookie", hashlib.sha256).digest()
        self.max_age = max_age

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def make(self, grant: Grant) -> str:
        body = {
            "u": grant.user,
            "a": sorted(grant.admin_actions),
            "x": sorted(grant.actions),
            "s": grant.session,
            "p": grant.port,
            "e": int(time.time() + self.max_age),
        }
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{payload}.{self._mac(payload)}"

    def check(self, value: str, session: str, port: int) -> Grant | None:
        """The grant of a cookie value made by :meth:`make`, if its MAC holds, it has not expired and it is
        for this session port; else None."""
        payload, _, mac = value.partition(".")
        if not mac or not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            body = json.loads(_unb64(payload))
            grant = Grant(
                str(body["u"]),
                frozenset(body["a"]),
                frozenset(body["x"]),
                str(body["s"]),
                int(body["p"]),
                float(body["e"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        if grant.expires <= time.time() or (grant.session, grant.port) != (session, port):
            return None
        return grant


def safe_next(value: str | None) -> str:
    """A grant's ``next``: a path on the preview host itself (``/...``, never ``//host`` or a scheme), else
    ``/``."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    if any(ord(ch) < 0x21 for ch in value):
        return "/"
    return value
