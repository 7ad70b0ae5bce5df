"""Host processes as the tests see them: read from /proc, where a zombie counts as stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def kill_quietly(pid: int | None) -> None:
    """SIGKILL ``pid`` if it is still there (a test's cleanup after a failed check)."""
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


async def wait_stopped(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def pids_running(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read() and running(int(entry)):
                    found.append(int(entry))
    return found
