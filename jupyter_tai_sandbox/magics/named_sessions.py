"""The sessions a kernel's magics know by name, and the client and loop thread they reach the server with.

:class:`NamedSessions` is the ground floor of the magics: it finds the server (in the kernel's
thread, so a note on the choice prints in the cell), runs the async client on a private loop
thread (the kernel's own loop belongs to ipykernel), starts a named session on first use (and
again after a reap), and destroys the sessions this kernel started when the kernel exits. The
line subcommands (``subcommands``) and the cell magic (``magic``) stand on it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import sys
import threading
import urllib.parse
import warnings
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.magic import Magics

from ..client import SandboxClient, SeveralServersWarning, discover_server
from ..contract import SandboxError, SandboxNotFoundError
from ..contract.values import MAX_CONSUMER_CHARS
from ..images import PYTHON_IMAGE
from .options import SandboxMagicError, options_differ, options_label, spec_body, spec_only
from .stream import LoopThread

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

T = TypeVar("T")

#: the sub-label a magics session carries under the caller's own consumer label, so the panel and the
#: Running sidebar show its name and notebook (labextension/src/names.ts reads it back)
MAGICS_LABEL = "magics:"


def magics_label(own: str, name: str, notebook: str | None) -> str | None:
    """``<own>/magics:<name>[@<notebook>]`` (both percent-encoded), the notebook left out (then the
    label) when it would be over the contract's length."""
    label = f"{own}/{MAGICS_LABEL}{urllib.parse.quote(name, safe='')}"
    with_notebook = f"{label}@{urllib.parse.quote(notebook, safe='')}" if notebook else label
    for candidate in (with_notebook, label):
        if len(candidate) <= MAX_CONSUMER_CHARS:
            return candidate
    return None


def notebook_path() -> str | None:
    """The notebook this kernel serves, as jupyter_server names it to a kernel it starts for a session
    (``JPY_SESSION_NAME``, the path under the server's root); None outside a notebook."""
    return os.environ.get("JPY_SESSION_NAME") or None


@dataclass
class NamedSession:
    """A session this kernel knows by name."""

    name: str
    id: str
    options: dict[str, Any]
    workspace: str
    kind: str = ""
    timeout: float | None = None
    created_here: bool = True
    image: str | None = None


class NamedSessions(Magics):
    """The kernel's sessions by name, the current one, and the client that reaches them."""

    shell: InteractiveShell  # type: ignore[assignment]  # IPython's Magics declares it None; a loaded extension has its shell

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self._loop: LoopThread | None = None
        self._client: SandboxClient | None = None
        self._client_source = ""
        self._explicit: tuple[str, str] | None = None
        self._sessions: dict[str, NamedSession] = {}
        self._current = "default"
        self._lock = threading.Lock()
        self._token = secrets.token_hex(4)
        #: (client, the caller's own consumer label or None when a sub-label would lose credentials)
        self._own_label: tuple[SandboxClient, str | None] | None = None
        atexit.register(self._cleanup)

    # ---------------------------------------------------------------- plumbing

    def _run(
        self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, find_server: bool = True
    ) -> T:
        """Run ``coro`` on the loop thread and wait for it here (the server found first, in this thread)."""
        if self._loop is None:
            self._loop = LoopThread()
        if find_server:
            try:
                self._ensure_client()
            except BaseException:
                coro.close()
                raise
        return self._loop.run(coro, timeout)

    def _ensure_client(self) -> SandboxClient:
        """The client, found here in the kernel's thread (so a note on the choice prints in the cell)."""
        if self._client is None:
            if self._explicit is not None:
                url, token = self._explicit
                source = "%sandbox connect"
            elif os.environ.get("TAI_SANDBOX_URL"):
                url, token = os.environ["TAI_SANDBOX_URL"], os.environ.get("TAI_SANDBOX_TOKEN", "")
                source = "TAI_SANDBOX_URL"
            else:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", SeveralServersWarning)
                    url, token = discover_server()
                several = [w for w in caught if issubclass(w.category, SeveralServersWarning)]
                source = "a running Jupyter server"
                for warning in several:
                    print(f"sandbox: {warning.message}", file=sys.stderr, flush=True)
                    source = "the first started of several running Jupyter servers"
            self._client = SandboxClient(url, token)
            self._client_source = source
        return self._client

    async def _get_client(self) -> SandboxClient:
        return self._ensure_client()

    async def _labelled(self, client: SandboxClient, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the consumer label that carries the session's name and notebook into the panel.

        The label is a sub-label of the caller's own (``user:NAME/magics:...``, the caller's to name).
        The operator's credentials go by exact label, so when the caller's own label holds some (or the
        status does not show which labels do), the session keeps the caller's own label and its
        credentials, and shows in the panel by its id.
        """
        if "consumer" in body:
            return body
        if self._own_label is None or self._own_label[0] is not client:
            try:
                status = await client.status()
            except SandboxError:  # the create that follows says what is wrong, in its own words
                return body
            own = status.get("consumer")
            credentials = (status.get("policy") or {}).get("credentials")
            keep = (
                not isinstance(own, str) or not own or not isinstance(credentials, dict) or own in credentials
            )
            self._own_label = (client, None if keep else own)
        own = self._own_label[1]
        label = magics_label(own, name, notebook_path()) if own else None
        return {**body, "consumer": label} if label else body

    async def _create(self, name: str, options: dict[str, Any], body: dict[str, Any]) -> NamedSession:
        client = await self._get_client()
        info = await client.create(**(await self._labelled(client, name, body)))
        if body.get("image") not in (None, PYTHON_IMAGE) and info.get("kind") == "local":
            # the contract keeps image inert on local (recorded, not used): say so rather than accept it
            # silently (the project's Python image is what the docs' cells name to run on both providers)
            print(
                f"sandbox: --image {body['image']} has no effect on the local provider (commands run on this "
                f"host, not in an image); session {name!r} started without it",
                file=sys.stderr,
                flush=True,
            )
        known = NamedSession(
            name,
            info["id"],
            dict(options),
            info.get("workspace", ""),
            info.get("kind", ""),
            options.get("timeout"),
            image=info.get("image"),
        )
        with self._lock:  # registered here, on the loop thread, even if the cell was interrupted meanwhile
            self._sessions[name] = known
        return known

    async def _ensure(
        self, name: str, options: dict[str, Any], body: dict[str, Any]
    ) -> tuple[NamedSession, str]:
        """The live session called ``name``, started (or restarted after a reap) when needed."""
        with self._lock:
            known = self._sessions.get(name)
        if known is None:
            return await self._create(name, options, body), ""
        client = await self._get_client()
        try:
            info = await client.info(known.id)
            known.workspace = info.get("workspace", known.workspace)
            known.image = info.get("image", known.image)
            return known, ""
        except SandboxNotFoundError:
            if not known.created_here:
                with self._lock:
                    self._sessions.pop(name, None)
                raise SandboxMagicError(f"session {name!r} is gone from the server") from None
        again = await self._create(name, known.options, spec_body(known.options))
        note = f"session {name!r} had expired or was removed; started a new one (its workspace is new"
        note += ", the persistent one is back)" if "persistent" in known.options else ")"
        return again, note

    def _pick(self, session: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The session name a cell or transfer runs in, and the options to start it with."""
        with self._lock:
            if session is not None:
                known = self._sessions.get(session)
                if known is not None and options and options_differ(known.options, options):
                    raise SandboxMagicError(
                        f"session {session!r} was started with {options_label(spec_only(known.options)) or 'no options'}; "
                        f"session options apply when a session starts: use another --session or `%sandbox rm {session}`"
                    )
                return session, options
            current = self._sessions.get(self._current)
            if not options or (current is not None and not options_differ(current.options, options)):
                return self._current, options if current is None else current.options
            return f"default({options_label(options)})", options

    def _session_for(self, session: str | None, options: dict[str, Any] | None = None) -> NamedSession:
        name, opts = self._pick(session, options or {})
        body = spec_body(opts)
        known, note = self._run(self._ensure(name, opts, body))
        if note:
            print(f"sandbox: {note}", file=sys.stderr)
        return known

    async def _list(self) -> list[dict[str, Any]]:
        return await (await self._get_client()).sessions()

    async def _adopt(self, session_id: str) -> NamedSession | None:
        client = await self._get_client()
        try:
            info = await client.info(session_id)
        except SandboxNotFoundError:
            return None
        known = NamedSession(
            session_id,
            info["id"],
            {},
            info.get("workspace", ""),
            info.get("kind", ""),
            None,
            created_here=False,
            image=info.get("image"),
        )
        with self._lock:
            self._sessions[session_id] = known
        return known

    # ---------------------------------------------------------------- teardown

    def _cleanup(self) -> None:
        """At kernel exit: destroy the sessions this kernel started (persistent workspaces stay).

        Blocking requests (``SandboxClient.destroy_blocking``): by the time atexit runs, the
        executors the async client resolves names with are shut down.
        """
        with self._lock:
            ids = [s.id for s in self._sessions.values() if s.created_here]
            self._sessions.clear()
        client = self._client
        if not ids or client is None:
            return
        for session_id in ids:
            with contextlib.suppress(Exception):
                client.destroy_blocking(session_id, timeout=3)
