"""sandbox-local: each session's commands run as plain host subprocesses. No isolation.

The workspace is a host directory: for a persistent session (created or adopted,
never removed by a reap) ``<root>/<workspace_key>`` (seed 002's path) or
``<root>/.by-owner/<owner tag>/<workspace_key>``, as below; a fresh directory
under ``<root>/.ephemeral/`` otherwise (removed on destroy and reap). Only
``isolation="none"`` and ``network="egress"`` are honoured; cpu/memory caps are
rejected. ``image`` is inert: recorded in info() and the session's sidecar file.

Process groups: every command joins a fresh process group led by a small holder
process (see :mod:`.posix`), so a stop never signals a group id since given to
other processes. The command itself is not a group leader, so it may call setsid;
every stop (deadline, kill, a failed or cancelled one-shot, a cancelled start, the
teardown of interactive commands) still kills its own process, race-free, as well
as its group. A completed one-shot lets its group go (what it left running keeps
running); an interactive command's group is kept until kill() or the session's
teardown. A process the command started that left the group is never stopped.
Exits are watched with pidfds on the event loop, not a thread per child. An exit
status that cannot be read raises SandboxError; none is ever made up.

Tenancy: the session's owner (``spec.owner``) is in its sidecar, so a later server
process on the same root finds the session again (get/list adopt the sessions of
a server that has ended; their env values were never on disk). Workspace keys are
a namespace per owner (the rule is :mod:`.._workspaces`): ``<root>/<key>`` is the
workspace of a session without an owner, of the owner recorded for it in
``<root>/.owners/<key>.json`` (so a workspace made before keys were per owner stays
its owner's), and of the server's own principal (``home_owner``: the account
running the server, every caller of a single-user server) when no other owner is
recorded for it. Any other owner's ``key`` is
``<root>/.by-owner/<sha-256 of the owner, 32 hex>/<key>``, with its own
``.owners/`` record and ``.locks/`` lease beside it in that folder: bob asking for
alice's key gets his own, new workspace, never hers and never a refusal. Each live
persistent session holds its workspace's lease (a shared flock in the ``.locks/``
beside it); removing the workspace is refused with SandboxConflictError while
another session, in any server process on this root, holds it.

The root is mode 0700 (made so, or tightened when it is this account's): workspaces
hold what other OS accounts must not read, such as a sandboxed kernel's connection
file (its key).

Modules: :mod:`.posix` (process primitives), :mod:`.command` and
:mod:`.pty` (the command classes), :mod:`.session` (a session's exec
and files), :mod:`.paths` (typed path errors), :mod:`.tenancy`
(owner records, key leases), this one (the provider: traits, sessions, sidecars,
adoption, reaping).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ...contract import (
    Sandbox,
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxSpecRejectedError,
    SessionInfo,
    SessionSpec,
    session_gone,
)
from ...policy import within_limits
from ...spool import DEFAULT_MEMORY_LIMIT
from .._common import ProviderMeta, new_session_id
from .._workspaces import owner_tag, server_account, unscoped_serves
from .command import LocalCommand
from .paths import private_folder
from .posix import kill_marked, process_identity
from .pty import LocalPtyCommand
from .session import LocalSession
from .tenancy import WorkspaceLease, claim_or_check_owner, forget_owner, read_owner

__all__ = ["LocalCommand", "LocalPtyCommand", "LocalSandbox", "LocalSession"]

_SESSION_ID = re.compile(r"sbx-[0-9a-f]{16}")
_THIS_PROCESS = process_identity(os.getpid())
#: the folder (under the root) of the per-owner workspace folders
_BY_OWNER = ".by-owner"


class LocalSandbox(LoggingConfigurable, Sandbox, metaclass=ProviderMeta):
    """sandbox-local: runs each session's code directly on the host. No isolation."""

    kind = "local"
    max_isolation = "none"
    networks = frozenset({"egress"})
    supports_limits = False
    egress_refusal = (
        "the local provider runs on the host's network and cannot enforce an egress allow-list; use docker"
    )
    session_class: type[LocalSession] = LocalSession
    command_class: type[LocalCommand] = LocalCommand
    pty_command_class: type[LocalCommand] = LocalPtyCommand

    root = Unicode(
        help="""Folder holding the workspaces (SANDBOX_LOCAL_ROOT): persistent ones at
        <root>/<workspace_key> (no owner, the home owner's, or one recorded to its owner) or
        <root>/.by-owner/<owner tag>/<workspace_key> (any other owner's), ephemeral ones under
        <root>/.ephemeral/, session sidecar files under <root>/.sessions/, workspace owners under
        .owners/ and the per-workspace lease files under .locks/ beside the workspaces. Made mode 0700
        (tightened when it exists and is this account's). Default: <jupyter data dir>/tai_sandbox/local.""",
    ).tag(config=True)

    home_owner = Unicode(
        help="""The principal whose persistent workspaces are <root>/<workspace_key> when no other owner
        is recorded for that path (other owners' are under <root>/.by-owner/). Default: the account
        running the server (the one principal of a server that authenticates by token or password).""",
    )

    inherit_env = List(
        Unicode(),
        default_value=["PATH", "LANG", "LC_ALL", "TZ"],
        help="Server environment variables passed on to commands (the rest of the server's environment is not).",
    ).tag(config=True)

    output_memory_bytes = Integer(
        DEFAULT_MEMORY_LIMIT,
        help="Bytes of a command's unread output kept in memory before it spills to a temporary file.",
    ).tag(config=True)

    stdout_pipe_bytes = Integer(
        1 << 20,
        min=0,
        max=16 << 20,
        help="""Kernel buffer a command's stdout pipe grows to once the command fills it, in bytes
        (Linux F_SETPIPE_SZ, rounded up to a power of two pages; at most /proc/sys/fs/pipe-max-size,
        1 MiB by default, for unprivileged users). A command that writes a lot is then read in pieces
        this large: fewer wake-ups, and fewer chunks through the server. A command that writes little
        keeps the system's 64 KiB, so many commands do not use up their user's pipe allowance
        (/proc/sys/fs/pipe-user-pages-soft). 0 keeps the system's pipe.""",
    ).tag(config=True)

    @default("home_owner")
    def _home_owner_default(self) -> str:
        return server_account()

    @default("root")
    def _root_default(self) -> str:
        return os.environ.get("SANDBOX_LOCAL_ROOT") or os.path.join(
            jupyter_data_dir(), "tai_sandbox", "local"
        )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sessions: dict[str, LocalSession] = {}
        #: sessions being destroyed: their sidecar is still on disk, but a list() meanwhile must not adopt them
        self._forgetting: set[str] = set()

    @property
    def _root(self) -> Path:
        return Path(os.path.realpath(self.root))

    def _sidecar(self, session_id: str) -> Path:
        return self._root / ".sessions" / f"{session_id}.json"

    def _workspace_of(self, session_id: str, spec: SessionSpec) -> Path:
        """The session's workspace folder (blocking: a persistent one reads owner records).

        A persistent workspace's lease and owner record are in ``.locks/`` and ``.owners/`` of its parent.
        """
        if spec.durability != "persistent":
            return self._root / ".ephemeral" / session_id
        key = str(spec.workspace_key)
        unscoped = self._root / key
        if spec.owner is None:
            return unscoped
        scoped = self._scoped(spec.owner) / key
        record = read_owner(self._root / ".owners", key)
        has_scoped = (scoped.parent / ".owners" / f"{key}.json").exists()
        if unscoped_serves(
            spec.owner,
            None if record is None else record["owner"],
            home=spec.owner == self.home_owner,
            has_scoped=has_scoped,
        ):
            return unscoped
        return scoped

    def _scoped(self, owner: str) -> Path:
        """The folder of ``owner``'s own workspaces (those not at ``<root>/<key>``)."""
        return self._root / _BY_OWNER / owner_tag(owner)

    async def create(self, spec: SessionSpec) -> SandboxSession:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        spec = within_limits(spec, self.session_limits())
        session_id = new_session_id()
        try:
            workspace = await asyncio.to_thread(self._workspace_of, session_id, spec)
        except OSError as e:
            raise SandboxError(f"cannot read the owner records under {self._root}: {e}") from e
        now = time.time()
        session = self.session_class(self, session_id, spec, workspace, now)
        record = {
            "id": session_id,
            "kind": self.kind,
            "image": spec.image,
            "consumer": spec.consumer,
            "owner": spec.owner,
            "durability": spec.durability,
            "workspace_key": spec.workspace_key,
            "workspace": str(workspace),
            "created_at": now,
            "expires_at": session.expires_at,
            "pid": os.getpid(),
            "process": _THIS_PROCESS,
            "spec": spec.to_public_json(),
        }
        try:
            session.lease = await asyncio.to_thread(self._provision, spec, workspace, session_id, record)
        except OSError as e:
            raise SandboxError(f"cannot provision the workspace {workspace}: {e}") from e
        self._sessions[session_id] = session
        self.log.debug("sandbox-local: created %s at %s", session_id, workspace)
        return session

    def _provision(
        self, spec: SessionSpec, workspace: Path, session_id: str, record: dict[str, Any]
    ) -> WorkspaceLease | None:
        """Take the key's lease, check or record its owner, make the workspace and the sidecar (blocking)."""
        lease = None
        private_folder(self._root)
        if spec.durability == "persistent":
            lease = WorkspaceLease(workspace.parent / ".locks", workspace.name)
        try:
            if lease is not None:
                # under the lease: a removal of this workspace cannot run meanwhile
                claim_or_check_owner(workspace.parent / ".owners", lease.key, spec.owner)
            if workspace.is_symlink() or (workspace.exists() and not workspace.is_dir()):
                raise SandboxSpecRejectedError(
                    f"{workspace} exists and is not a folder: it cannot be a workspace"
                )
            workspace.mkdir(parents=True, exist_ok=True)
            self._write_sidecar(session_id, record)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        return lease

    def _write_sidecar(self, session_id: str, record: dict[str, Any]) -> None:
        sidecar = self._sidecar(session_id)
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        temp = sidecar.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
        temp.write_text(json.dumps(record, indent=1))
        os.replace(temp, sidecar)

    def _retime(self, session_id: str, expires_at: float) -> None:
        """Write a session's new end into its sidecar (blocking)."""
        try:
            record = json.loads(self._sidecar(session_id).read_text())
        except (OSError, ValueError) as e:
            raise SandboxNotFoundError(
                f"session {session_id}: its record is gone or unreadable ({e})"
            ) from None
        record["expires_at"] = expires_at
        self._write_sidecar(session_id, record)

    async def get(self, session_id: str) -> SandboxSession:
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None and isinstance(session_id, str) and _SESSION_ID.fullmatch(session_id):
            session = await asyncio.to_thread(self._adopt, session_id)
        if session is None:
            raise session_gone(session_id)
        return session

    async def list(self) -> list[SessionInfo]:
        await asyncio.to_thread(self._adopt_all)
        return [s._info() for s in self._sessions.values()]

    def _adopt_all(self) -> None:
        folder = self._root / ".sessions"
        for sidecar in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            if sidecar.stem not in self._sessions and _SESSION_ID.fullmatch(sidecar.stem):
                self._adopt(sidecar.stem)

    def _adopt(self, session_id: str) -> LocalSession | None:
        """A live session an earlier server process on this root made, from its sidecar (blocking).

        Only a session whose server process has ended (or this process's own) is adopted:
        a session of a server still running stays that server's.

        Its spec, owner and deadlines come back; its env values never touched the disk,
        so its commands run without the credentials it was created with.
        """
        if session_id in self._sessions:
            return self._sessions[session_id]
        if session_id in self._forgetting:
            return None
        try:
            record = json.loads(self._sidecar(session_id).read_text())
            spec = SessionSpec.from_json({**record["spec"], "env": {}})
            created_at, expires_at = float(record["created_at"]), float(record["expires_at"])
        except (OSError, ValueError, TypeError, KeyError, SandboxError):
            return None
        origin = record.get("process")
        if (
            origin != _THIS_PROCESS
            and isinstance(origin, str)
            and process_identity(record.get("pid", 0)) == origin
        ):
            return None  # its server process still runs: the session is that server's, not ours
        try:
            workspace = self._recorded_workspace(session_id, spec, record.get("workspace"))
        except (OSError, SandboxError):
            return None
        if expires_at <= time.time() or not workspace.is_dir() or workspace.is_symlink():
            return None  # the reaper's to remove
        lease = None
        if spec.durability == "persistent":
            try:
                lease = WorkspaceLease(workspace.parent / ".locks", workspace.name)
            except SandboxError:
                return None
        if origin != _THIS_PROCESS:
            # the commands its server left run without the deadlines that server enforced: stop them
            left = kill_marked(session_id)
            if left:
                self.log.warning(
                    "sandbox-local: stopped %d process(es) a dead server left in %s", len(left), session_id
                )
        session = self.session_class(self, session_id, spec, workspace, created_at)
        session.expires_at = expires_at
        session.lease = lease
        if record["spec"].get("env"):
            self.log.warning(
                "sandbox-local: adopted session %s runs without its env values (never kept on disk)",
                session_id,
            )
        self._sessions[session_id] = session
        return session

    def _recorded_workspace(self, session_id: str, spec: SessionSpec, recorded: object) -> Path:
        """An adopted session's workspace: the one its sidecar names when that is one of its spec's places
        (its owner's scoped one, or the key's unscoped one), else the one its spec leads to now (blocking)."""
        if spec.durability == "persistent" and isinstance(recorded, str):
            key = str(spec.workspace_key)
            places = {self._root / key}
            if spec.owner is not None:
                places.add(self._scoped(spec.owner) / key)
            if Path(recorded) in places:
                return Path(recorded)
        return self._workspace_of(session_id, spec)

    async def workspace_owner(self, workspace_key: str) -> str | None:
        """The owner recorded for the unscoped workspace ``<root>/<workspace_key>``, None when there is none
        (a hook for the server)."""
        record = await asyncio.to_thread(read_owner, self._root / ".owners", workspace_key)
        return None if record is None else record["owner"]

    async def _claim_removal(self, session: LocalSession) -> None:
        """Before a removing destroy: hold the key alone, or refuse with nothing changed."""
        if session.lease is not None and not await asyncio.to_thread(session.lease.try_exclusive):
            raise SandboxConflictError(
                f"the persistent workspace {session.lease.key!r} is held by another live session "
                "(in this or another server process); destroy those first, or destroy this one "
                "without remove_workspace"
            )

    async def _forget(self, session: LocalSession, remove_workspace: bool) -> None:
        self._forgetting.add(session.id)
        self._sessions.pop(session.id, None)
        remove = session.spec.durability == "ephemeral" or remove_workspace
        try:
            await asyncio.to_thread(self._remove_files, session, session.workspace if remove else None)
        finally:
            self._forgetting.discard(session.id)
            if session.lease is not None:
                session.lease.release()

    def _remove_files(self, session: LocalSession, workspace: Path | None) -> None:
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
            if session.lease is not None:  # held exclusive: the key is free again
                forget_owner(workspace.parent / ".owners", session.lease.key)
        self._sidecar(session.id).unlink(missing_ok=True)

    async def reap(self) -> builtins.list[str]:
        now = time.time()
        # the sidecar has the last word on a session's end (another provider object may have moved it)
        await asyncio.to_thread(self._reread_expiries, list(self._sessions.values()))
        reaped = [s.id for s in list(self._sessions.values()) if s.expires_at <= now]
        for session_id in reaped:
            session = self._sessions.get(session_id)
            if session is not None:
                await session.destroy(remove_workspace=False)
        reaped += await asyncio.to_thread(self._reap_orphans, now)
        if reaped:
            self.log.info("sandbox-local: reaped %s", ", ".join(reaped))
        return reaped

    def _reread_expiries(self, sessions: builtins.list[LocalSession]) -> None:
        for session in sessions:
            try:
                session.expires_at = float(json.loads(self._sidecar(session.id).read_text())["expires_at"])
            except (OSError, ValueError, TypeError, KeyError):
                continue

    def _reap_orphans(self, now: float) -> builtins.list[str]:
        """Expired sessions an earlier server process left behind (found by their sidecar)."""
        reaped = []
        folder = self._root / ".sessions"
        for sidecar in folder.glob("*.json") if folder.is_dir() else ():
            session_id = sidecar.stem
            if session_id in self._sessions or not _SESSION_ID.fullmatch(session_id):
                continue
            try:
                record = json.loads(sidecar.read_text())
            except (OSError, ValueError):
                continue
            if record.get("expires_at", now) > now:
                continue
            kill_marked(session_id)  # what its commands left: the session is over
            if record.get("durability") != "persistent":
                shutil.rmtree(self._root / ".ephemeral" / session_id, ignore_errors=True)
            sidecar.unlink(missing_ok=True)
            reaped.append(session_id)
        return reaped

    async def close(self) -> None:
        for session in list(self._sessions.values()):
            await asyncio.gather(*(c.kill() for c in session._interactive), return_exceptions=True)
            session._drop_spare_holder()
