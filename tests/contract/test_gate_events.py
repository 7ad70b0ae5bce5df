"""The gate tells its listeners what passes through it (jupyter_tai_sandbox.events), on the real local provider:
a create and its failure, one-shot and interactive execs with their start, output (to output listeners only)
and end, files in and out, a destroy; a listener that raises never fails the call; with no listener the
interactive handle is the provider's own."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox import events as ev
from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import (
    ExecRequest,
    ExitItem,
    OutputChunk,
    SandboxSpecRejectedError,
    SessionSpec,
)
from jupyter_tai_sandbox.gate import ScrubbedHandle
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cr3t-Events-Value"


@pytest.fixture
def gate(tmp_path, monkeypatch):
    monkeypatch.setenv("TAI_EVENTS_SECRET", SECRET)
    policy = SandboxPolicy(isolation="none", scrub_transcript=True, credentials={"*": ["TAI_EVENTS_SECRET"]})
    return sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "root")), policy=policy)


def test_a_sessions_life_is_told_in_order_with_its_owner_and_the_transcripts_output_scrubbed(gate):
    told: list[ev.SandboxEvent] = []
    outputs: list[ev.SandboxEvent] = []
    gate.events.subscribe(told.append)
    gate.events.subscribe(outputs.append, output=True)

    async def main():
        session = await gate.create(SessionSpec(consumer="user:events", owner="alice", ttl_seconds=300))
        result = await session.exec(["sh", "-c", f"printf 'one %s' {SECRET}; exit 3"], timeout_seconds=30)
        assert result.exit_code == 3
        handle = await session.start(ExecRequest(["sh", "-c", "echo two; echo err >&2"], timeout_seconds=30))
        items = [item async for item in handle.output]
        assert isinstance(items[-1], ExitItem)
        await session.put_file("a.txt", b"hello")
        assert await session.get_file("a.txt") == b"hello"
        await session.destroy()
        return session.id

    session_id = asyncio.run(main())
    kinds = [e.kind for e in told]
    assert kinds == [
        ev.SESSION_CREATE,
        ev.EXEC_START,
        ev.EXEC_END,
        ev.EXEC_START,
        ev.EXEC_END,
        ev.FILE_PUT,
        ev.FILE_GET,
        ev.SESSION_DESTROY,
    ]
    assert all(e.session == session_id and e.owner == "alice" and e.provider == "local" for e in told)
    assert all(e.consumer == "user:events" for e in told)
    one_shot_start, one_shot_end, started, ended = told[1:5]
    assert one_shot_start.data["one_shot"] and one_shot_start.data["argv"][0] == "sh"
    assert one_shot_end.data["exec"] == one_shot_start.data["exec"]
    assert one_shot_end.data["exit_code"] == 3 and one_shot_end.data["stdout_bytes"] == len(f"one {SECRET}")
    assert "stdout" not in one_shot_end.data  # output bytes reach output listeners only
    assert ended.data["exec"] == started.data["exec"] != one_shot_end.data["exec"]
    assert (
        ended.data["exit_code"] == 0 and ended.data["stdout_bytes"] == 4 and ended.data["stderr_bytes"] == 4
    )
    assert told[5].data == {"path": "a.txt", "size": 5} and told[6].data == {"path": "a.txt", "size": 5}

    # the output listener hears the chunks, and the one-shot's output, scrubbed
    end = next(e for e in outputs if e.kind == ev.EXEC_END and e.data["exec"] == one_shot_end.data["exec"])
    assert SECRET.encode() not in end.data["stdout"] and end.data["stdout"].startswith(b"one ")
    chunks = [e for e in outputs if e.kind == ev.EXEC_OUTPUT]
    assert {e.data["exec"] for e in chunks} == {started.data["exec"]}
    assert b"".join(e.data["bytes"] for e in chunks if e.data["stream"] == "stdout") == b"two\n"
    assert not [e for e in told if e.kind == ev.EXEC_OUTPUT]


def test_a_refused_create_is_told_with_the_error_and_a_failing_listener_fails_nothing(gate):
    told: list[ev.SandboxEvent] = []

    def broken(event):
        raise RuntimeError("listener bug")

    gate.events.subscribe(broken)
    gate.events.subscribe(told.append)

    async def main():
        with pytest.raises(SandboxSpecRejectedError):
            await gate.create(SessionSpec(consumer="user:events", owner="bob", network="none"))
        session = await gate.create(SessionSpec(consumer="user:events", owner="bob", ttl_seconds=300))
        await session.exec(["true"], timeout_seconds=30)
        await session.destroy()

    asyncio.run(main())
    failed = told[0]
    assert failed.kind == ev.SESSION_CREATE_FAILED and failed.owner == "bob"
    assert failed.data["error"] == "SandboxSpecRejectedError" and "network" in failed.data["message"]
    assert [e.kind for e in told[1:]] == [ev.SESSION_CREATE, ev.EXEC_START, ev.EXEC_END, ev.SESSION_DESTROY]


def test_with_no_listener_an_interactive_command_keeps_the_providers_handle(tmp_path):
    gate = sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=SandboxPolicy(isolation="none")
    )

    async def main():
        session = await gate.create(SessionSpec(consumer="user:events", ttl_seconds=300))
        try:
            handle = await session.start(ExecRequest(["echo", "x"], timeout_seconds=30))
            assert not isinstance(handle, ScrubbedHandle)
            items = [i async for i in handle.output]
            assert items[0] == OutputChunk("stdout", b"x\n")
            gate.events.subscribe(lambda event: None)
            handle = await session.start(ExecRequest(["echo", "y"], timeout_seconds=30))
            assert isinstance(handle, ScrubbedHandle)
            items = [i async for i in handle.output]
            assert items[0] == OutputChunk("stdout", b"y\n")
        finally:
            await session.destroy()

    asyncio.run(main())
