"""Seed 002's per-workspace_key lease for code tools: two runs on one durable workspace take turns."""

from __future__ import annotations

import asyncio

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.tools import OPERATOR_CLI, PresetStore, ToolRegistry
from jupyter_tai_sandbox.tools.fence import Decided

APPEND = {
    "description": "Note a run's start and end in a durable workspace.",
    "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "session": {"durability": "persistent", "workspace_key": "shared-log"},
    "binding": {
        "script": 'echo "start $1" >> log; sleep 0.5; echo "end $1" >> log; cat log',
        "args": [{"field": "name"}],
        "timeout_seconds": 30,
    },
}


def test_two_runs_on_one_workspace_key_take_turns(tmp_path):
    async def main() -> str:
        sandboxes.register_sandbox(
            LocalSandbox(root=str(tmp_path / "sbx")), policy=SandboxPolicy(isolation="none")
        )
        registry = ToolRegistry(PresetStore(tmp_path / "presets.json"))
        registry.author(APPEND, principal=OPERATOR_CLI, name="append")
        first, second = await asyncio.gather(
            registry.run("append", {"name": "a"}, principal=OPERATOR_CLI),
            registry.run("append", {"name": "b"}, principal=OPERATOR_CLI),
        )
        return max(first["stdout"], second["stdout"], key=len)

    log = asyncio.run(main()).split("\n")
    runs = [line.split()[1] for line in log if line.startswith("start")]
    # never interleaved: each start is followed by its own end
    assert log[:4] == [f"start {runs[0]}", f"end {runs[0]}", f"start {runs[1]}", f"end {runs[1]}"], log


def test_two_owners_runs_on_one_key_name_are_on_two_workspaces(tmp_path):
    async def main() -> list[str]:
        sandboxes.register_sandbox(
            LocalSandbox(root=str(tmp_path / "sbx")), policy=SandboxPolicy(isolation="none")
        )
        registry = ToolRegistry(PresetStore(tmp_path / "presets.json"))
        registry.author(APPEND, principal=OPERATOR_CLI, name="append")
        users = [
            Decided(name=name, door="mcp", allowed=frozenset({"execute"}), owner=name)
            for name in ("alice", "bob")
        ]
        results = await asyncio.gather(
            *(registry.run("append", {"name": user.owner}, principal=user) for user in users)
        )
        return [result["stdout"] for result in results]

    # keys are a namespace per owner: each log holds its own owner's run only
    assert asyncio.run(main()) == ["start alice\nend alice\n", "start bob\nend bob\n"]
