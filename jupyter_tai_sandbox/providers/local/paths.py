"""Host path errors of sandbox-local: what a user-supplied workspace path may raise, typed.

Every OS error from a path a caller named (too long, not a folder, a folder where a
file is wanted, no permission...) becomes :class:`SandboxPathError` (a 400 at the
doors), a missing one :class:`SandboxNotFoundError`; errors that are the host's and
not the path's (a full disk) stay a plain :class:`SandboxError`. Never a bare OSError.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from ...contract import SandboxError, SandboxNotFoundError, SandboxPathError

#: Longest file name and path Linux takes (NAME_MAX, PATH_MAX including the NUL).
NAME_MAX = 255
PATH_MAX = 4096

#: Errors of the host, not of the path the caller gave.
_HOST_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EROFS}
)


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, for every thread)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


#: Mode of an uploaded file: what ``open(path, "w")`` would give it.
NEW_FILE_MODE = 0o666 & ~_umask()


#: Mode of the provider's root (workspaces, sidecars, owners, leases): the server's account only,
#: as Jupyter keeps its own runtime files (a kernel's connection file holds its key).
ROOT_MODE = 0o700


def private_folder(path: str | os.PathLike[str]) -> None:
    """Make ``path`` (and missing parents) a folder only its owner can enter: mode 0700, tightened
    when it already exists with group or other bits and belongs to this account (blocking)."""
    os.makedirs(path, mode=ROOT_MODE, exist_ok=True)
    info = os.stat(path)
    if info.st_mode & 0o077 and info.st_uid == os.geteuid():
        os.chmod(path, ROOT_MODE)


def check_name_lengths(path: str, rel: str) -> None:
    """Refuse a workspace path no host file can have: a name over NAME_MAX bytes, or too long a path."""
    for name in rel.split("/"):
        if len(os.fsencode(name)) > NAME_MAX:
            raise SandboxPathError(
                f"path {path!r}: the name {name[:40]!r}... is {len(os.fsencode(name))} bytes; "
                f"a file name takes at most {NAME_MAX}"
            )
    if len(os.fsencode(rel)) >= PATH_MAX:
        raise SandboxPathError(f"path {path[:40]!r}... is too long: at most {PATH_MAX - 1} bytes")


@contextlib.contextmanager
def path_errors(path: str, action: str) -> Iterator[None]:
    """Turn OS errors raised while using ``path`` into the sandbox's typed errors."""
    try:
        yield
    except SandboxError:
        raise
    except FileNotFoundError:
        raise SandboxNotFoundError(
            f"cannot {action} {path!r}: no such file or folder in the workspace"
        ) from None
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno in _HOST_ERRNOS:
            raise SandboxError(f"cannot {action} {path!r}: {reason}") from None
        raise SandboxPathError(f"cannot {action} {path!r}: {reason}") from None
