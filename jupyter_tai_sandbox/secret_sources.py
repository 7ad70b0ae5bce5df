"""Where the real values of the operator's secrets come from (``SandboxPolicy.secrets``), and how long each
is trusted: the server's environment (read once), a file (read again when it changes: rotation), or, in the
sandbox service under JupyterHub, the session owner's ``auth_state`` (read at create, and again in the
background once older than ``SandboxPolicy.auth_state_max_age``).

The policy decides which session gets which secret (``SandboxPolicy.effective_spec``); this module only
reads values, for the egress gateways (through the gate's ``EgressHooks``) and the transcript scrub. A
value never goes into a session: the session holds a placeholder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .contract import SandboxSpecRejectedError
from .contract.egress import SECRET_NAME_PATTERN, normalize_entries
from .labels import credential_key_problem

SOURCES = ("from_env", "from_file", "from_auth_state")
_FIELDS = frozenset({"hosts", *SOURCES, "env", "consumers", "query", "body"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AUTH_STATE_KEY = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")
#: why a secret from_auth_state has no value on a server that is not the sandbox service under a hub
AUTH_STATE_NEEDS_HUB = (
    "only the sandbox service under JupyterHub reads users' auth_state (jupyter tai-sandbox serve run by the "
    "hub as a service whose role holds the scopes admin:auth_state and read:users:name)"
)


class AuthStateSource(Protocol):
    """Where the secrets ``from_auth_state`` are read: JupyterHub users' ``auth_state``. The sandbox service
    under a hub sets one on its policy (:class:`jupyter_tai_sandbox.hub.HubAuthState`)."""

    async def auth_state(self, user: str) -> Mapping[str, Any] | None:
        """``user``'s auth_state (None: the user has none); SandboxError when the hub cannot tell."""
        ...


def auth_state_value(state: Any, key: str) -> str | None:
    """The string at ``key`` (a top-level key, or a dotted path 'a.b' into nested objects) of ``state``
    (None: not there, empty, or not a string)."""
    node = state
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, str) and node else None


def secret_setting(name: str, entry: Any) -> dict[str, Any]:
    """One entry of SandboxPolicy.secrets, normalised (defaults filled); ValueError naming what is wrong."""
    where = f"secrets[{name!r}]"
    if not isinstance(name, str) or not SECRET_NAME_PATTERN.match(name):
        raise ValueError(f"{where}: a secret's name is 1-128 letters, digits, '_', '.' or '-'")
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object with hosts and from_env or from_file")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_FIELDS))}"
        )
    sources = [k for k in SOURCES if entry.get(k)]
    if len(sources) != 1 or not isinstance(entry[sources[0]], str):
        raise ValueError(
            f"{where}: give exactly one of from_env (a variable name), from_file (a path) or from_auth_state "
            "(a key of the JupyterHub user's auth_state)"
        )
    if sources[0] == "from_auth_state" and not _AUTH_STATE_KEY.match(entry["from_auth_state"]):
        raise ValueError(
            f"{where}: from_auth_state {entry['from_auth_state']!r} is a key of the user's auth_state, or a "
            "dotted path 'a.b' into nested objects (no spaces, no empty part)"
        )
    env = entry.get("env", name)
    if not isinstance(env, str) or not _ENV_NAME.match(env):
        raise ValueError(f"{where}: env {env!r} is not an environment variable name (set env)")
    consumers = entry.get("consumers", ["*"])
    if not isinstance(consumers, list) or not consumers:
        raise ValueError(f"{where}: consumers is a list of consumer labels (or ['*'])")
    for label in consumers:
        problem = credential_key_problem(label)
        if problem:
            raise ValueError(f"{where}: {problem.replace('credential key', 'consumer')}")
    for flag in ("query", "body"):
        if not isinstance(entry.get(flag, False), bool):
            raise ValueError(f"{where}: {flag} is true or false")
    try:
        hosts = list(
            normalize_entries(entry.get("hosts") or (), what=f"{where} hosts", any_name=False, ports=False)
        )
    except SandboxSpecRejectedError as e:
        raise ValueError(str(e)) from None
    if not hosts:
        raise ValueError(f"{where}: name the hosts the secret may be sent to (hosts)")
    return {
        "hosts": hosts,
        sources[0]: entry[sources[0]],
        "env": env,
        "consumers": list(consumers),
        "query": bool(entry.get("query", False)),
        "body": bool(entry.get("body", False)),
    }


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


@dataclasses.dataclass
class AuthStateCopy:
    """What is kept of one hub user's auth_state: the values at the secrets' keys only."""

    values: dict[str, str] = dataclasses.field(default_factory=dict)
    #: when they were read (time.monotonic()); None: never
    fetched: float | None = None
    #: the read under way (a create's, or a refresh a gateway's ask started)
    task: asyncio.Future[None] | None = None


class SecretValues:
    """The current values of a policy's secrets. ``settings`` returns the checked ``SandboxPolicy.secrets``;
    ``source`` the auth_state source (None: not a hub service); ``max_age`` how long an auth_state copy is
    used before it is read again."""

    def __init__(
        self,
        settings: Callable[[], Mapping[str, Mapping[str, Any]]],
        source: Callable[[], AuthStateSource | None],
        max_age: Callable[[], float],
        log: Any,
    ) -> None:
        self._settings = settings
        self._source = source
        self._max_age = max_age
        self.log = log
        #: secret name -> (file stamp or None, value): from_env values and from_file values as last read
        self._cache: dict[str, tuple[Any, str | None]] = {}
        #: hub user -> the values of their auth_state at the secrets' keys
        self.auth_states: dict[str, AuthStateCopy] = {}

    def forget(self) -> None:
        """The settings changed: read every value again."""
        self._cache = {}

    def value(self, name: str, owner: str | None = None) -> str | None:
        """The current real value of secret ``name`` for the sessions of ``owner`` (None: no such secret, or
        its source is missing). A from_env value is read once; a from_file one again whenever the file
        changes (its rotation); a from_auth_state one is ``owner``'s own, as last read from the hub (see
        :meth:`prepare`): once older than ``max_age`` this starts reading it again in the background, so a
        change in the hub reaches the gateways (which ask every 2 s) within about that time."""
        entry = self._settings().get(name)
        if entry is None:
            return None
        if "from_auth_state" in entry:
            return self._auth_state_value(entry["from_auth_state"], owner)
        if "from_env" in entry:
            if name not in self._cache:
                self._cache[name] = (None, os.environ.get(entry["from_env"]) or None)
            return self._cache[name][1]
        path = entry["from_file"]
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._cache.get(name)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            with open(path, encoding="utf-8") as f:
                value: str | None = f.read().strip() or None
        except (OSError, UnicodeDecodeError):
            return None
        self._cache[name] = (stamp, value)
        return value

    def values(self) -> list[str]:
        """Every secret's current real value (for the transcript scrub): a from_auth_state secret's of every
        user read so far."""
        found = []
        for name, entry in self._settings().items():
            if "from_auth_state" in entry:
                key = entry["from_auth_state"]
                found += [c.values[key] for c in self.auth_states.values() if c.values.get(key)]
            else:
                value = self.value(name)
                if value:
                    found.append(value)
        return found

    def missing(self, name: str, owner: str | None) -> str:
        """Why secret ``name`` has no value for ``owner``'s session, for the refusal."""
        entry = self._settings()[name]
        if "from_env" in entry:
            return f"its environment variable {entry['from_env']} is missing or empty"
        if "from_file" in entry:
            return f"its file {entry['from_file']} is missing or empty"
        key = entry["from_auth_state"]
        if self._source() is None:
            return f"it is read from the JupyterHub user's auth_state (from_auth_state {key!r}), and {AUTH_STATE_NEEDS_HUB}"
        if owner is None:
            return f"it is read from the session owner's JupyterHub auth_state (from_auth_state {key!r}), and the session has no owner"
        return (
            f"key {key!r} is not in hub user {owner!r}'s auth_state (or it is empty, not a string, or "
            "the user has no auth_state: the hub's authenticator puts it there at login, with "
            "c.Authenticator.enable_auth_state)"
        )

    # ---------------------------------------------------------- JupyterHub's auth_state

    def auth_state_keys(self, names: list[str] | None = None) -> list[str]:
        """The auth_state keys of the secrets from_auth_state among ``names`` (None: all)."""
        settings = self._settings()
        keys = [settings[n].get("from_auth_state") for n in (list(settings) if names is None else names)]
        return sorted({k for k in keys if k})

    def _auth_state_value(self, key: str, owner: str | None) -> str | None:
        if owner is None:
            return None
        copy = self.auth_states.get(owner)
        if copy is None or copy.fetched is None or time.monotonic() - copy.fetched >= self._max_age():
            self._refresh(owner)
        return None if copy is None else copy.values.get(key)

    def _refresh(self, owner: str) -> None:
        """Read ``owner``'s auth_state again in the background (nothing when one read is under way, there
        is no source, or no event loop runs here)."""
        if self._source() is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        copy = self.auth_states.setdefault(owner, AuthStateCopy())
        if copy.task is not None and not copy.task.done():
            return
        copy.task = asyncio.ensure_future(self._read(owner, quiet=True))

    async def _read(self, owner: str, *, quiet: bool = False) -> None:
        """Read ``owner``'s auth_state from the source and keep the values at the secrets' keys (the rest
        of it is not kept). ``quiet``: a failure is logged (the values read last stay) instead of raised."""
        source = self._source()
        copy = self.auth_states.setdefault(owner, AuthStateCopy())
        try:
            if source is None:
                raise SandboxSpecRejectedError(AUTH_STATE_NEEDS_HUB)
            state = await source.auth_state(owner)
        except Exception as e:
            copy.fetched = time.monotonic()  # asked again after max_age, not at every ask
            if not quiet:
                raise
            self.log.warning("tai-sandbox: could not read hub user %r's auth_state again: %s", owner, e)
            return
        copy.values = {k: v for k in self.auth_state_keys() if (v := auth_state_value(state, k)) is not None}
        copy.fetched = time.monotonic()

    async def prepare(self, owner: str | None, names: list[str] | None = None) -> None:
        """Before a create (or a live change, a fork) of ``owner``'s session granted the secrets ``names``
        (None: all): when one is from_auth_state, read ``owner``'s auth_state unless the values read last
        are younger than ``max_age`` and hold every key. A hub that cannot tell raises its SandboxError."""
        keys = self.auth_state_keys(names)
        if owner is None or self._source() is None or not keys:
            return
        copy = self.auth_states.get(owner)
        if (
            copy is not None
            and copy.fetched is not None
            and time.monotonic() - copy.fetched < self._max_age()
            and all(k in copy.values for k in keys)
            and (copy.task is None or copy.task.done())
        ):
            return
        if copy is not None and copy.task is not None and not copy.task.done():
            await asyncio.shield(copy.task)  # a read under way (a refresh): its answer, then read anew
        copy = self.auth_states.setdefault(owner, AuthStateCopy())
        task = copy.task = asyncio.ensure_future(self._read(owner))
        task.add_done_callback(_retrieved)  # a create cancelled meanwhile leaves no unretrieved error
        await asyncio.shield(task)
