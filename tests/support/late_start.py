"""A local provider whose interactive starts answer late: ``start()`` returns only after the command has
run a while, so everything it wrote meanwhile waits in its handle (as with a slow engine or a loaded server).

Used as ``SandboxApp.provider = "tests.support.late_start:LateStartSandbox"``.
"""

from __future__ import annotations

import asyncio

from jupyter_tai_sandbox.contract import ExecHandle, ExecRequest
from jupyter_tai_sandbox.providers.local import LocalSandbox, LocalSession

#: how long after the command starts its start() returns
LATE_SECONDS = 1.0


class LateStartSession(LocalSession):
    async def start(self, request: ExecRequest) -> ExecHandle:
        handle = await super().start(request)
        await asyncio.sleep(LATE_SECONDS)
        return handle


class LateStartSandbox(LocalSandbox):
    session_class = LateStartSession
