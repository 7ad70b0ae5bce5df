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

from ..contract import SandboxError, SandboxNotFoundError, SandboxPathError

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
        raise SandboxNotFoundError(f"cannot {action} {path!r}: no such file or folder in the workspace") from None
    except OSError as e:
        reason = e.strerror or str(e)
        if e.errno in _HOST_ERRNOS:
            raise SandboxError(f"cannot {action} {path!r}: {reason}") from None
        raise SandboxPathError(f"cannot {action} {path!r}: {reason}") from None
