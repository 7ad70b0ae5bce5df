"""A session's egress policy: which host names it may reach through its owner's egress gateway, and the
secrets the gateway swaps in for their placeholders on their own hosts.

A spec with ``egress`` set (:class:`EgressPolicy`) and ``network="egress"`` reaches the outside only
through the gateway, which answers DNS for allowed names only and checks every connection's Host or SNI.

Entries (of ``allow``, ``deny`` and a secret's ``hosts``), lower-cased, IDNA (ASCII), trailing dot dropped:

* ``example.com``: that name only, on ports 80 and 443;
* ``*.example.com``: any name under it (not ``example.com`` itself), on ports 80 and 443;
* ``*``: any name on ports 80 and 443 (in ``allow`` only);
* ``NAME:PORT`` / ``*.NAME:PORT``: raw TCP to that port (not 53, 80 or 443: the plain name is for those).

``deny`` wins over ``allow``: a deny entry without a port refuses every port of the names it matches, one
with a port that port only. An IP literal, ``*`` inside a label, an empty label, a port outside 1..65535
or more than :data:`MAX_ENTRIES` entries is refused (:class:`SandboxSpecRejectedError`, 400) naming the
entry. Secrets (:class:`SecretGrant`) are the operator's to grant (the policy sets them), never a
caller's: a request body naming them is refused.
"""

from __future__ import annotations

import ipaddress
import re
import secrets as _random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .errors import SandboxSpecRejectedError

#: the most entries one list (allow, deny, a secret's hosts) may hold
MAX_ENTRIES = 256
#: the ports a plain name entry allows (HTTP and TLS); a raw ``NAME:PORT`` entry names none of them, nor DNS
WEB_PORTS = (80, 443)
_NOT_RAW_PORTS = frozenset({53, *WEB_PORTS})
PLACEHOLDER_PREFIX = "tai-placeholder-"
PLACEHOLDER_PATTERN = re.compile(r"^tai-placeholder-[0-9a-f]{32}$")
#: a secret's name: also the name of the gateway's file of it, so a safe file name
SECRET_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_POLICY_FIELDS = frozenset({"allow", "deny", "secrets"})
_GRANT_FIELDS = ("name", "env", "placeholder", "hosts", "query", "body")


def _reject(message: str) -> SandboxSpecRejectedError:
    return SandboxSpecRejectedError(message)


class Entry(NamedTuple):
    """One parsed entry: ``name`` is ``*`` (any), ``*.suffix`` (under suffix) or an exact name; ``port`` is
    None for a plain entry (ports 80 and 443)."""

    name: str
    port: int | None

    @property
    def any_name(self) -> bool:
        return self.name == "*"

    @property
    def wildcard(self) -> bool:
        return self.name.startswith("*.")

    def __str__(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"

    def matches(self, host: str, port: int) -> bool:
        """Whether this entry admits ``host`` (a normalised name) on ``port``."""
        if self.port is None:
            if port not in WEB_PORTS:
                return False
        elif port != self.port:
            return False
        return name_matches(self.name, host)

    def covers(self, other: Entry) -> bool:
        """Whether every (name, port) ``other`` admits this entry admits too (a ceiling entry over a spec's)."""
        if self.port != other.port:
            return False
        if self.any_name:
            return True
        if other.any_name:
            return False
        if self.wildcard:
            suffix = self.name[1:]  # ".example.com"
            return other.name.endswith(suffix) and len(other.name) > len(suffix)
        return not other.wildcard and other.name == self.name


def name_matches(pattern: str, host: str) -> bool:
    """Whether the name part of an entry admits ``host``: ``*`` any, ``*.x`` any name under x, else equal."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        suffix = pattern[1:]
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def normalize_host(host: str) -> str:
    """A host name as entries are matched: lower-cased, IDNA (ASCII), no trailing dot. ValueError when it
    is not one."""
    host = host.strip().rstrip(".").lower()
    if not host:
        raise ValueError("empty name")
    try:
        host.encode("ascii")
    except UnicodeEncodeError:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as e:
            raise ValueError(f"not a valid international name ({e})") from None
    return host


def _is_ip_literal(name: str) -> bool:
    text = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(text)
    except ValueError:
        # no top-level domain is all digits: 10.1 or 0x7f.1 is an address to a resolver, never a name
        last = name.rsplit(".", 1)[-1]
        return bool(last) and (last.isdigit() or bool(re.fullmatch(r"0x[0-9a-f]+", last)))
    return True


def parse_entry(text: Any, *, what: str = "allow", any_name: bool = True, ports: bool = True) -> Entry:
    """One entry of ``what`` (named in the refusal), or SandboxSpecRejectedError naming it."""

    def bad(why: str) -> SandboxSpecRejectedError:
        return _reject(f"egress {what} entry {str(text)[:300]!r}: {why}")

    if not isinstance(text, str):
        raise _reject(f"egress {what} entries are strings (host names), not {type(text).__name__}")
    raw = text.strip()
    port: int | None = None
    name = raw
    if raw.count(":") == 1 and not raw.startswith("["):
        name, _, port_text = raw.partition(":")
        if not ports:
            raise bad("a port is not allowed here: name the host only")
        if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            raise bad("the port must be a number from 1 to 65535")
        port = int(port_text)
        if port in _NOT_RAW_PORTS:
            raise bad(
                f"port {port} is not a raw port: a plain name allows ports 80 and 443, and DNS is the gateway's"
            )
    elif ":" in raw:
        raise bad("an IP literal: name a host (the gateway resolves it), not an address")
    if "\x00" in name or any(c.isspace() for c in name):
        raise bad("a host name has no spaces or NUL bytes")
    if name == "*":
        if not any_name:
            raise bad("'*' (any name) is for allow only")
        if port is not None:
            raise bad("'*' with a port: a raw port needs a named host (or '*.NAME:PORT')")
        return Entry("*", None)
    wildcard = name.startswith("*.")
    try:
        host = normalize_host(name[2:] if wildcard else name)
    except ValueError as e:
        raise bad(str(e)) from None
    if _is_ip_literal(host):
        raise bad("an IP literal: name a host (the gateway resolves it), not an address")
    if len(host) > 253:
        raise bad("a host name is at most 253 characters")
    for label in host.split("."):
        if not label:
            raise bad("an empty label (two dots, or a leading dot)")
        if "*" in label:
            raise bad("'*' only as the whole first label ('*.example.com')")
        if not _LABEL.match(label):
            raise bad(f"label {label[:70]!r} is not 1-63 letters, digits, '-' or '_'")
    return Entry(f"*.{host}" if wildcard else host, port)


def normalize_entries(
    values: Any, *, what: str = "allow", any_name: bool = True, ports: bool = True
) -> tuple[str, ...]:
    """A list of entries, each parsed and written back normalised, duplicates dropped (order kept)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise _reject(f'egress {what} must be a list of host names, e.g. ["pypi.org", "*.github.com"]')
    out: list[str] = []
    for value in values:
        entry = str(parse_entry(value, what=what, any_name=any_name, ports=ports))
        if entry not in out:
            out.append(entry)
        if len(out) > MAX_ENTRIES:
            raise _reject(f"egress {what} has more than {MAX_ENTRIES} entries")
    return tuple(out)


def entries_match(entries: Iterable[str], host: str, port: int) -> bool:
    """Whether any of ``entries`` (normalised) admits ``host`` on ``port``."""
    try:
        host = normalize_host(host)
    except ValueError:
        return False
    return any(parse_entry(e).matches(host, port) for e in entries)


def uncovered(ceiling: Sequence[str] | None, entries: Iterable[str]) -> str | None:
    """The first of ``entries`` that no entry of ``ceiling`` covers (None: all are covered). A ceiling of
    None is ``*``: any name on ports 80 and 443, no raw port."""
    limits = [parse_entry(e) for e in (("*",) if ceiling is None else ceiling)]
    for text in entries:
        entry = parse_entry(text)
        if not any(limit.covers(entry) for limit in limits):
            return text
    return None


def new_placeholder() -> str:
    """A random placeholder for one secret in one session."""
    return PLACEHOLDER_PREFIX + _random.token_hex(16)


@dataclass(frozen=True)
class SecretGrant:
    """One secret granted to a session: the session's ``env`` holds ``placeholder``, and the gateway swaps
    in the real value of the operator's secret ``name`` on requests to ``hosts`` (headers; the URL query when
    ``query``, a bounded body when ``body``)."""

    name: str
    env: str
    placeholder: str
    hosts: tuple[str, ...]
    query: bool = False
    body: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not SECRET_NAME_PATTERN.match(self.name):
            raise _reject(
                f"secret name {str(self.name)[:130]!r}: use 1-128 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit"
            )
        if not isinstance(self.env, str) or not _ENV_NAME_PATTERN.match(self.env):
            raise _reject(f"secret {self.name}: invalid environment variable name {self.env!r}")
        if not isinstance(self.placeholder, str) or not PLACEHOLDER_PATTERN.match(self.placeholder):
            raise _reject(f"secret {self.name}: a placeholder is {PLACEHOLDER_PREFIX} and 32 hex digits")
        hosts = normalize_entries(self.hosts, what=f"secret {self.name} hosts", any_name=False, ports=False)
        if not hosts:
            raise _reject(f"secret {self.name}: name the hosts it may be sent to")
        for flag in ("query", "body"):
            if not isinstance(getattr(self, flag), bool):
                raise _reject(f"secret {self.name}: {flag} is true or false")
        object.__setattr__(self, "hosts", hosts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "env": self.env,
            "placeholder": self.placeholder,
            "hosts": list(self.hosts),
            "query": self.query,
            "body": self.body,
        }

    @classmethod
    def from_json(cls, data: Any) -> SecretGrant:
        if not isinstance(data, Mapping):
            raise _reject("a secret grant is a JSON object")
        unknown = sorted(set(data) - set(_GRANT_FIELDS))
        missing = [f for f in ("name", "env", "placeholder", "hosts") if f not in data]
        if unknown or missing:
            raise _reject(
                f"secret grant: unknown field(s) {unknown}, missing {missing}; fields: {', '.join(_GRANT_FIELDS)}"
            )
        return cls(
            name=data["name"],
            env=data["env"],
            placeholder=data["placeholder"],
            hosts=data["hosts"],
            query=data.get("query", False),
            body=data.get("body", False),
        )


@dataclass(frozen=True)
class EgressPolicy:
    """A session's egress policy (``SessionSpec.egress``): ``allow`` None admits any name on ports 80 and
    443; ``deny`` wins over it; ``secrets`` are the operator's grants (the policy sets them)."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    secrets: tuple[SecretGrant, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.allow is not None:
            object.__setattr__(self, "allow", normalize_entries(self.allow, what="allow"))
        object.__setattr__(self, "deny", normalize_entries(self.deny, what="deny", any_name=False))
        if isinstance(self.secrets, (str, bytes, Mapping)) or not isinstance(self.secrets, Iterable):
            raise _reject("egress secrets must be a list of secret grants")
        grants = tuple(g if isinstance(g, SecretGrant) else SecretGrant.from_json(g) for g in self.secrets)
        names = [g.name for g in grants]
        envs = [g.env for g in grants]
        if len(set(names)) != len(names) or len(set(envs)) != len(envs):
            raise _reject("egress secrets: each secret, and each environment variable, at most once")
        object.__setattr__(self, "secrets", grants)

    @property
    def needs_gateway(self) -> bool:
        """Always True: a session with a policy goes out through the gateway (no policy: plain egress)."""
        return True

    def allows(self, host: str, port: int = 443) -> bool:
        """Whether the policy admits ``host`` on ``port``: not denied, and allowed (allow None: ports 80/443)."""
        try:
            name = normalize_host(host)
        except ValueError:
            return False
        for text in self.deny:
            entry = parse_entry(text, what="deny", any_name=False)
            if name_matches(entry.name, name) and (entry.port is None or entry.port == port):
                return False
        allow = ("*",) if self.allow is None else self.allow
        return entries_match(allow, name, port)

    def secret(self, name: str) -> SecretGrant | None:
        return next((g for g in self.secrets if g.name == name), None)

    def replace(self, **changes: Any) -> EgressPolicy:
        import dataclasses

        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "allow": None if self.allow is None else list(self.allow),
            "deny": list(self.deny),
            "secrets": [g.to_json() for g in self.secrets],
        }

    @classmethod
    def from_json(cls, data: Any, *, secrets: bool = True) -> EgressPolicy:
        """The inverse of :meth:`to_json`; ``secrets=False`` (a caller's request body) refuses ``secrets``:
        the operator grants them."""
        if isinstance(data, EgressPolicy):
            data = data.to_json()
        if not isinstance(data, Mapping):
            raise _reject('egress must be an object like {"allow": ["pypi.org"], "deny": []}')
        unknown = sorted(set(data) - _POLICY_FIELDS)
        if unknown:
            raise _reject(f"unknown egress field(s): {', '.join(unknown)}; known: allow, deny")
        if not secrets and data.get("secrets"):
            raise _reject(
                "egress secrets are granted by the operator (SandboxPolicy.secrets), never named in a request"
            )
        allow = data.get("allow")
        deny = data.get("deny")
        return cls(
            allow=None if allow is None else allow,
            deny=() if deny is None else deny,
            secrets=(data.get("secrets") or ()) if secrets else (),
        )


class EgressHooks(Protocol):
    """What a provider's gateway asks of the server: a secret's current real value, and where an audit
    line goes. The gate sets one on its provider (:attr:`Sandbox.egress_hooks`)."""

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        """The current real value of the operator's secret ``name`` for the sessions of ``owner`` (None: no
        such secret, or its source is gone). A gateway serves one owner and passes it: a secret read from
        the owner's JupyterHub ``auth_state`` has a value of each owner's own."""
        ...

    def audit(self, record: Mapping[str, Any]) -> None:
        """Keep one audit line (the gateway's decision on a connection, a query or a substitution)."""
        ...


__all__ = [
    "MAX_ENTRIES",
    "PLACEHOLDER_PATTERN",
    "PLACEHOLDER_PREFIX",
    "WEB_PORTS",
    "EgressHooks",
    "EgressPolicy",
    "Entry",
    "SecretGrant",
    "entries_match",
    "name_matches",
    "new_placeholder",
    "normalize_entries",
    "normalize_host",
    "parse_entry",
    "uncovered",
]
