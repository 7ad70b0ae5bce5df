"""The vm provider's machines on this host: one QEMU microVM per session, each in a folder of its own.

::

    <state_dir>/<deployment tag>/
        sessions/<session id>/    session.json (the record: labels, env, end), qemu.pid, agent*.sock (the
                                  host side of the agent's ports), agent*.lock, qemu.log (no console: a
                                  session's guest console goes nowhere)
        workspaces/<hash>.img     a persistent workspace (an ext4 disk image), <hash>.json its key and owner:
                                  <hash of the key>.img unscoped, <owner tag>-<hash of the key>.img an
                                  owner's own (keys are a namespace per owner: providers/_workspaces)

QEMU runs as a daemon of its own, so a session outlives the server that made it; any server of the
deployment finds it from its folder. With a root server it runs as a uid of its own, chrooted into its
folder, which it cannot read (``guest.qemu.confined``): the folder and all in it stay root's. A pid
counts only while ``/proc/<pid>/cmdline`` names the folder's agent socket (pids are reused). The guest
has PORTS agent ports, each taking one host connection at a time: a connection holds its port's lock file
(``flock``, let go with the connection or its process), so two servers' connections never share a port.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from ...agent import AgentClient
from ...contract import SandboxConflictError, SandboxError, SandboxNotFoundError, SandboxUnavailableError
from .._workspaces import owner_tag
from .guest.qemu import (
    BOOT_ATTEMPT,
    QEMU_UIDS,
    VmError,
    confinable,
    confined,
    free_uid,
    open_port,
    port_socket,
    start_detached,
    uids_mapped,
)

#: agent ports per guest: a server's connection, a synchronous look-up's, another server's, one spare
PORTS = 4
RECORD = "session.json"
#: how long an open waits for a free port before it fails
PORT_WAIT_SECONDS = 10.0
#: how long a killed QEMU may take to be gone
KILL_WAIT_SECONDS = 5.0
#: the longest a unix socket's path may be
MAX_SOCKET_PATH = 107


class Machines:
    """The session folders and workspace images of one deployment under ``root``."""

    def __init__(self, root: str | Path, tag: str, *, qemu_uids: tuple[int, int] | None = QEMU_UIDS) -> None:
        self.root = Path(root) / tag
        self.qemu_uids = qemu_uids
        self.sessions = self.root / "sessions"
        self.workspaces = self.root / "workspaces"
        longest = port_socket(self.sessions / ("x" * 20), PORTS - 1)
        if len(str(longest)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{root} is too long a path for the agent's unix sockets (at most "
                f"{MAX_SOCKET_PATH - len(str(longest)) + len(str(root))} characters)"
            )

    def folder(self, session_id: str) -> Path:
        return self.sessions / session_id

    # ------------------------------------------------------------- records

    def ids(self) -> list[str]:
        try:
            return sorted(entry.name for entry in os.scandir(self.sessions) if entry.is_dir())
        except FileNotFoundError:
            return []

    def read(self, session_id: str) -> dict[str, Any] | None:
        """The session's record; None when it has none (gone, or still being made)."""
        try:
            record = json.loads((self.folder(session_id) / RECORD).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def write(self, session_id: str, record: dict[str, Any]) -> None:
        """Replace the session's record at once (readers see the old one or the new one)."""
        folder = self.folder(session_id)
        tmp = folder / f".{RECORD}.{os.getpid()}.{id(record)}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
        )  # env values are secrets
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        tmp.replace(folder / RECORD)

    def made_at(self, session_id: str) -> float | None:
        with contextlib.suppress(OSError):
            return self.folder(session_id).stat().st_mtime
        return None

    # ------------------------------------------------------------- processes

    def pid(self, session_id: str) -> int | None:
        """QEMU's pid while it runs this session's guest, else None."""
        folder = self.folder(session_id)
        try:
            pid = int((folder / "qemu.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        if state in ("Z", "X") or f"path={port_socket(folder, 0)},".encode() not in cmdline:
            return None
        return pid

    def running(self, session_id: str) -> bool:
        return self.pid(session_id) is not None

    async def start(
        self,
        session_id: str,
        argv: list[str],
        *,
        enter: list[str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> int:
        """Start the session's QEMU (``argv``, run through ``enter``: a seat's namespace; inheriting
        ``pass_fds``) as a daemon; confined
        (:func:`.guest.qemu.confined`: a uid of its own, chrooted into the session's folder) when the server is
        root and :attr:`qemu_uids` is set. Its pid."""
        folder = self.folder(session_id)
        if self.qemu_uids is not None and confinable():
            if not uids_mapped(*self.qemu_uids):
                raise SandboxUnavailableError(
                    "VmSandbox.qemu_uids {}-{} are not all uids of this server's user namespace "
                    "(/proc/self/uid_map): name a range it has, or '' to run QEMU as root".format(
                        *self.qemu_uids
                    )
                )
            argv = confined(argv, uid=free_uid(*self.qemu_uids), root=folder)
        try:
            return await start_detached([*(enter or []), *argv], folder, pass_fds=pass_fds)
        except VmError as e:
            if "lock" in str(e):  # QEMU locks a disk image it writes: another live session has the workspace
                raise SandboxConflictError(
                    "the persistent workspace is in use by another live session: destroy that one first"
                ) from None
            raise SandboxUnavailableError(f"the session's VM did not start: {e}") from None

    async def stop(self, session_id: str, *, keep_folder: bool = False) -> None:
        """Kill the session's QEMU (its guest and all it runs go with it), wait until it is gone, and remove the
        session's folder (unless ``keep_folder``). Gone already is not an error."""
        pid = self.pid(session_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            give_up = time.monotonic() + KILL_WAIT_SECONDS
            # an exiting process's cmdline reads empty before its files (the disk image's locks) are let go
            while not _exited(pid) and time.monotonic() < give_up:
                await asyncio.sleep(0.02)
        if not keep_folder:
            await asyncio.to_thread(shutil.rmtree, self.folder(session_id), True)

    # ------------------------------------------------------------- agent ports

    async def open_agent(
        self, session_id: str, *, timeout: float = PORT_WAIT_SECONDS, booting: bool = False
    ) -> AgentClient:
        """A connection to the session's agent over a free port (its lock held while the connection is open)."""
        folder = self.folder(session_id)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        while True:
            if not self.running(session_id):
                raise SandboxNotFoundError(f"session {session_id} is gone (its VM does not run)")
            for index in range(PORTS):
                fd = _try_lock(folder / f"agent{index}.lock")
                if fd is None:
                    continue
                try:
                    return await open_port(
                        port_socket(folder, index),
                        timeout=max(0.5, give_up - loop.time()),
                        attempt=BOOT_ATTEMPT if booting else 2.0,
                        running=lambda: self.running(session_id),
                        on_close=functools.partial(os.close, fd),
                    )
                except BaseException as e:
                    os.close(fd)
                    if isinstance(e, VmError):
                        if not self.running(session_id):
                            raise SandboxNotFoundError(
                                f"session {session_id} is gone (its VM stopped)"
                            ) from None
                        raise SandboxError(f"the agent of session {session_id} did not answer: {e}") from None
                    raise
            if loop.time() >= give_up:
                raise SandboxUnavailableError(
                    f"every agent port of session {session_id} is in use ({PORTS}: other servers or look-ups)"
                )
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------- workspaces

    def workspace_image(self, key: str, owner: str | None = None) -> Path:
        """Workspace ``key``'s disk image: the key's unscoped one (``owner`` None), or ``owner``'s own; the two
        kinds of names never meet (``<32 hex>.img``, ``<32 hex>-<32 hex>.img``)."""
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        if owner is not None:
            name = f"{owner_tag(owner)}-{name}"
        return self.workspaces / (name + ".img")

    def workspace_record(self, key: str, owner: str | None = None) -> dict[str, Any] | None:
        try:
            return json.loads(self.workspace_image(key, owner).with_suffix(".json").read_text())
        except (OSError, ValueError):
            return None

    async def ensure_workspace(
        self, key: str, record: dict[str, Any], size_mb: int, owner: str | None = None
    ) -> Path:
        """The workspace's disk image (``owner``'s own, or the key's unscoped one), made (ext4, ``size_mb``,
        sparse) with ``record`` beside it when absent."""
        image = self.workspace_image(key, owner)
        if image.exists():
            return image
        self.workspaces.mkdir(parents=True, exist_ok=True, mode=0o700)  # a workspace is its owner's only
        tmp = image.with_name(f".{image.name}.{os.getpid()}.{id(record)}")
        try:
            with os.fdopen(
                os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), "wb"
            ) as f:
                f.truncate(size_mb << 20)
            done = await asyncio.create_subprocess_exec(
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "root_owner=0:0",
                str(tmp),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await done.communicate()
            if done.returncode != 0:
                raise SandboxError(
                    f"making the workspace's disk image failed: {err.decode(errors='replace')[-500:]}"
                )
            image.with_suffix(".json").write_text(json.dumps(record))
            with contextlib.suppress(FileExistsError):  # another server made it meanwhile: theirs stays
                os.link(tmp, image)
        except FileNotFoundError:
            raise SandboxUnavailableError("mkfs.ext4 is missing: install Debian's e2fsprogs") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return image

    def remove_workspace(self, key: str, owner: str | None = None) -> None:
        """Remove the workspace's image (``owner``'s own, or the key's unscoped one); one a live session holds
        is a conflict."""
        image = self.workspace_image(key, owner)
        try:
            fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            try:  # QEMU holds byte-range locks on an image it writes
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise SandboxError(f"removing workspace {key!r}: {e}") from None
                raise SandboxConflictError(
                    f"workspace {key!r} is in use by another session: destroy that one first"
                ) from None
            image.unlink()
            with contextlib.suppress(FileNotFoundError):
                image.with_suffix(".json").unlink()
        finally:
            os.close(fd)


def _exited(pid: int) -> bool:
    """The process is gone, or a zombie whose every thread has ended (its files closed: the leader of a
    killed group is a zombie while its other threads still exit)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X") and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (OSError, IndexError):
        return True


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
