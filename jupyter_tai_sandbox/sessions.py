"""Who may use which session: principals, owners, the consumer label, per-user limits.

Every door that acts for a user (REST, the exec websocket, tool runs, and the
magics and the panel through REST) goes through :class:`SessionRegistry`:

* a session records its **owner**, the principal that created it;
* a caller sees and acts on its own sessions only; another user's session id
  answers exactly like an unknown one (404), so ids leak nothing;
* the **consumer** label (which picks the operator's credentials) is a typed label
  (:mod:`jupyter_tai_sandbox.labels`) derived from the caller: ``user:NAME``, or a label
  under it (``user:NAME/...``); naming another consumer is an admin act;
* a caller holds at most ``SandboxPolicy.max_sessions_per_user`` live sessions, and
  ``SandboxPolicy.max_kernels_per_user`` sandboxed kernels (consumer ``kernel:...``) beside them;
* a persistent workspace in use by a live session cannot be removed (409);
* the rest of the request acts for the caller (``fair_share.act_for``), so a provider's
  worker pool gives one user at most their share of it.

An **admin** is a caller the server's Authorizer grants ``read`` (see all) or
``write`` (manage all) on ``jupyter_tai_sandbox:admin``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import getpass
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_server.auth.identity import IdentityProvider, LegacyIdentityProvider, PasswordIdentityProvider

from . import labels, sandboxes
from .contract import (
    SandboxError,
    SandboxSession,
    SandboxUnavailableError,
    SessionInfo,
    SessionSpec,
    is_positive_number,
    session_gone,
)
from .errors import SandboxConflictError, SandboxForbiddenError, SandboxQuotaError, SandboxRequestError
from .fair_share import act_for
from .providers._workspaces import workspace_identity

#: what a session id may look like (anything else is answered like an unknown id, before a provider sees it)
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: the Authorizer resource of every session route (read / write / execute)
AUTH_RESOURCE = "jupyter_tai_sandbox:sessions"
#: the Authorizer resource of the admin tier: all users' sessions, other consumers, the code-tool fence
ADMIN_RESOURCE = "jupyter_tai_sandbox:admin"
#: jupyter_server's own providers: one shared secret, and a random anonymous user per request.
SHARED_SECRET_PROVIDERS = (IdentityProvider, PasswordIdentityProvider, LegacyIdentityProvider)


@functools.lru_cache(maxsize=1)
def server_owner() -> str:
    """The principal of a server whose only credential is its token or password."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # pragma: no cover - a uid without a passwd entry
        return "owner"


def principal_name(identity_provider: Any, user: Any) -> str:
    """Who a request acts for.

    With jupyter_server's own token/password identity provider every authenticated
    caller holds the same secret (and gets an invented anonymous name per request),
    so all of them are one principal: the server's owner. With any other
    IdentityProvider (JupyterHub's, a custom one) the principal is ``user.username``.
    """
    if type(identity_provider) in SHARED_SECRET_PROVIDERS:
        return server_owner()
    name = getattr(user, "username", None)
    if not isinstance(name, str) or not name:
        raise SandboxForbiddenError("the identity provider gave this request no user name")
    return name


_SESSIONS, _KERNELS = "sessions", "kernels"


def _quota_of(consumer: str) -> str:
    """Which per-user quota a session of ``consumer`` counts against."""
    return _KERNELS if labels.kind_of(consumer) == labels.KERNEL else _SESSIONS


@dataclass(frozen=True)
class Caller:
    """An authenticated principal and the admin actions the Authorizer grants it."""

    name: str
    admin_actions: frozenset[str] = frozenset()

    @property
    def sees_all(self) -> bool:
        return "read" in self.admin_actions or "write" in self.admin_actions

    @property
    def manages_all(self) -> bool:
        return "write" in self.admin_actions

    @property
    def consumer(self) -> str:
        """The caller's own consumer label, ``user:NAME`` (typed: no tool or kernel label can equal it)."""
        return labels.user_label(self.name)

    def owns_consumer(self, consumer: str) -> bool:
        """A consumer label of the caller's own: ``user:NAME``, or a label under it (``user:NAME/kernel:1``),
        which a server acting for this user (the remote provider) gives its kernels and tools."""
        return labels.is_under(consumer, self.consumer)

    def may(self, action: str) -> bool:
        """Whether ``action`` on ``jupyter_tai_sandbox:admin`` is granted (the tools' fence asks this)."""
        return action in self.admin_actions


class SessionRegistry:
    """The sessions this server created (shutdown stops exactly those), and the owner rules of every door."""

    def __init__(self, policy: Any = None, access: sandboxes.SandboxAccess | None = None) -> None:
        self.ids: set[str] = set()
        self.policy = policy
        #: the server's own sandbox (SandboxApp.access); the process default outside a server
        self.access = access if access is not None else sandboxes.PROCESS_ACCESS
        # the per-user quota without a race: a create reserves its slot before its first await
        # (owner, quota) -> creates in flight
        self._creating: collections.Counter[tuple[str, str]] = collections.Counter()
        self._counts_from: collections.Counter[int] = collections.Counter()  # counts under way, by start mark
        self._finished: list[
            tuple[int, tuple[str, str], str]
        ] = []  # (mark, slot, id): creates done while a count ran
        self._mark = 0
        #: set when the server stops: no create starts, and one that was under way is destroyed as it ends
        self.stopping = False
        #: one future per create under way, done once it has ended (made, refused, or destroyed at a stop)
        self._under_way: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------- create

    async def create(self, spec: SessionSpec, caller: Caller | None = None) -> SandboxSession:
        """Create through the policy gate, the spec decided for ``caller`` first (SandboxPolicy.effective_spec:
        an owner or consumer not theirs, an image off the list, a TTL over the maximum are refused before
        anything is counted), then within its owner's quota.

        The owner's slot is reserved before the first await and released when the create
        ends (a failed create gives it back), so concurrent creates cannot pass the quota.
        A kernel's session (consumer ``kernel:...``) counts against the owner's kernel quota,
        any other against the session quota.
        """
        sandbox = self.access.require()
        await sandbox.prepare(spec, caller)  # what deciding needs read first (a hub user's auth_state)
        spec = sandbox.effective_spec(spec, caller)
        return await self._made(spec, caller, lambda: sandbox.create(spec))

    async def fork(self, source: SandboxSession, caller: Caller | None = None) -> SandboxSession:
        """Fork ``source`` (a session the caller may manage) through the gate: the copy is a new session of the
        same owner, counted against the same quota as a create, reserved the same way."""
        spec = (await source.info()).spec
        return await self._made(spec, caller, source.fork)

    async def _made(
        self,
        spec: SessionSpec,
        caller: Caller | None,
        make: Callable[[], Awaitable[SandboxSession]],
    ) -> SandboxSession:
        """A new session of ``spec`` by ``make``, within its owner's quota (see :meth:`create`)."""
        if self.stopping:
            raise _stopping()
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._under_way.add(ended)
        try:
            return await self._make(spec, caller, make)
        finally:
            self._under_way.discard(ended)
            ended.set_result(None)

    async def _make(
        self,
        spec: SessionSpec,
        caller: Caller | None,
        make: Callable[[], Awaitable[SandboxSession]],
    ) -> SandboxSession:
        owner = spec.owner or (caller.name if caller is not None else None)
        if caller is not None:
            act_for(caller.name)  # the provider's work from here on counts against the caller's share
        slot = (owner, _quota_of(spec.consumer)) if owner is not None else None
        if slot is not None:
            self._creating[slot] += 1  # the reservation: counted by every concurrent check from now on
        session: SandboxSession | None = None
        try:
            if caller is not None and slot is not None:
                await self._check_quota(slot)
            session = await make()
            if self.stopping:  # the server's stop has destroyed what it held: this one would outlive it
                made, session = session, None
                with contextlib.suppress(SandboxError):
                    await made.destroy(remove_workspace=False)
                raise _stopping()
            self.ids.add(session.id)
            return session
        finally:
            if slot is not None:
                self._release(slot, session.id if session is not None else None)

    async def creates_ended(self, timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) for the creates under way to end: a server that stops sets
        :attr:`stopping` first, so each destroys what it made as it ends. How many had not ended in time."""
        under_way = list(self._under_way)
        if not under_way:
            return 0
        _, pending = await asyncio.wait(under_way, timeout=timeout)
        return len(pending)

    def _release(self, slot: tuple[str, str], session_id: str | None) -> None:
        """A create ended: its reservation becomes the session (which counts from now on) or is given back."""
        self._creating[slot] -= 1
        if self._creating[slot] <= 0:
            del self._creating[slot]
        self._mark += 1
        if session_id is not None and self._counts_from:
            # a count whose listing began before this moment may not see the session: it looks here
            self._finished.append((self._mark, slot, session_id))

    async def _check_quota(self, slot: tuple[str, str]) -> None:
        """The owner's live sessions of the slot's quota, plus its creates in flight (this one's included)."""
        owner, quota = slot
        setting = "max_kernels_per_user" if quota == _KERNELS else "max_sessions_per_user"
        limit = getattr(self.policy, setting, 0)
        if not limit:
            return
        start = self._mark
        self._counts_from[start] += 1
        try:
            infos = await self.access.require().list()
        finally:
            self._counts_from[start] -= 1
            if self._counts_from[start] <= 0:
                del self._counts_from[start]
        live = {info.id for info in infos if info.owner == owner and _quota_of(info.consumer) == quota}
        live |= {sid for mark, which, sid in self._finished if mark > start and which == slot}
        oldest = min(self._counts_from, default=self._mark)
        self._finished = [entry for entry in self._finished if entry[0] > oldest]
        held = len(live) + self._creating[slot] - 1  # the others in flight, not this one
        if held >= limit:
            what = "sandboxed kernels" if quota == _KERNELS else "live sessions"
            raise SandboxQuotaError(
                f"{owner!r} already holds {held} {what} (starts under way included), the most one "
                f"user may hold (SandboxPolicy.{setting} = {limit}): "
                + ("shut one down first" if quota == _KERNELS else "destroy one first")
            )

    # ------------------------------------------------------------ find

    def visible(self, caller: Caller, info: SessionInfo) -> bool:
        return caller.sees_all or info.owner == caller.name

    async def get(self, session_id: str, caller: Caller, *, manage: bool = False) -> SandboxSession:
        """The caller's session (any, for an admin); 404 exactly like an unknown id otherwise.

        ``manage``: the call changes the session (exec, upload, destroy), which an admin
        needs ``write`` for; reading (info, download, listing) needs ``read``.
        """
        if not _SESSION_ID.fullmatch(session_id):
            raise session_gone(session_id)
        act_for(caller.name)  # the provider's work for this request counts against the caller's share
        session = await self.access.require().get(session_id)
        info = session.known_info() or await session.info()  # get() just found it: its owner is all we need
        if info.owner == caller.name or (caller.manages_all if manage else caller.sees_all):
            return session
        raise session_gone(session_id)

    async def list(self, caller: Caller) -> list[SessionInfo]:
        act_for(caller.name)
        return [info for info in await self.access.require().list() if self.visible(caller, info)]

    # ------------------------------------------------------------- TTL

    async def set_ttl(self, session: SandboxSession, data: Mapping[str, Any]) -> SessionInfo:
        """``{"ttl_seconds": N}``: the session now ends N seconds after its creation.

        Over ``SandboxPolicy.max_ttl_seconds`` is refused (never clamped), and so is an end
        already past; the session must be the caller's (get it with ``manage=True``).
        """
        unknown = sorted(set(data) - {"ttl_seconds"})
        if unknown:
            raise SandboxRequestError(
                f"unknown field(s): {', '.join(unknown)}; known: ttl_seconds", field=unknown[0]
            )
        ttl = data.get("ttl_seconds")
        if not is_positive_number(ttl):  # the spec's own check: 10**400 or "1" is a 400, not an OverflowError
            raise SandboxRequestError(
                "ttl_seconds: required, a positive number of seconds counted from the session's creation",
                field="ttl_seconds",
            )
        ttl = float(ttl)
        max_ttl = getattr(self.policy, "max_ttl_seconds", 0)
        if max_ttl and ttl > max_ttl:
            raise SandboxRequestError(
                f"ttl_seconds: {ttl:g} s is over the operator's maximum of {max_ttl:g} s "
                "(SandboxPolicy.max_ttl_seconds, TAI_MCP_SANDBOX_MAX_TTL_SECONDS)",
                field="ttl_seconds",
            )
        info = await session.info()
        expires_at = info.created_at + ttl
        now = time.time()
        if expires_at <= now:
            raise SandboxRequestError(
                f"ttl_seconds: {ttl:g} s would have ended the session {now - expires_at:.0f} s ago "
                f"(it is {now - info.created_at:.0f} s old): ask for more",
                field="ttl_seconds",
            )
        return await session.set_expiry(expires_at)

    # --------------------------------------------------------- destroy

    async def destroy(self, session: SandboxSession, *, remove_workspace: bool = False) -> None:
        if remove_workspace:
            info = await session.info()
            if info.workspace_key is not None:
                # the same workspace: the same owner's key (keys are a namespace per owner; another
                # owner's session on a key of that name is on another workspace, and never mentioned)
                mine = workspace_identity(info.owner, info.workspace_key)
                holders = [
                    other.id
                    for other in await self.access.require().list()
                    if other.workspace_key is not None
                    and workspace_identity(other.owner, other.workspace_key) == mine
                    and other.id != session.id
                ]
                if holders:
                    raise SandboxConflictError(
                        f"workspace {info.workspace_key!r} is in use by {len(holders)} other live "
                        "session(s): destroy them first, or destroy this one without remove_workspace"
                    )
        await session.destroy(remove_workspace=remove_workspace)
        self.forget(session.id)

    def forget(self, session_id: str) -> None:
        self.ids.discard(session_id)


def _stopping() -> SandboxUnavailableError:
    return SandboxUnavailableError(
        "the server is stopping: it makes no new session (try again once it is back)"
    )
