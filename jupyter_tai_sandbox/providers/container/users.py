"""The uid and gid a container session's commands and file operations run as: a ``user`` setting read the
way Docker reads it (``uid``, ``uid:gid``, ``name``, ``name:group``), against the image's own
``/etc/passwd`` and ``/etc/group``.

A numeric uid need not be in the image (its gid is then its passwd entry's, else 0); a name must be, as
must a group name. Supplementary groups are not given: the agent runs each command with none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ...contract import SandboxError

#: reads a file of the session's image (a path under /), or None when there is none
ReadFile = Callable[[str], Awaitable[bytes | None]]
MAX_ID = 2**31 - 1


def _entries(text: bytes | None) -> list[list[str]]:
    lines = (text or b"").decode("utf-8", "replace").splitlines()
    return [line.split(":") for line in lines if line and not line.startswith("#")]


def _number(value: str) -> int | None:
    return int(value) if value.isdigit() and int(value) <= MAX_ID else None


async def resolve_user(user: str, read: ReadFile) -> tuple[int, int]:
    """``(uid, gid)`` for ``user``; a SandboxError naming what the image lacks."""
    name, _, group = user.partition(":")
    if not name:
        raise SandboxError(f"user {user!r}: no user named")
    uid, gid = _number(name), None
    if uid is None or not group:
        passwd = await read("etc/passwd")
        for fields in _entries(passwd):
            if len(fields) >= 4 and (fields[0] == name or (uid is not None and _number(fields[2]) == uid)):
                uid, gid = _number(fields[2]), _number(fields[3])
                break
        else:
            if uid is None:
                where = "/etc/passwd" if passwd is not None else "/etc/passwd (the image has none)"
                raise SandboxError(f"user {user!r}: no user {name!r} in the session image's {where}")
    if group:
        gid = _number(group)
        if gid is None:
            groups = await read("etc/group")
            gid = next((_number(f[2]) for f in _entries(groups) if len(f) >= 3 and f[0] == group), None)
            if gid is None:
                raise SandboxError(f"user {user!r}: no group {group!r} in the session image's /etc/group")
    if uid is None:
        raise SandboxError(f"user {user!r}: the image's /etc/passwd gives no valid uid")
    return uid, 0 if gid is None else gid
