"""Two SandboxApps in one process share no state: each has its own gate (policy, output and spill
limits), its own sessions, its own live-command registry and workspace leases, and neither writes
process globals (OutputSpool's default, os.environ) that the other would read."""

from __future__ import annotations

import asyncio
import os

import pytest
from traitlets.config import Config

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.app import SandboxApp
from jupyter_tai_sandbox.contract import (
    ExecRequest,
    ExitItem,
    OutputChunk,
    SandboxNotFoundError,
    SandboxRequestError,
    SessionSpec,
)
from jupyter_tai_sandbox.errors import OutputTooLargeError
from jupyter_tai_sandbox.spool import DEFAULT_DISK_LIMIT, OutputSpool

FOUR_MIB = 4 << 20


def make_app(tmp_path, name: str, *, spill: int, ceiling: float, per_user: int) -> SandboxApp:
    config = Config(
        {
            "SandboxApp": {
                "provider": "local",
                "presets_path": str(tmp_path / f"{name}-presets.json"),
                "max_spill_bytes": spill,
                "max_live_commands_per_user": per_user,
            },
            "SandboxPolicy": {"isolation": "none", "max_timeout_seconds": ceiling},
            "LocalSandbox": {"root": str(tmp_path / name), "output_memory_bytes": 256 << 10},
        }
    )
    app = SandboxApp(config=config)
    app.initialize_settings()
    return app


async def unread_output(app: SandboxApp, session_id: str) -> tuple[int, object]:
    """Start a command writing 4 MiB, let nobody read it until it is done, then read it all."""
    session = await app.access.require().get(session_id)
    handle = await session.start(ExecRequest(["head", "-c", str(FOUR_MIB), "/dev/zero"], 30))
    await asyncio.sleep(2)
    received, end = 0, None
    try:
        async for item in handle.output:
            if isinstance(item, OutputChunk):
                received += len(item.data)
            elif isinstance(item, ExitItem):
                end = item
    except OutputTooLargeError as e:
        end = e
    await handle.kill()
    return received, end


def test_two_apps_in_one_process_keep_their_own_gate_limits_and_registries(tmp_path):
    environ = dict(os.environ)
    tight = make_app(tmp_path, "tight", spill=1 << 20, ceiling=30.0, per_user=1)
    loose = make_app(tmp_path, "loose", spill=0, ceiling=120.0, per_user=5)

    async def main() -> None:
        try:
            # each app's doors reach its own gate, under its own policy
            assert tight.access is not loose.access
            assert tight.sandbox.policy is tight.policy and loose.sandbox.policy is loose.policy
            assert tight.registry.access is tight.access and tight.tools.access is tight.access
            assert loose.registry.access is loose.access and loose.tools.access is loose.access
            assert tight.access.workspace_leases is not loose.access.workspace_leases
            assert (tight.execs.policy.max_per_user, loose.execs.policy.max_per_user) == (1, 5)
            with pytest.raises(SandboxRequestError):
                tight.sandbox.admit(ExecRequest(["true"], 60), one_shot=True)
            assert loose.sandbox.admit(ExecRequest(["true"], 60), one_shot=True).timeout_seconds == 60
            # each app's sessions live under its own provider
            mine = await tight.sandbox.create(SessionSpec())
            theirs = await loose.sandbox.create(SessionSpec())
            with pytest.raises(SandboxNotFoundError):
                await loose.sandbox.get(mine.id)
            # each app's spill cap holds for its own commands (OutputSpool's class default is untouched)
            (kept, tight_end), (given, loose_end) = await asyncio.gather(
                unread_output(tight, mine.id), unread_output(loose, theirs.id)
            )
            assert isinstance(tight_end, OutputTooLargeError) and "max_spill_bytes" in str(tight_end)
            assert kept < FOUR_MIB
            assert (given, loose_end) == (FOUR_MIB, ExitItem(0))
            assert OutputSpool.default_disk_limit == DEFAULT_DISK_LIMIT
            await mine.destroy()
            await theirs.destroy()
        finally:
            await tight.stop_extension()
            await loose.stop_extension()

    try:
        asyncio.run(main())
    finally:
        sandboxes.unregister_sandbox()
    assert dict(os.environ) == environ
