"""``python -m jupyter_tai_sandbox.kernels.watchdog < ORDER``: destroy a sandboxed kernel's session once
the client process that started it has died (see ``loop.watch_client``).

ORDER, read from stdin (never argv, which every local user can read), is JSON: ``pid`` (the
client), ``session`` (its id), ``provider`` ("module:Class") and ``config`` (the provider's
traitlets config). SIGTERM (a clean shutdown) ends the watchdog at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import select
import sys
import time
from typing import Any


def wait_for_death(pid: int) -> None:
    """Block until process ``pid`` has ended."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    while True:  # no pidfd (an old kernel): poll
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.5)


async def destroy(order: dict[str, Any]) -> None:
    from traitlets.config import Config, Configurable

    module, _, name = order["provider"].partition(":")
    cls = getattr(importlib.import_module(module), name)
    sandbox = cls(config=Config(order["config"])) if issubclass(cls, Configurable) else cls()
    try:
        session = await sandbox.get(order["session"])
        await session.destroy(remove_workspace=False)
    finally:
        with contextlib.suppress(Exception):
            await sandbox.close()


def main() -> int:
    order = json.loads(sys.stdin.read())
    wait_for_death(int(order["pid"]))
    with contextlib.suppress(Exception):  # the session may be gone already
        asyncio.run(destroy(order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
