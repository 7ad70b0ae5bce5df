"""sandbox-local: each session's commands run as plain host subprocesses. No isolation.

The workspace is a host directory: ``<root>/<workspace_key>`` for a persistent
session (created or adopted, never removed by a reap), a fresh directory under
``<root>/.ephemeral/`` otherwise (removed on destroy and reap). Only
``isolation="none"`` and ``network="egress"`` are honoured; cpu/memory caps are
rejected. ``image`` is inert: recorded in info() and the session's sidecar file.

Process groups: every command joins a fresh process group led by a small holder
process (see :mod:`._posix`), so a stop never signals a group id since given to
other processes, and the command itself is not a group leader (it may call setsid). A completed one-shot lets its group go (what
it left running keeps running); an interactive command's group is kept until
kill() or the session's teardown. A process that leaves the group (setsid) is
never stopped. Exits are watched with pidfds on the event loop, not a thread per
child.

Modules: :mod:`._posix` (process primitives), :mod:`._local_command` and
:mod:`._local_pty` (the command classes), :mod:`._local_session` (a session's exec
and files), this one (the provider: traits, sessions, sidecars, reaping).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from ..contract import (
    Sandbox,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxSpecRejectedError,
    SessionInfo,
    SessionSpec,
)
from ..spool import DEFAULT_MEMORY_LIMIT
from ._common import ProviderMeta, new_session_id
from ._local_command import LocalCommand
from ._local_pty import LocalPtyCommand
from ._local_session import LocalSession

__all__ = ["LocalCommand", "LocalPtyCommand", "LocalSandbox", "LocalSession"]


class LocalSandbox(LoggingConfigurable, Sandbox, metaclass=ProviderMeta):
    """sandbox-local: runs each session's code directly on the host. No isolation."""

    kind = "local"
    max_isolation = "none"
    networks = frozenset({"egress"})
    supports_limits = False
    session_class: type[LocalSession] = LocalSession
    command_class: type[LocalCommand] = LocalCommand
    pty_command_class: type[LocalCommand] = LocalPtyCommand

    root = Unicode(
        help="""Folder holding the workspaces (SANDBOX_LOCAL_ROOT): persistent ones at
        <root>/<workspace_key>, ephemeral ones under <root>/.ephemeral/, session sidecar
        files under <root>/.sessions/. Default: <jupyter data dir>/tai_sandbox/local.""",
    ).tag(config=True)

    inherit_env = List(
        Unicode(),
        default_value=["PATH", "LANG", "LC_ALL", "TZ"],
        help="Server environment variables passed on to commands (the rest of the server's environment is not).",
    ).tag(config=True)

    output_memory_limit = Integer(
        DEFAULT_MEMORY_LIMIT,
        help="Bytes of a command's unread output kept in memory before it spills to a temporary file.",
    ).tag(config=True)

    stdout_pipe_size = Integer(
        256 << 10,
        min=0,
        max=16 << 20,
        help="""Kernel buffer of each command's stdout pipe, in bytes (Linux F_SETPIPE_SZ, rounded
        up to a power of two pages; at most /proc/sys/fs/pipe-max-size for unprivileged users).
        Larger pipes mean fewer wake-ups when a command writes a lot; each running command holds
        this much of its user's pipe allowance. 0 keeps the system default (64 KiB).""",
    ).tag(config=True)

    @default("root")
    def _root_default(self) -> str:
        return os.environ.get("SANDBOX_LOCAL_ROOT") or os.path.join(
            jupyter_data_dir(), "tai_sandbox", "local"
        )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sessions: dict[str, LocalSession] = {}

    @property
    def _root(self) -> Path:
        return Path(os.path.realpath(self.root))

    def _sidecar(self, session_id: str) -> Path:
        return self._root / ".sessions" / f"{session_id}.json"

    async def create(self, spec: SessionSpec) -> SandboxSession:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        self.check_spec(spec)
        session_id = new_session_id()
        if spec.durability == "persistent":
            workspace = self._root / spec.workspace_key  # type: ignore[operator]
        else:
            workspace = self._root / ".ephemeral" / session_id
        now = time.time()
        session = self.session_class(self, session_id, spec, workspace, now)
        record = {
            "id": session_id,
            "kind": self.kind,
            "image": spec.image,
            "consumer": spec.consumer,
            "durability": spec.durability,
            "workspace_key": spec.workspace_key,
            "workspace": str(workspace),
            "created_at": now,
            "expires_at": session.expires_at,
            "pid": os.getpid(),
            "spec": spec.to_public_json(),
        }
        try:
            await asyncio.to_thread(self._provision, workspace, session_id, record)
        except OSError as e:
            raise SandboxError(f"cannot provision the workspace {workspace}: {e}") from e
        self._sessions[session_id] = session
        self.log.debug("sandbox-local: created %s at %s", session_id, workspace)
        return session

    def _provision(self, workspace: Path, session_id: str, record: dict[str, Any]) -> None:
        if workspace.is_symlink() or (workspace.exists() and not workspace.is_dir()):
            raise SandboxSpecRejectedError(
                f"{workspace} exists and is not a folder: it cannot be a workspace"
            )
        workspace.mkdir(parents=True, exist_ok=True)
        sidecar = self._sidecar(session_id)
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        temp = sidecar.with_suffix(".tmp")
        temp.write_text(json.dumps(record, indent=1))
        os.replace(temp, sidecar)

    async def get(self, session_id: str) -> SandboxSession:
        session = self._sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise SandboxNotFoundError(f"no local sandbox session {session_id!r}")
        return session

    async def list(self) -> list[SessionInfo]:
        return [s._info() for s in self._sessions.values()]

    async def _forget(self, session: LocalSession, remove_workspace: bool) -> None:
        self._sessions.pop(session.id, None)
        remove = session.spec.durability == "ephemeral" or remove_workspace
        await asyncio.to_thread(self._remove_files, session.id, session.workspace if remove else None)

    def _remove_files(self, session_id: str, workspace: Path | None) -> None:
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)
        self._sidecar(session_id).unlink(missing_ok=True)

    async def reap(self) -> list[str]:
        now = time.time()
        reaped = [s.id for s in list(self._sessions.values()) if s.expires_at <= now]
        for session_id in reaped:
            session = self._sessions.get(session_id)
            if session is not None:
                await session.destroy(remove_workspace=False)
        reaped += await asyncio.to_thread(self._reap_orphans, now)
        if reaped:
            self.log.info("sandbox-local: reaped %s", ", ".join(reaped))
        return reaped

    def _reap_orphans(self, now: float) -> list[str]:
        """Expired sessions an earlier server process left behind (found by their sidecar)."""
        reaped = []
        folder = self._root / ".sessions"
        for sidecar in folder.glob("*.json") if folder.is_dir() else ():
            session_id = sidecar.stem
            if session_id in self._sessions:
                continue
            try:
                record = json.loads(sidecar.read_text())
            except (OSError, ValueError):
                continue
            if record.get("expires_at", now) > now:
                continue
            workspace = self._root / ".ephemeral" / session_id
            self._remove_files(session_id, workspace if record.get("durability") != "persistent" else None)
            reaped.append(session_id)
        return reaped

    async def close(self) -> None:
        for session in list(self._sessions.values()):
            await asyncio.gather(*(c.kill() for c in session._interactive), return_exceptions=True)
            session._drop_spare_holder()
