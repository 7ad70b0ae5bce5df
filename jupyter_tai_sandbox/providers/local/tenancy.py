"""Who owns a sandbox-local persistent workspace, and who holds it: owner records and key leases.

Both live beside the workspaces, never inside one (a session's commands can write
anywhere in their workspace), in the folder holding the workspace (``<root>`` for
``<root>/<key>``, ``<root>/.by-owner/<owner tag>`` for an owner's own ones):

- ``.owners/<key>.json`` names the owner (the principal) that first used the
  workspace. A session with an owner may only mount a workspace recorded as its own.
- ``.locks/<key>.lock`` is the workspace's lease (seed 002's per-workspace_key lease): every live
  persistent session holds a shared ``flock`` on it for its life, in whichever server
  process on this root it lives. Removing the workspace takes it exclusive without
  waiting, and is refused while anyone else holds it. ``<key>.gate`` serializes those
  attempts, so the short moment a shared lock is let go while it is being made
  exclusive is never seen by another remover.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...contract import SandboxConflictError, SandboxError, SandboxNotFoundError


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def _gate(folder: Path, key: str) -> Iterator[None]:
    fd = _open_lock(folder / f"{key}.gate")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held only while a lease is made exclusive: never long
        yield
    finally:
        os.close(fd)


class WorkspaceLease:
    """One session's hold on a workspace key: a shared flock on its own open lock file.

    Blocking calls (file locks, small files): run them off the event loop.
    """

    def __init__(self, folder: Path, key: str) -> None:
        self._folder, self.key = folder, key
        self._fd: int | None = _open_lock(folder / f"{key}.lock")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise SandboxConflictError(
                f"the persistent workspace {key!r} is being removed; try again once that is done"
            ) from None
        except BaseException:
            self.release()
            raise
        self.exclusive = False

    def try_exclusive(self) -> bool:
        """Hold the key alone, if no other session (here or in another process) holds it."""
        if self._fd is None:
            raise SandboxError(f"the lease on workspace {self.key!r} was released")
        if self.exclusive:
            return True
        with _gate(self._folder, self.key):
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # the failed conversion let the shared lock go: take it back (only removers,
                # all behind the gate, ever take the lock exclusive, so this cannot block)
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:  # pragma: no cover - the gate rules it out
                    raise SandboxError(f"lost the lease on workspace {self.key!r}") from None
                return False
        self.exclusive = True
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def holders_elsewhere(folder: Path, key: str) -> bool:
    """Whether any session (in any process) holds ``key`` now; blocking."""
    path = folder / f"{key}.lock"
    if not path.exists():
        return False
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def read_owner(folder: Path, key: str) -> dict[str, Any] | None:
    """The owner record of ``key`` (``{"owner": ..., "created_at": ...}``), or None when there is none."""
    try:
        record = json.loads((folder / f"{key}.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SandboxError(f"the owner record of workspace {key!r} cannot be read: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("owner"), str):
        raise SandboxError(f"the owner record of workspace {key!r} is malformed")
    return record


def claim_or_check_owner(folder: Path, key: str, owner: str | None) -> None:
    """Record ``owner`` for a key nobody owns yet, or refuse one recorded as someone else's.

    ``owner`` None (direct use, no principal) checks nothing and records nothing. A key
    of another owner answers as not found, and is never mounted.
    """
    if owner is None:
        return
    record = read_owner(folder, key)
    if record is None:
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".{key}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        temp.write_text(json.dumps({"owner": owner, "key": key, "created_at": time.time()}))
        try:
            os.link(temp, folder / f"{key}.json")  # fails if another claim came first
        except FileExistsError:
            pass
        finally:
            temp.unlink(missing_ok=True)
        record = read_owner(folder, key)
    if record is None or record["owner"] != owner:
        raise SandboxNotFoundError(
            f"no persistent workspace {key!r} is available to this user: choose another workspace_key"
        )


def forget_owner(folder: Path, key: str) -> None:
    (folder / f"{key}.json").unlink(missing_ok=True)
