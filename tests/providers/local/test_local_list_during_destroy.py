"""A listing (or a get) that runs while a session is destroyed never adopts it back from its sidecar, still on
disk until the destroy's thread removes it (the metrics' background re-read lists sessions at any time)."""

from __future__ import annotations

import asyncio
import contextlib

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SessionSpec
from jupyter_tai_sandbox.providers.local import LocalSandbox


async def get_back(provider: LocalSandbox, session_id: str) -> None:
    with contextlib.suppress(SandboxNotFoundError):
        await provider.get(session_id)


def test_a_list_during_a_destroy_does_not_bring_the_session_back(tmp_path):
    async def main() -> None:
        provider = LocalSandbox(root=str(tmp_path))
        try:
            for _ in range(100):
                session = await provider.create(SessionSpec())
                await asyncio.gather(session.destroy(), provider.list(), get_back(provider, session.id))
                assert session.id not in [info.id for info in await provider.list()]
        finally:
            await provider.close()

    asyncio.run(main())
