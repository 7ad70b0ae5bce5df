"""The session agent in real containers: commands, output, stdin, pty, stops and exit statuses."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from jupyter_tai_sandbox.agent import AgentConnectionLost, AgentError
from jupyter_tai_sandbox.agent.client import AGENT_PATH
from tests.support.agent import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]


def test_one_shot_true_exits_zero_with_no_output(session):
    async def go():
        client = await session.client()
        try:
            assert client.info["version"] == 1 and client.info["pid"] == 1
            out, err, status = await (await client.start(["true"])).collect()
            assert (out, err, status.code, status.signal) == (b"", b"", 0, None)
        finally:
            await client.close()

    run(go())


def test_agent_runs_in_an_image_holding_nothing_else(bare_session):
    async def go():
        client = await bare_session.client()
        try:
            out, _, status = await (await client.start([AGENT_PATH, "version"])).collect()
            assert status.code == 0 and out == b"tai-agent protocol 1\n"
            with pytest.raises(AgentError) as e:
                await client.start(["sh", "-c", "true"])
            assert e.value.code == "ENOENT" and e.value.op == "start"
        finally:
            await client.close()

    run(go())


def test_absent_program_is_a_typed_error_not_an_exit_code(session):
    async def go():
        client = await session.client()
        try:
            for argv, kw in (
                (["no-such-program"], {}),
                (["/bin/no-such-program"], {}),
                (["true"], {"cwd": "/no/such/dir"}),
            ):
                with pytest.raises(AgentError) as e:
                    await client.start(argv, **kw)
                assert e.value.code == "ENOENT", (argv, e.value)
            assert all(c["argv"] != ["no-such-program"] for c in await client.list())
            assert (await (await client.start(["true"])).wait()).code == 0  # the connection still works
        finally:
            await client.close()

    run(go())


def test_stdout_of_64_mib_arrives_exactly(session):
    session.exec("sh", "-c", "head -c 67108864 /dev/urandom > /data/blob")
    expected = session.exec("sha256sum", "/data/blob").split()[0]

    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["cat", "/data/blob"])
            digest, size = hashlib.sha256(), 0
            async for stream, data in cmd.output():
                assert stream == "stdout"
                digest.update(data)
                size += len(data)
            assert (await cmd.wait()).code == 0
            assert size == 64 << 20 and digest.hexdigest() == expected
        finally:
            await client.close()

    run(go())


def test_stdin_echo_is_exact(session):
    payload = hashlib.sha256(b"seed").digest() * ((8 << 20) // 32)

    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["cat"])

            async def feed():
                await cmd.write(payload)
                await cmd.close_stdin()

            _, (out, err, status) = await asyncio.gather(feed(), cmd.collect())
            assert status.code == 0 and err == b"" and out == payload
        finally:
            await client.close()

    run(go())


def test_32_concurrent_commands_complete_while_one_is_never_read(session):
    async def go():
        client = await session.client()
        try:
            unread = await client.start(["yes", "never read"])
            cmds = [await client.start(["head", "-c", str(2 << 20), "/dev/zero"]) for _ in range(31)]
            t0 = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*(c.collect() for c in cmds)), 60)
            elapsed = time.monotonic() - t0
            assert all(out == bytes(2 << 20) and status.code == 0 for out, _, status in results)
            listed = {c["id"]: c for c in await client.list()}
            assert listed[unread.id]["running"], "the unread command is held by its own flow control"
            assert listed[unread.id]["output"]["stdout"][1] <= 2 * (1 << 20) + client.window
            await unread.kill()
            assert (await unread.wait()).signal == signal.SIGKILL
            assert elapsed < 30
        finally:
            await client.close()

    run(go())


def test_pty_has_a_terminal_of_the_asked_size_and_resizes(session):
    async def go():
        client = await session.client()
        try:
            cmd = await client.start(
                ["sh", "-c", "[ -t 0 ] && echo tty; stty size; read x; stty size"],
                pty=True,
                rows=30,
                cols=100,
            )
            seen = b""
            while b"30 100" not in seen:
                _, data = await cmd.read()
                seen += data
            assert b"tty" in seen
            await cmd.resize(40, 120)
            await cmd.write(b"\n")
            out, err, status = await cmd.collect()
            assert b"40 120" in seen + out and err == b"" and status.code == 0
        finally:
            await client.close()

    run(go())


def test_exit_codes_and_signals_are_exact(session):
    async def go():
        client = await session.client()
        try:
            assert (await (await client.start(["sh", "-c", "exit 7"])).wait()).code == 7
            segv = await (await client.start(["sh", "-c", "kill -SEGV $$"])).wait()
            assert (segv.code, segv.signal, segv.returncode) == (None, signal.SIGSEGV, 139)
            sleeper = await client.start(["sleep", "100"])
            assert await sleeper.signal(signal.SIGTERM, group=False)
            term = await sleeper.wait()
            assert (term.signal, term.returncode, term.killed) == (signal.SIGTERM, 143, False)
            timed = await client.start(["sleep", "100"], timeout_seconds=0.3)
            status = await timed.wait()
            assert status.signal == signal.SIGKILL and status.timed_out
        finally:
            await client.close()

    run(go())


def _processes(session) -> list[tuple[str, str]]:
    """(comm, state) of every process in the container."""
    out = session.exec("sh", "-c", "for s in /proc/[0-9]*/stat; do cat $s 2>/dev/null; echo; done")
    procs = []
    for line in out.splitlines():
        if ")" in line:
            comm = line[line.index("(") + 1 : line.rindex(")")]
            procs.append((comm, line[line.rindex(")") + 2]))
    return procs


def test_kill_stops_a_group_that_forks_and_pid1_reaps_it(session):
    async def go():
        client = await session.client()
        try:
            cmd = await client.start(
                ["sh", "-c", "sleep 1001 & sleep 1002 & (sleep 1003 &) ; echo ready; wait"]
            )
            _, data = await cmd.read()
            assert data == b"ready\n"
            assert sum(comm == "sleep" for comm, _ in _processes(session)) == 3
            reply = await cmd.kill()
            assert reply["exited"]
            status = await cmd.wait()
            assert status.signal == signal.SIGKILL and status.killed
            assert await cmd.read() is None
            await asyncio.sleep(0.2)
            assert [p for p in _processes(session) if p[0] == "sleep"] == []
            assert [p for p in _processes(session) if p[1] == "Z"] == []
            await cmd.kill()  # again, after the exit: idempotent
            assert (await cmd.wait()).signal == signal.SIGKILL
        finally:
            await client.close()

    run(go())


def test_a_command_does_not_lead_its_group_so_setsid_runs_it_in_place_and_kill_stops_it(session):
    """A holder leads each command's group (agent/PROTOCOL.md "Process group"): the command's pgid is not its
    pid, ``setsid`` moves the command's own process instead of forking a copy outside the group, kill still
    stops it, and once it is let go no holder is left behind as a zombie."""

    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["sh", "-c", "read -r _ _ _ _ pgid _ </proc/self/stat; echo $$ $pgid"])
            _, data = await cmd.read()
            pid, pgid = data.split()
            assert pid != pgid
            assert (await cmd.wait()).code == 0
            cmd = await client.start(["setsid", "sh", "-c", "echo $$; exec sleep 1004"])
            _, data = await cmd.read()
            assert int(data) == cmd.pid  # in place: the command's own process left the group
            await cmd.kill()
            assert (await cmd.wait()).signal == signal.SIGKILL
            await asyncio.sleep(0.2)
            assert [p for p in _processes(session) if p[0] == "sleep"] == []
            assert [p for p in _processes(session) if p[1] == "Z"] == []
        finally:
            await client.close()

    run(go())


def test_the_group_holder_is_a_sealed_exit_program_nobody_can_rewrite(session):
    """The holder leading each command's group (agent/holder_linux.go) is a tiny program in a sealed memfd,
    not the agent binary: the group's leader is that program's zombie, and even root on the host cannot
    write into the memfd the agent (root) execs it from."""

    async def go():
        client = await session.client()
        try:
            cmd = await client.start(
                ["sh", "-c", "read -r _ _ _ _ pgid _ </proc/self/stat; cat /proc/$pgid/comm"]
            )
            _, data = await cmd.read()
            assert (await cmd.wait()).code == 0
        finally:
            await client.close()
        agent_pid = session.api.api.inspect_container(session.container.id)["State"]["Pid"]
        fds = Path(f"/proc/{agent_pid}/fd")
        (memfd,) = [fd for fd in fds.iterdir() if os.readlink(fd).startswith("/memfd:tai-hold")]
        assert data.strip() == memfd.name.encode()  # exec'd as /proc/self/fd/N: its comm is N
        program = memfd.read_bytes()
        assert program[:4] == b"\x7fELF" and len(program) < 256
        with pytest.raises(PermissionError), open(memfd, "r+b") as f:
            f.write(b"\0" * 4)
            f.flush()
        assert memfd.read_bytes() == program

    run(go())


def test_a_pty_command_is_its_terminal_leaders_child_so_setsid_runs_it_in_place_and_kill_stops_it(session):
    """With pty, ``tai-agent pty`` leads the terminal's session and the command is its child (PROTOCOL.md
    "Process group"): STARTED names the command's own pid, setsid moves that process in place, the kill
    still stops it, a signal to the command reaches the command, and its exit status is the command's."""

    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["setsid", "sh", "-c", "echo $$; exec sleep 1005"], pty=True)
            _, data = await cmd.read()
            assert int(data) == cmd.pid
            await cmd.kill()
            assert (await cmd.wait()).signal == signal.SIGKILL
            await asyncio.sleep(0.2)
            assert [p for p in _processes(session) if p[0] == "sleep"] == []
            cmd = await client.start(
                ["sh", "-c", "trap 'exit 7' USR1; echo up; while :; do sleep 0.05; done"], pty=True
            )
            assert (await cmd.read())[1].startswith(b"up")
            assert await cmd.signal(signal.SIGUSR1, group=False)
            assert (await cmd.wait()).code == 7
            cmd = await client.start(["sh", "-c", "kill -TERM $$"], pty=True)
            assert (await cmd.wait()).signal == signal.SIGTERM
            await client.write_file("/data", "garbage", b"\x00\x01 not a program", mode=0o755)
            with pytest.raises(AgentError) as e:  # the leader's exec of it fails: reported, a typed error
                await client.start(["/data/garbage"], pty=True)
            assert e.value.code == "ENOEXEC"
        finally:
            await client.close()

    run(go())


def test_orphans_are_reaped_by_the_agent(session):
    async def go():
        client = await session.client()
        try:
            for _ in range(5):
                assert (await (await client.start(["sh", "-c", "sleep 0.05 & exit 0"])).wait()).code == 0
            await asyncio.sleep(0.5)
            assert [p for p in _processes(session) if p[1] == "Z"] == []
        finally:
            await client.close()

    run(go())


def test_commands_survive_the_connection_and_resume_from_an_offset(session):
    lines = 200_000
    expected = b"".join(b"%d\n" % i for i in range(lines))

    async def go():
        first = await session.client()
        cmd = await first.start(["seq", "0", str(lines - 1)])
        received = b""
        while len(received) < 100_000:
            _, data = await cmd.read()
            received += data
        cmd_id = cmd.id
        first.process.kill()  # the server dies: its exec stream with it
        await first.process.wait()
        await first.close()
        await asyncio.sleep(0.3)
        second = await session.client()
        try:
            listed = {c["id"]: c for c in await second.list()}
            assert cmd_id in listed
            resumed = await second.attach(cmd_id, stdout=len(received))
            out, err, status = await resumed.collect()
            assert resumed.lost == []
            assert status.code == 0 and err == b""
            assert received + out == expected, "nothing skipped or repeated"
            await resumed.release()
            assert cmd_id not in {c["id"] for c in await second.list()}
        finally:
            await second.close()

    run(go())


def test_a_commands_label_and_deadline_are_listed_back_and_an_oversized_label_is_refused(session):
    async def go():
        client = await session.client()
        try:
            label = '{"exec": "exe-1", "note": "' + "é" * 100 + '"}'
            cmd = await client.start(["sleep", "30"], timeout_seconds=20, label=label)
            plain = await client.start(["true"])
            listed = {c["id"]: c for c in await client.list()}
            assert listed[cmd.id]["label"] == label
            assert abs(listed[cmd.id]["deadline"] - (listed[cmd.id]["started"] + 20)) < 0.01
            assert "label" not in listed[plain.id] and "deadline" not in listed[plain.id]
            with pytest.raises(AgentError) as refused:
                await client.start(["true"], label="x" * 4097)
            assert refused.value.code == "EINVAL"
            await cmd.kill()
        finally:
            await client.close()

    run(go())


def test_a_resume_older_than_the_ring_says_exactly_what_was_lost(session):
    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["head", "-c", str(4 << 20), "/dev/zero"])
            assert len((await cmd.collect())[0]) == 4 << 20
            other = await session.client()
            try:
                again = await other.attach(cmd.id, stdout=0)
                out, _, status = await again.collect()
                (lost,) = again.lost
                assert lost["stream"] == "stdout" and lost["from"] == 0
                assert lost["to"] + len(out) == 4 << 20 and status.code == 0
            finally:
                await other.close()
        finally:
            await client.close()

    run(go())


def test_engine_stop_ends_the_agent_promptly(session):
    async def go():
        client = await session.client()
        await client.start(["sleep", "1000"])
        await client.close()

    run(go())
    t0 = time.monotonic()
    session.container.stop(timeout=10)
    assert time.monotonic() - t0 < 5
    session.container.reload()
    assert session.container.attrs["State"]["ExitCode"] == 0


def test_the_engine_api_exec_socket_carries_the_channel(session):
    """The channel over the engine's own hijacked exec socket (Docker's 8-byte frames demultiplexed)."""
    from jupyter_tai_sandbox.agent.transport import open_docker_api

    payload = bytes(range(256)) * ((4 << 20) // 256)

    async def go():
        client = await open_docker_api(session.api.api, session.name)
        try:
            assert (await (await client.start(["true"])).wait()).code == 0
            cmd = await client.start(["cat"])

            async def feed():
                await cmd.write(payload)
                await cmd.close_stdin()

            _, (out, _, status) = await asyncio.gather(feed(), cmd.collect())
            assert out == payload and status.code == 0
        finally:
            await client.close()

    run(go())


def test_the_engine_api_channel_ending_fails_every_waiting_call_promptly(session):
    """The push-mode client (bytes from the socket's protocol straight to the decoder) sees the stream end."""
    from jupyter_tai_sandbox.agent.transport import open_docker_api

    async def go():
        client = await open_docker_api(session.api.api, session.name)
        try:
            cmd = await client.start(["sleep", "100"])
            t0 = time.monotonic()
            await asyncio.to_thread(session.container.kill)
            with pytest.raises(AgentConnectionLost):
                await asyncio.wait_for(cmd.wait(), 20)
            with pytest.raises(AgentConnectionLost):
                await client.ping()
            assert time.monotonic() - t0 < 20
        finally:
            await client.close()

    run(go())


def test_a_write_after_the_exit_raises_and_the_exit_stays_the_commands_own(session):
    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["sh", "-c", "exit 4"])
            with contextlib.suppress(AgentError):
                await cmd.write(b"racing the exit\n")  # accepted and dropped, or refused: either is right
            status = await cmd.wait()
            with pytest.raises(AgentError) as e:
                await cmd.write(b"late")
            assert e.value.code == "EPIPE"
            assert (await cmd.wait()) == status and status.code == 4
            # a credit grant racing a release leaves every other call alone
            big = await client.start(["head", "-c", str(3 << 20), "/dev/zero"])
            assert len((await big.collect())[0]) == 3 << 20
            await big.release()
            await cmd.release()
            assert {c["id"] for c in await client.list()} & {cmd.id, big.id} == set()
            await client.ping()
        finally:
            await client.close()

    run(go())


def test_commands_and_folders_get_a_containers_usual_umask(session):
    async def go():
        client = await session.client()
        try:
            out, _, status = await (
                await client.start(["sh", "-c", "umask; touch /data/made; ls -ln /data/made"])
            ).collect()
            assert (
                status.code == 0
                and out.splitlines()[0] == b"0022"
                and out.splitlines()[1].startswith(b"-rw-r--r--")
            )
            await client.mkdir("/data", "folder")
            assert (await client.stat("/data", "folder"))["mode"] & 0o777 == 0o755
        finally:
            await client.close()

    run(go())


def test_commands_are_the_oom_killers_first_choice_and_the_agent_is_not(session):
    """A memory-capped session out of memory loses a command, never its agent or a relay (oom_score_adj)."""

    async def go():
        client = await session.client()
        try:
            # the agent sets it on the command's own process right after the fork, before its STARTED answer:
            # read that process's value a moment later (a child forked at once could be made before the write)
            script = "sleep 0.3; cat /proc/$$/oom_score_adj /proc/1/oom_score_adj"
            out, _, status = await (await client.start(["sh", "-c", script])).collect()
            assert status.code == 0 and out.split() == [b"500", b"0"], out
            out, _, _ = await (
                await client.start(["sh", "-c", "cat /proc/self/oom_score_adj"], pty=True)
            ).collect()
            assert out.split() == [b"500"], out  # through the terminal leader too
        finally:
            await client.close()

    run(go())
