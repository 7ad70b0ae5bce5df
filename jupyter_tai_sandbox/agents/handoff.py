"""Workspace handoff: a folder (or file) of Jupyter's contents copied into a sandbox session, results back.

Any session, not only a coding agent's. The layout mirrors the contents path: the contents folder
``projects/foo`` is ``<workspace>/projects/foo`` in the session. Jupyter's side is read and written only
through the server's ContentsManager (its async API, so any contents manager works, and its own rules
for hidden files); the session's side only through the session's file calls.

The rule, as the docs state it (docs/users/sessions.md, "Workspace handoff"):

- **Copy in** copies every file and folder the contents manager lists under the path into the session,
  replacing the session's copies of those files (files only the session has are left alone). Symlinks
  in Jupyter's contents are not followed. A manifest of each copied file's sha256 is kept **on the
  server** (``<runtime dir>/tai-sandbox-handoff/<session id>.json``, mode 0600), never read from the
  session.
- **Copy back** walks the session's copy of a handed-in path. A session file unchanged since the copy
  in is left. A changed (or new) one is written to the same contents path when Jupyter's copy is
  unchanged since the copy in, or absent; when both changed, Jupyter's copy is kept and the session's
  version is written beside it as ``<stem>.sandbox<suffix>`` (``x.py`` -> ``x.sandbox.py``; a name taken
  by another file gets ``.sandbox-2``, ...), listed as a conflict. A file deleted in the session is never
  deleted in Jupyter (listed as skipped). Symlinks and special files in the session are skipped (listed),
  and so are names the contents manager hides; every path stays inside the handed-off folder.
- Both directions are bounded (SandboxApp.handoff_max_bytes, handoff_max_files: a typed 413 before any
  file is copied; one file over SandboxApp.handoff_max_file_bytes is skipped, listed). A contents
  manager hands over a file whole (base64), so at most one file is held in memory at a time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import os
import posixpath
import re
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from jupyter_core.utils import ensure_async
from tornado import web

from ..contract import (
    SandboxConflictError,
    SandboxError,
    SandboxForbiddenError,
    SandboxNotFoundError,
    SandboxPathError,
    SandboxRequestError,
    SandboxSession,
)
from ..errors import HandoffTooLargeError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_FILES",
    "DEFAULT_MAX_FILE_BYTES",
    "HandoffResult",
    "WorkspaceHandoff",
    "handoff_path",
    "state_dir_for",
]

#: the folder under the server's runtime dir that holds one manifest per session
STATE_FOLDER = "tai-sandbox-handoff"
#: an agent's home inside the workspace (never copied back: its settings, caches, credentials files)
AGENT_HOME = ".agent-home"
DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_MAX_FILES = 10_000
DEFAULT_MAX_FILE_BYTES = 64 << 20
_CHUNK = 1 << 20
_MANIFEST_VERSION = 1
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: most ``.sandbox-N`` names tried beside one file before the conflict copy is refused
_MAX_SANDBOX_COPIES = 50

#: one lock per manifest file: two handoffs of one session run one after the other
_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


@dataclass
class HandoffResult:
    """What one handoff did: ``copied`` (paths written), ``unchanged``, ``conflicts`` (``{"path",
    "sandbox_copy"}``: where the session's version went), ``skipped`` (``{"path", "reason"}``) and the
    ``bytes`` written. Paths are contents paths (the same in the session's workspace)."""

    direction: str
    session_id: str
    path: str
    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    bytes: int = 0

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append({"path": path, "reason": reason})

    def to_json(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "session_id": self.session_id,
            "path": self.path,
            "copied": list(self.copied),
            "unchanged": list(self.unchanged),
            "conflicts": [dict(c) for c in self.conflicts],
            "skipped": [dict(s) for s in self.skipped],
            "bytes": self.bytes,
        }


def handoff_path(path: Any, *, field_name: str = "path") -> str:
    """A contents path as the handoff uses it: ``/``-separated, no leading or trailing ``/``, ``""`` for the
    root; ``..``, a backslash or a NUL is 400 SandboxPathError (the path must stay where it says)."""
    if not isinstance(path, str):
        raise SandboxRequestError(f"{field_name}: a contents path (a string)", field=field_name)
    if "\x00" in path or "\\" in path:
        raise SandboxPathError(f"{path!r}: a handoff path has no backslash or NUL")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise SandboxPathError(f"{path!r}: '..' is not allowed in a handoff path (it stays where it says)")
    return "/".join(parts)


def state_dir_for(runtime_dir: str) -> str:
    """Where the manifests are kept: ``<runtime_dir>/tai-sandbox-handoff``."""
    return os.path.join(runtime_dir, STATE_FOLDER)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def _under(path: str, root: str) -> bool:
    return root == "" or path == root or path.startswith(root + "/")


def _bad_name(name: Any) -> str | None:
    """Why a name a session listed cannot be a path component (None: it can)."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        return "not a plain name"
    if "/" in name or "\\" in name or "\x00" in name:
        return "its name holds a path separator or NUL"
    return None


def _sandbox_copy_name(path: str, n: int) -> str:
    folder, name = posixpath.split(path)
    suffix = PurePosixPath(name).suffix
    stem = name[: len(name) - len(suffix)] if suffix else name
    mark = ".sandbox" if n == 1 else f".sandbox-{n}"
    return _join(folder, f"{stem}{mark}{suffix}")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


class _TooLarge(Exception):
    """A file grew over its bound while it was read."""


class _Manifest:
    """The server's record of a session's handoffs: the handed-in roots and each file's sha256 then."""

    def __init__(self, path: str, session_id: str) -> None:
        self.path = path
        self.session_id = session_id
        self.roots: dict[str, dict[str, Any]] = {}
        self.files: dict[str, str] = {}
        self.sandbox_copies: dict[str, str] = {}

    @classmethod
    def load(cls, path: str, session_id: str) -> _Manifest:
        manifest = cls(path, session_id)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return manifest
        except (OSError, ValueError) as e:
            raise SandboxError(
                f"the handoff state of session {session_id} ({path}) cannot be read: {e}"
            ) from None
        if not isinstance(data, dict) or data.get("session_id") != session_id:
            raise SandboxError(f"the handoff state file {path} is not session {session_id}'s")
        for name in ("roots", "files", "sandbox_copies"):
            value = data.get(name)
            if isinstance(value, dict):
                setattr(manifest, name, dict(value))
        return manifest

    def save(self) -> None:
        folder = os.path.dirname(self.path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        data = {
            "version": _MANIFEST_VERSION,
            "session_id": self.session_id,
            "roots": self.roots,
            "files": self.files,
            "sandbox_copies": self.sandbox_copies,
        }
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class WorkspaceHandoff:
    """Copy a contents folder (or file) into a session's workspace and the results back, by the rule above.

    ``contents_manager``: the server's (sync or async; its async API is used through ``ensure_async``).
    ``state_dir``: where the per-session manifests live (:func:`state_dir_for` of the server's runtime
    dir). ``max_bytes``/``max_files`` bound one handoff's total; ``max_file_bytes`` one file.
    """

    def __init__(
        self,
        contents_manager: Any,
        session: SandboxSession,
        *,
        state_dir: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int | None = None,
    ) -> None:
        self.contents = contents_manager
        self.session = session
        self.state_dir = state_dir
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.max_file_bytes = min(
            max_bytes, DEFAULT_MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
        )

    @classmethod
    def for_server(cls, app: Any, session: SandboxSession) -> WorkspaceHandoff:
        """With the server's contents manager, its runtime dir and SandboxApp's handoff limits (``app``: the
        running SandboxApp)."""
        serverapp = app.serverapp
        return cls(
            serverapp.contents_manager,
            session,
            state_dir=state_dir_for(serverapp.runtime_dir),
            max_bytes=getattr(app, "handoff_max_bytes", DEFAULT_MAX_BYTES),
            max_files=getattr(app, "handoff_max_files", DEFAULT_MAX_FILES),
            max_file_bytes=getattr(app, "handoff_max_file_bytes", DEFAULT_MAX_FILE_BYTES),
        )

    @property
    def manifest_path(self) -> str:
        session_id = self.session.id
        name = (
            session_id if _SAFE_ID.fullmatch(session_id) else hashlib.sha256(session_id.encode()).hexdigest()
        )
        return os.path.join(self.state_dir, f"{name}.json")

    def _lock(self) -> asyncio.Lock:
        key = self.manifest_path
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = asyncio.Lock()
        return lock

    async def _check_running(self) -> None:
        """A paused session would refuse every file call: say so once (409), not once per file."""
        if (await self.session.info()).paused:
            raise SandboxConflictError(f"session {self.session.id} is paused: resume it before a handoff")

    # ------------------------------------------------------------------ copy in

    async def copy_in(self, path: str) -> HandoffResult:
        """Copy the contents folder or file ``path`` to the same relative path in the session's workspace."""
        root = handoff_path(path)
        result = HandoffResult("in", self.session.id, root)
        lock = self._lock()
        async with lock:
            await self._check_running()
            manifest = await asyncio.to_thread(_Manifest.load, self.manifest_path, self.session.id)
            kind, folders, files = await self._walk_contents(root, result)
            manifest.roots[root] = {"kind": kind, "at": time.time()}
            try:
                for folder in folders:
                    if folder:
                        await self.session.make_folder(folder)
                for file_path, size in files:
                    if size is not None and size > self.max_file_bytes:
                        result.skip(file_path, self._file_too_large(file_path))
                        continue
                    await self._copy_file_in(file_path, result, manifest)
            finally:
                await asyncio.to_thread(manifest.save)
        return result

    async def _copy_file_in(self, path: str, result: HandoffResult, manifest: _Manifest) -> None:
        try:
            data = await self._read_contents(path)
        except _TooLarge:
            result.skip(path, self._file_too_large(path))
            return
        except SandboxError as e:
            result.skip(path, f"Jupyter's contents refused to read it: {e}")
            return
        if result.bytes + len(data) > self.max_bytes:
            raise self._total_too_large(result.bytes + len(data), path)
        try:
            await self.session.put_file(path, data)
        except (SandboxPathError, SandboxConflictError) as e:
            result.skip(path, f"the session refused it: {e}")
            return
        manifest.files[path] = hashlib.sha256(data).hexdigest()
        result.copied.append(path)
        result.bytes += len(data)

    async def _walk_contents(
        self, root: str, result: HandoffResult
    ) -> tuple[str, list[str], list[tuple[str, int | None]]]:
        """(kind of root, folders parents first, files with their listed size): what the contents manager
        lists under ``root``, bounded before anything is copied."""
        model = await self._contents_model(root)
        if model is None:
            raise SandboxNotFoundError(f"no file or folder {root or '/'!r} in Jupyter's contents")
        if self._is_link(root):
            raise SandboxPathError(
                f"{root!r} is a symlink in Jupyter's contents: hand off the folder it points to"
            )
        files: list[tuple[str, int | None]] = []
        if model.get("type") != "directory":
            files.append((root, _size(model)))
            self._check_totals(files, root)
            return "file", [], files
        folders: list[str] = []
        pending = [root]
        while pending:
            folder = pending.pop(0)
            folders.append(folder)
            if len(folders) > self.max_files:
                raise self._count_too_large("folders", root)
            listing = await self._contents_model(folder, content=True, type="directory")
            children = (listing or {}).get("content") or []
            for child in sorted(children, key=lambda c: str(c.get("name", ""))):
                name = child.get("name")
                why = _bad_name(name)
                if why is not None:
                    result.skip(_join(folder, str(name)), why)
                    continue
                name = str(name)
                child_path = _join(folder, name)
                if self._is_link(child_path):
                    result.skip(child_path, "a symlink in Jupyter's contents: not followed")
                elif child.get("type") == "directory":
                    pending.append(child_path)
                else:
                    files.append((child_path, _size(child)))
                    if len(files) > self.max_files:
                        raise self._count_too_large("files", root)
        self._check_totals(files, root)
        return "directory", folders, files

    def _check_totals(self, files: list[tuple[str, int | None]], root: str) -> None:
        total = 0
        for _path, size in files:
            if size is not None and size <= self.max_file_bytes:
                total += size
        if total > self.max_bytes:
            raise self._total_too_large(total, root)

    def _is_link(self, path: str) -> bool:
        """Whether the contents path is a symlink on disk, where the contents manager is file-backed (it
        says so through ``_get_os_path``); other contents managers have no links to follow."""
        get_os_path = getattr(self.contents, "_get_os_path", None)
        if get_os_path is None or not path:
            return False
        try:
            return os.path.islink(get_os_path(path))
        except (web.HTTPError, OSError, ValueError):
            return False

    # ---------------------------------------------------------------- copy back

    async def copy_back(self, path: str | None = None) -> HandoffResult:
        """Bring the session's changes under ``path`` (default: every handed-in path) back, by the rule."""
        wanted = None if path is None else handoff_path(path) or None  # "" (the root): all handed in
        result = HandoffResult("out", self.session.id, wanted or "")
        lock = self._lock()
        async with lock:
            await self._check_running()
            manifest = await asyncio.to_thread(_Manifest.load, self.manifest_path, self.session.id)
            targets = self._targets(manifest, wanted)
            plan: list[tuple[str, int | None]] = []
            seen: set[str] = set()
            hidden: list[str] = []
            for target, kind in targets:
                found = await self._walk_session(target, kind, result, hidden)
                plan.extend(found)
                seen.update(p for p, _ in found)
                if len(plan) > self.max_files:
                    raise self._count_too_large("files", target, session=True)
            total = sum(size for _, size in plan if size is not None and size <= self.max_file_bytes)
            if total > self.max_bytes:
                raise self._total_too_large(total, wanted or "", session=True)
            for target, _kind in targets:
                for known in sorted(manifest.files):
                    if (
                        _under(known, target)
                        and known not in seen
                        and not any(_under(known, h) for h in hidden)
                    ):
                        result.skip(
                            known,
                            "not in the session (deleted or no longer a file there): Jupyter's copy is kept",
                        )
            try:
                for file_path, size in plan:
                    if size is not None and size > self.max_file_bytes:
                        result.skip(file_path, self._file_too_large(file_path))
                        continue
                    await self._copy_file_back(file_path, result, manifest)
            finally:
                await asyncio.to_thread(manifest.save)
        return result

    def _targets(self, manifest: _Manifest, wanted: str | None) -> list[tuple[str, str]]:
        if not manifest.roots:
            raise SandboxConflictError(
                f"nothing was handed in to session {self.session.id}: copy a contents folder in first "
                '(direction "in"); only what was copied in comes back'
            )
        roots = sorted(manifest.roots)
        if wanted is None:
            tops = [r for r in roots if not any(o != r and _under(r, o) for o in roots)]
            return [(r, str(manifest.roots[r].get("kind", "directory"))) for r in tops]
        for root in sorted(roots, key=len, reverse=True):
            if _under(wanted, root):
                kind = str(manifest.roots[root].get("kind", "directory"))
                if kind == "file" and wanted != root:
                    break
                return [(wanted, kind)]
        shown = ", ".join(repr(r or "/") for r in roots)
        raise SandboxConflictError(
            f"{wanted or '/'!r} was not handed in to session {self.session.id} (handed in: {shown}); "
            "copy it in first, or copy back one of those"
        )

    async def _walk_session(
        self, root: str, kind: str, result: HandoffResult, hidden: list[str]
    ) -> list[tuple[str, int | None]]:
        """The session's regular files under ``root`` with their listed sizes; symlinks, special files and
        hidden names are skipped (listed), names that could leave the folder refused (listed)."""
        files: list[tuple[str, int | None]] = []
        first: list[dict[str, Any]] | None = None
        if kind != "file":
            try:
                first = await self.session.list_files(root or ".")
            except SandboxNotFoundError:
                return files
            except SandboxPathError:
                if not root:
                    raise
                kind = "file"  # not a folder in the session: the entry itself, as its folder lists it
        if kind == "file":
            parent, name = posixpath.split(root)
            try:
                entries = await self.session.list_files(parent or ".")
            except (SandboxNotFoundError, SandboxPathError):
                return files
            for entry in entries:
                if entry.get("name") == name:
                    if entry.get("type") == "file":
                        files.append((root, _size(entry)))
                    else:
                        result.skip(
                            root, f"a {entry.get('type')} in the session, not a regular file: not copied"
                        )
                        hidden.append(root)
            return files
        pending: list[tuple[str, list[dict[str, Any]] | None]] = [(root, first)]
        folders = 0
        while pending:
            folder, entries_or_none = pending.pop(0)
            folders += 1
            if folders > self.max_files:
                raise self._count_too_large("folders", root, session=True)
            if entries_or_none is None:
                try:
                    entries_or_none = await self.session.list_files(folder)
                except SandboxNotFoundError:
                    continue
                except SandboxPathError as e:
                    result.skip(folder, f"the session refused to list it: {e}")
                    hidden.append(folder)
                    continue
            for entry in sorted(entries_or_none, key=lambda e: str(e.get("name", ""))):
                entry_name = entry.get("name")
                why = _bad_name(entry_name)
                if why is not None:
                    result.skip(_join(folder, str(entry_name)), f"refused: {why}")
                    continue
                entry_name = str(entry_name)
                child = _join(folder, entry_name)
                why = self._hidden(child, entry_name)
                kind_of = entry.get("type")
                if why is None and kind_of == "symlink":
                    why = "a symlink in the session: never followed"
                elif why is None and kind_of not in ("file", "directory"):
                    why = f"a special file in the session ({kind_of}): not copied"
                if why is not None:
                    result.skip(child, why)
                    hidden.append(child)
                elif kind_of == "directory":
                    pending.append((child, None))
                else:
                    files.append((child, _size(entry)))
                    if len(files) > self.max_files:
                        raise self._count_too_large("files", root, session=True)
        return files

    def _hidden(self, path: str, name: str) -> str | None:
        """Why the contents manager would not show this name (None: it would)."""
        if path == AGENT_HOME:
            return "the agent's home folder: never copied back"
        if name.startswith(".") and not getattr(self.contents, "allow_hidden", False):
            return "hidden (ContentsManager.allow_hidden is off)"
        should_list = getattr(self.contents, "should_list", None)
        if should_list is not None and not should_list(name):
            return "hidden by ContentsManager.hide_globs"
        return None

    async def _copy_file_back(self, path: str, result: HandoffResult, manifest: _Manifest) -> None:
        try:
            digest = await self._session_hash(path)
        except _TooLarge:
            result.skip(path, self._file_too_large(path))
            return
        except (SandboxNotFoundError, SandboxPathError) as e:
            result.skip(path, f"the session refused to read it: {e}")
            return
        base = manifest.files.get(path)
        if digest == base:
            result.unchanged.append(path)
            return
        try:
            current = await self._contents_hash(path)
        except SandboxError as e:
            result.skip(path, f"Jupyter's contents refused to read it: {e}")
            return
        if current == "directory":
            result.skip(path, "a folder in Jupyter's contents has that path: Jupyter's folder is kept")
            return
        if current == digest:
            manifest.files[path] = digest
            result.unchanged.append(path)
            return
        try:
            data = await self._read_session(path)
        except _TooLarge:
            result.skip(path, self._file_too_large(path))
            return
        except (SandboxNotFoundError, SandboxPathError) as e:
            result.skip(path, f"the session refused to read it: {e}")
            return
        if result.bytes + len(data) > self.max_bytes:
            raise self._total_too_large(result.bytes + len(data), path, session=True)
        written = hashlib.sha256(data).hexdigest()
        if current is None or current == base:
            why = await self._write_contents(path, data)
            if why is not None:
                result.skip(path, why)
                return
            manifest.files[path] = written
            result.copied.append(path)
            result.bytes += len(data)
            return
        # both changed: Jupyter's copy is kept, the session's version goes beside it
        for n in range(1, _MAX_SANDBOX_COPIES + 1):
            candidate = _sandbox_copy_name(path, n)
            try:
                there = await self._contents_hash(candidate)
            except SandboxError:
                continue
            if there is None or there == written or there == manifest.sandbox_copies.get(candidate):
                if there != written:
                    why = await self._write_contents(candidate, data)
                    if why is not None:
                        result.skip(path, f"changed in both; its sandbox copy could not be written: {why}")
                        return
                    result.bytes += len(data)
                manifest.sandbox_copies[candidate] = written
                result.conflicts.append({"path": path, "sandbox_copy": candidate})
                return
        result.skip(path, f"changed in both, and {_MAX_SANDBOX_COPIES} names for its sandbox copy are taken")

    # --------------------------------------------------------- the two sides

    async def _contents_model(self, path: str, **kwargs: Any) -> dict[str, Any] | None:
        """The contents manager's model of ``path`` (None: no such path)."""
        kwargs.setdefault("content", False)
        try:
            model = await ensure_async(self.contents.get(path, **kwargs))
        except web.HTTPError as e:
            if e.status_code == 404:
                return None
            raise _contents_error(e, path) from None
        return dict(model)

    async def _read_contents(self, path: str) -> bytes:
        model = await self._contents_model(path, content=True, type="file", format="base64")
        if model is None:
            raise SandboxNotFoundError(f"{path!r} is gone from Jupyter's contents")
        content = model.get("content")
        if model.get("format") == "base64" and isinstance(content, str):
            try:
                data = base64.b64decode(content)
            except (binascii.Error, ValueError) as e:
                raise SandboxError(f"{path!r}: the contents manager's base64 is invalid: {e}") from None
        elif isinstance(content, str):
            data = content.encode()
        else:
            raise SandboxError(f"{path!r}: the contents manager gave no file content")
        if len(data) > self.max_file_bytes:
            raise _TooLarge
        return data

    async def _contents_hash(self, path: str) -> str | None:
        """sha256 of Jupyter's copy of ``path``; None when there is none, ``"directory"`` for a folder."""
        model = await self._contents_model(path)
        if model is None:
            return None
        if model.get("type") == "directory":
            return "directory"
        try:
            hashed = await ensure_async(
                self.contents.get(path, content=False, type="file", require_hash=True)
            )
        except TypeError:  # a contents manager from before require_hash
            hashed = {}
        except web.HTTPError as e:
            raise _contents_error(e, path) from None
        if hashed.get("hash_algorithm") == "sha256" and isinstance(hashed.get("hash"), str):
            return str(hashed["hash"])
        try:
            return hashlib.sha256(await self._read_contents(path)).hexdigest()
        except _TooLarge:
            return f"too-large:{path}"  # never a file's digest: counts as changed (a conflict, never overwritten)

    async def _write_contents(self, path: str, data: bytes) -> str | None:
        """Write a file to Jupyter's contents (its folders made first); None, or why it could not be."""
        try:
            folder = posixpath.dirname(path)
            parts = folder.split("/") if folder else []
            for i in range(1, len(parts) + 1):
                sub = "/".join(parts[:i])
                model = await self._contents_model(sub)
                if model is None:
                    await ensure_async(self.contents.save({"type": "directory"}, sub))
                elif model.get("type") != "directory":
                    return f"{sub!r} is a file in Jupyter's contents, not a folder"
            model = {"type": "file", "format": "base64", "content": base64.b64encode(data).decode("ascii")}
            await ensure_async(self.contents.save(model, path))
        except web.HTTPError as e:
            return f"Jupyter's contents refused it: {e.log_message or e.reason or e.status_code}"
        except SandboxError as e:
            return f"Jupyter's contents refused it: {e}"
        return None

    async def _session_hash(self, path: str) -> str:
        digest = hashlib.sha256()
        async for chunk in self._session_chunks(path):
            digest.update(chunk)
        return digest.hexdigest()

    async def _read_session(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self._session_chunks(path)])

    async def _session_chunks(self, path: str) -> AsyncIterator[bytes]:
        read = 0
        chunks = self.session.iter_file(path, _CHUNK)
        try:
            async for chunk in chunks:
                read += len(chunk)
                if read > self.max_file_bytes:
                    raise _TooLarge
                yield chunk
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    # ------------------------------------------------------------ the limits

    def _file_too_large(self, path: str) -> str:
        return f"over SandboxApp.handoff_max_file_bytes ({_mib(self.max_file_bytes)}): not copied"

    def _total_too_large(self, total: int, path: str, *, session: bool = False) -> HandoffTooLargeError:
        side = "the session's copy of" if session else "Jupyter's"
        return HandoffTooLargeError(
            f"{side} {path or '/'!r} holds {_mib(total)} or more, over SandboxApp.handoff_max_bytes "
            f"({_mib(self.max_bytes)}): hand off a smaller folder, or ask the operator to raise it"
        )

    def _count_too_large(self, what: str, path: str, *, session: bool = False) -> HandoffTooLargeError:
        side = "the session's copy of" if session else "Jupyter's"
        return HandoffTooLargeError(
            f"{side} {path or '/'!r} holds more than {self.max_files} {what}, over "
            "SandboxApp.handoff_max_files: hand off a smaller folder, or ask the operator to raise it"
        )


def _size(model: dict[str, Any]) -> int | None:
    size = model.get("size")
    return size if isinstance(size, int) and size >= 0 else None


def _contents_error(error: web.HTTPError, path: str) -> SandboxError:
    message = f"Jupyter's contents refused {path or '/'!r}: {error.log_message or error.reason or error.status_code}"
    if error.status_code == 404:
        return SandboxNotFoundError(message)
    if error.status_code == 403:
        return SandboxForbiddenError(message)
    if 400 <= error.status_code < 500:
        return SandboxPathError(message)
    return SandboxError(message)
