"""sandbox-local behaviour beyond the shared contract (the conformance suite covers that)."""

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import sys
import time

import pytest

from jupyter_tai_sandbox.contract import (
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxSpecRejectedError,
    SessionSpec,
)
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.aio import run
from tests.support.processes import kill_quietly, running, wait_stopped


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SessionSpec(isolation="container"), "isolation"),
        (SessionSpec(isolation="vm"), "isolation"),
        (SessionSpec(network="none"), "network"),
        (SessionSpec(network="internal"), "network"),
        (SessionSpec(cpu=1), "cpu/memory_mb"),
        (SessionSpec(memory_mb=512), "cpu/memory_mb"),
    ],
)
def test_local_rejects_what_a_host_process_cannot_honour(sandbox, tmp_path, spec, message):
    with pytest.raises(SandboxSpecRejectedError, match=message):
        run(sandbox.create(spec))
    assert not (tmp_path / ".ephemeral").exists() or not any((tmp_path / ".ephemeral").iterdir())


def test_root_defaults_to_sandbox_local_root(monkeypatch, tmp_path):
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path / "from-env"))
    assert LocalSandbox().root == str(tmp_path / "from-env")


def test_ephemeral_workspace_lives_under_dot_ephemeral_and_dies_with_the_session(sandbox, tmp_path):
    async def scenario():
        session = await sandbox.create(SessionSpec(image="python:3.12"))
        workspace = tmp_path / ".ephemeral" / session.id
        assert (await session.info()).workspace == str(workspace) and workspace.is_dir()
        sidecar = json.loads((tmp_path / ".sessions" / f"{session.id}.json").read_text())
        assert sidecar["image"] == "python:3.12" and (await session.info()).image == "python:3.12"
        await session.destroy()
        assert not workspace.exists()
        assert not (tmp_path / ".sessions" / f"{session.id}.json").exists()

    run(scenario())


def test_persistent_workspace_is_adopted_and_survives_destroy_and_reap(sandbox, tmp_path):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "existing.txt").write_text("was here")

    async def scenario():
        spec = SessionSpec(durability="persistent", workspace_key="project", ttl_seconds=0.2)
        session = await sandbox.create(spec)
        assert (await session.get_file("existing.txt")) == b"was here"
        await session.put_file("new.txt", b"new")
        await asyncio.sleep(0.3)
        assert await sandbox.reap() == [session.id]
        assert (tmp_path / "project" / "new.txt").read_bytes() == b"new"
        again = await sandbox.create(spec.replace(ttl_seconds=60))
        await again.destroy()
        assert (tmp_path / "project" / "new.txt").exists()
        last = await sandbox.create(spec.replace(ttl_seconds=60))
        await last.destroy(remove_workspace=True)
        assert not (tmp_path / "project").exists()

    run(scenario())


def test_credentials_stay_off_disk(sandbox, tmp_path):
    async def scenario():
        session = await sandbox.create(SessionSpec(env={"API_TOKEN": "very-secret"}))
        sidecar = (tmp_path / ".sessions" / f"{session.id}.json").read_text()
        assert "very-secret" not in sidecar and "API_TOKEN" in sidecar
        await session.destroy()

    run(scenario())


def test_commands_do_not_inherit_the_servers_environment(sandbox, monkeypatch):
    monkeypatch.setenv("JUPYTER_TOKEN", "server-secret")

    async def scenario():
        session = await sandbox.create(SessionSpec())
        result = await session.exec(["sh", "-c", 'echo "[$JUPYTER_TOKEN]" "$HOME"'], timeout_seconds=10)
        assert result.stdout.decode() == f"[] {session.resolve('.')}\n"
        await session.destroy()

    run(scenario())


def test_a_missing_program_is_a_request_error_naming_argv_not_an_exit_status(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        for start in (session.exec, session.exec_start):
            with pytest.raises(SandboxRequestError) as e:
                await start(["no-such-program-xyz"], timeout_seconds=10)
            assert e.value.field == "argv" and "no-such-program-xyz" in str(e.value)
        assert (await session.exec(["true"], timeout_seconds=10)).exit_code == 0
        await session.destroy()

    run(scenario())


def test_a_completed_one_shot_lets_its_group_go(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        result = await session.exec(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], timeout_seconds=10)
        pid = int(result.stdout)
        try:
            await asyncio.sleep(0.2)
            assert running(pid), "what a completed one-shot left running keeps running"
        finally:
            kill_quietly(pid)
            await session.destroy()

    run(scenario())


def test_interactive_group_is_kept_until_kill_even_after_the_exit(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(
            ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], timeout_seconds=30
        )
        items = [item async for item in handle.output]
        assert items[-1] == ExitItem(0)
        pid = int(b"".join(i.data for i in items if isinstance(i, OutputChunk)))
        try:
            assert running(pid)
            await handle.kill()
            assert await wait_stopped(pid)
        finally:
            kill_quietly(pid)
            await session.destroy()

    run(scenario())


def system_pipe_size() -> int:
    read_end, write_end = os.pipe()
    try:
        return fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize(("configured", "grown"), [(None, 1 << 20), (256 << 10, 256 << 10), (0, None)])
def test_a_commands_stdout_pipe_grows_to_the_configured_size_once_the_command_fills_it(
    tmp_path, configured, grown
):
    traits = {} if configured is None else {"stdout_pipe_bytes": configured}
    sandbox = LocalSandbox(root=str(tmp_path), **traits)
    system = system_pipe_size()
    script = (
        "import fcntl, os, sys\n"
        "before = fcntl.fcntl(1, fcntl.F_GETPIPE_SZ)\n"
        "os.write(1, bytes(8 << 20))\n"  # one write: the pipe is full each time the server reads it
        "print(before, fcntl.fcntl(1, fcntl.F_GETPIPE_SZ), fcntl.fcntl(2, fcntl.F_GETPIPE_SZ), file=sys.stderr)"
    )

    async def scenario():
        session = await sandbox.create(SessionSpec())
        result = await session.exec([sys.executable, "-c", script], timeout_seconds=30)
        assert result.exit_code == 0 and result.stdout == bytes(8 << 20)
        assert result.stderr.split() == [str(size).encode() for size in (system, grown or system, system)]
        await session.destroy()

    run(scenario())


def test_a_command_is_not_its_groups_leader_so_it_may_start_a_session(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        script = "import os; os.setsid(); print(os.getsid(0) == os.getpid())"
        result = await session.exec([sys.executable, "-c", script], timeout_seconds=10)
        assert (result.exit_code, result.stdout, result.stderr) == (0, b"True\n", b"")
        await session.destroy()

    run(scenario())


def zombie_children() -> list[int]:
    zombies = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] == "Z" and int(fields[1]) == os.getpid():
                    zombies.append(int(entry))
    return zombies


def test_every_process_a_session_started_is_reaped_by_its_destroy(sandbox):
    before = set(zombie_children())  # what other tests in this process may have left

    async def scenario():
        session = await sandbox.create(SessionSpec())
        for _ in range(5):
            assert (await session.exec(["true"], timeout_seconds=10)).exit_code == 0
        with pytest.raises(SandboxRequestError):
            await session.exec(["no-such-program"], timeout_seconds=10)
        with pytest.raises(SandboxError):
            await session.exec(["sleep", "5"], timeout_seconds=0.2)
        finished = await session.exec_start(["true"], timeout_seconds=10)
        assert [item async for item in finished.output][-1] == ExitItem(0)
        killed = await session.exec_start(["sleep", "30"], timeout_seconds=30)
        await killed.kill()
        await session.exec_start(["sleep", "30"], timeout_seconds=30)  # left to the teardown
        await session.destroy()
        for _ in range(40):
            if not set(zombie_children()) - before:
                break
            await asyncio.sleep(0.05)
        assert set(zombie_children()) - before == set()

    run(scenario())


def test_commands_run_and_stop_where_the_kernel_has_no_pidfd(sandbox, monkeypatch):
    def no_pidfd(pid, flags=0):
        raise OSError(errno.ENOSYS, "pidfd_open is not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)

    async def scenario():
        session = await sandbox.create(SessionSpec())
        result = await session.exec(["sh", "-c", "echo out; exit 3"], timeout_seconds=10)
        assert (result.exit_code, result.stdout) == (3, b"out\n")
        handle = await session.exec_start(
            ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], timeout_seconds=30
        )
        items = [item async for item in handle.output]
        assert items[-1] == ExitItem(0)
        pid = int(b"".join(i.data for i in items if isinstance(i, OutputChunk)))
        await handle.kill()
        assert await wait_stopped(pid)
        await session.destroy()

    run(scenario())


def test_teardown_stops_interactive_commands_but_not_one_shots(sandbox, tmp_path):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        handle = await session.exec_start(["sh", "-c", "echo $$; exec sleep 30"], timeout_seconds=30)
        first = await handle.output.__anext__()
        interactive_pid = int(first.data)
        one_shot = asyncio.create_task(
            session.exec(["sh", "-c", "sleep 1; echo finished"], timeout_seconds=10)
        )
        await asyncio.sleep(0.3)
        await session.destroy()
        assert await wait_stopped(interactive_pid)
        result = await one_shot
        assert (result.exit_code, result.stdout) == (0, b"finished\n")

    run(scenario())


def test_one_shot_fails_when_a_child_holds_stdin_with_input_unwritten(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        script = "exec 3<&0; sleep 30 <&3 >/dev/null 2>&1 3<&- & echo $! > holder.pid; exit 0"
        start = time.monotonic()
        with pytest.raises(SandboxError, match="still held its stdin") as raised:
            await session.exec(["sh", "-c", script], stdin=b"x" * (4 << 20), timeout_seconds=20)
        assert time.monotonic() - start < 5
        assert type(raised.value) is SandboxError
        pid = int((await session.get_file("holder.pid")).decode())
        assert await wait_stopped(pid), "a failed one-shot stops its group"
        await session.destroy()

    run(scenario())


def test_one_shot_drops_input_a_finished_command_did_not_read(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        result = await session.exec(
            ["sh", "-c", "exec 0<&-; echo closed"], stdin=b"y" * (4 << 20), timeout_seconds=10
        )
        assert (result.exit_code, result.stdout) == (0, b"closed\n")
        await session.destroy()

    run(scenario())


def test_one_shot_that_exits_as_its_input_is_fed_gives_its_status_every_time(sandbox):
    """The pipe's reader goes while the input is fed: its transport starts closing on its own, and
    closing it again once the command's exit is seen lost the status (asyncio's pipe transport
    cannot be closed twice), often within a few dozen runs."""

    async def scenario():
        session = await sandbox.create(SessionSpec())
        reported = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context))
        # the shell lets go of the pipe first, so its background job never holds it (a job forked
        # with the pipe as stdin holds it until it redirects, a race with the exit under load)
        script = "exec </dev/null; sleep 30 >/dev/null 2>&1 & echo $! > job.pid; exit 3"
        for _ in range(60):
            result = await session.exec(["sh", "-c", script], stdin=b"z" * (1 << 20), timeout_seconds=10)
            kill_quietly(int((await session.get_file("job.pid")).decode()))
            assert result.exit_code == 3
        assert reported == []
        await session.destroy()

    run(scenario())


def test_interactive_output_ends_with_an_error_when_a_child_holds_stdin(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        script = "exec 3<&0; sleep 30 <&3 >/dev/null 2>&1 3<&- & echo $!; read line; exit 0"
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=20)
        pid = int((await handle.output.__anext__()).data)
        writer = asyncio.create_task(handle.write(b"first line\n" + b"z" * (4 << 20)))
        with pytest.raises(SandboxError, match="still held its stdin"):
            async for _ in handle.output:
                pass
        with pytest.raises(SandboxError):
            await writer
        await handle.kill()
        assert await wait_stopped(pid)
        await session.destroy()

    run(scenario())


def test_unread_output_spills_to_disk_and_comes_back_whole_and_in_order(tmp_path):
    sandbox = LocalSandbox(root=str(tmp_path), output_memory_bytes=4096)

    async def scenario():
        session = await sandbox.create(SessionSpec())
        script = "i=0; while [ $i -lt 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done; head -c 1000000 /dev/zero"
        handle = await session.exec_start(["sh", "-c", script], timeout_seconds=30)
        await asyncio.sleep(1.0)
        out, err = bytearray(), bytearray()
        async for item in handle.output:
            if isinstance(item, OutputChunk):
                (out if item.stream == "stdout" else err).extend(item.data)
        assert out.startswith(b"".join(b"out%d\n" % i for i in range(200)))
        assert len(out) == sum(len(b"out%d\n" % i) for i in range(200)) + 1_000_000
        assert err == b"".join(b"err%d\n" % i for i in range(200))
        await handle.kill()
        await session.destroy()

    run(scenario())


def test_reap_removes_expired_sessions_an_earlier_process_left(tmp_path):
    earlier = LocalSandbox(root=str(tmp_path))

    async def scenario():
        ephemeral = await earlier.create(SessionSpec(ttl_seconds=0.1))
        durable = await earlier.create(
            SessionSpec(durability="persistent", workspace_key="keep", ttl_seconds=0.1)
        )
        alive = await earlier.create(SessionSpec(ttl_seconds=600))
        await asyncio.sleep(0.2)
        restarted = LocalSandbox(root=str(tmp_path))  # the earlier ledger is gone with its process
        reaped = await restarted.reap()
        assert sorted(reaped) == sorted([ephemeral.id, durable.id])
        assert not (tmp_path / ".ephemeral" / ephemeral.id).exists()
        assert (tmp_path / "keep").is_dir()
        assert (tmp_path / ".ephemeral" / alive.id).is_dir()
        await alive.destroy()

    run(scenario())


def test_bad_arguments_raise_typed_errors_and_start_nothing(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        for argv in ([], [""], ["echo", 3], ["echo", "nul\x00byte"]):
            with pytest.raises(SandboxSpecRejectedError):
                await session.exec(argv, timeout_seconds=5)
        with pytest.raises(SandboxSpecRejectedError, match="stdin"):
            await session.exec(["cat"], stdin="text, not bytes", timeout_seconds=5)
        with pytest.raises(SandboxError, match="not a folder"):
            await session.exec(["true"], timeout_seconds=5, cwd="missing-dir")
        with pytest.raises(SandboxNotFoundError):
            await sandbox.get("sbx-unknown")
        await session.destroy()

    run(scenario())
