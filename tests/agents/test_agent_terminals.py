"""SessionTerminals: ACP terminals as commands of a real session (the local provider's, and a docker one),
with jupyter-ai's TerminalManager semantics: argv from command/args (or a split string), env added and the
injection names refused, cwd inside the workspace, output kept to its byte limit (the tail, at a character
boundary), exit code or SIGKILL, a bounded count, release kills."""

from __future__ import annotations

import asyncio
import os

import pytest
from acp import RequestError
from acp.schema import EnvVariable

from jupyter_tai_sandbox.agents.terminals import SessionTerminals
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.aio import run


@pytest.fixture
def sandbox(tmp_path):
    return LocalSandbox(root=str(tmp_path))


async def _session_terminals(sandbox, **kwargs):
    session = await sandbox.create(SessionSpec())
    workspace = (await session.info()).workspace
    return session, workspace, SessionTerminals(session, cwd=workspace, timeout_seconds=60, **kwargs)


def test_a_command_runs_in_the_session_with_its_env_cwd_output_and_exit_code(sandbox):
    async def scenario():
        session, workspace, terms = await _session_terminals(sandbox)
        try:
            await session.put_file("sub/here.txt", b"x")
            created = await terms.create(
                "s1",
                "sh",
                ["-c", 'pwd; ls; echo "$GREETING"; echo oops >&2; exit 3'],
                cwd=f"{workspace}/sub",
                env=[EnvVariable(name="GREETING", value="hello")],
            )
            tid = created.terminal_id
            waited = await terms.wait_for_exit("s1", tid)
            assert (waited.exit_code, waited.signal) == (3, None)
            out = await terms.output("s1", tid)
            assert out.output == f"{workspace}/sub\nhere.txt\nhello\noops\n"
            assert out.truncated is False and out.exit_status.exit_code == 3
            # a command without args is a shell line, as agents send them: pipes, &&, redirects, variables
            line = "echo one two | tr ' ' '\\n' | tail -1 > piped.txt && cat piped.txt; echo \"$((2 + 3))\""
            tid2 = (await terms.create("s1", line)).terminal_id
            await terms.wait_for_exit("s1", tid2)
            assert (await terms.output("s1", tid2)).output == "two\n5\n"
            # the default cwd is the agent's (the workspace)
            tid3 = (await terms.create("s1", "pwd")).terminal_id
            await terms.wait_for_exit("s1", tid3)
            assert (await terms.output("s1", tid3)).output == workspace + "\n"
        finally:
            await terms.close()
            await session.destroy()

    run(scenario(), 60)


def test_output_keeps_its_tail_at_the_byte_limit_on_a_character_boundary(sandbox):
    async def scenario():
        session, _, terms = await _session_terminals(sandbox, max_output_bytes=1000)
        try:
            # 3-byte characters: a 10-byte limit cuts inside one, the kept tail starts at the next
            tid = (
                await terms.create("s", "sh", ["-c", "printf 'abc€€€€€€'"], output_byte_limit=10)
            ).terminal_id
            await terms.wait_for_exit("s", tid)
            out = await terms.output("s", tid)
            assert out.truncated is True and out.output == "€€€"
            # no limit named: the client's ceiling (here 1000 bytes), as a larger one asked for is
            tid = (
                await terms.create("s", "sh", ["-c", "yes | head -c 100000"], output_byte_limit=1 << 30)
            ).terminal_id
            await terms.wait_for_exit("s", tid)
            out = await terms.output("s", tid)
            assert out.truncated is True and len(out.output) == 1000 and out.output.endswith("y\n")
            # 0: nothing kept
            tid = (await terms.create("s", "echo", ["gone"], output_byte_limit=0)).terminal_id
            await terms.wait_for_exit("s", tid)
            assert (await terms.output("s", tid)).output == ""
        finally:
            await terms.close()
            await session.destroy()

    run(scenario(), 60)


def test_kill_reports_sigkill_and_keeps_the_terminal_and_release_kills_and_forgets(sandbox, tmp_path):
    async def scenario():
        session, workspace, terms = await _session_terminals(sandbox)
        try:
            tid = (await terms.create("s", "sh", ["-c", "echo started; exec sleep 60"])).terminal_id
            for _ in range(100):
                if (await terms.output("s", tid)).output:
                    break
                await asyncio.sleep(0.05)
            running = await terms.output("s", tid)
            assert running.output == "started\n" and running.exit_status is None
            await terms.kill("s", tid)
            out = await terms.output("s", tid)  # still there after a kill
            assert out.exit_status.signal == "SIGKILL" and out.exit_status.exit_code is None
            assert (await terms.wait_for_exit("s", tid)).signal == "SIGKILL"
            await terms.release("s", tid)
            with pytest.raises(RequestError) as gone:
                await terms.output("s", tid)
            assert gone.value.code == -32002

            # release of a running command kills it: its pid file names a process that is gone
            tid = (await terms.create("s", "sh", ["-c", "echo $$ > pid; exec sleep 60"])).terminal_id
            for _ in range(100):
                if os.path.exists(f"{workspace}/pid") and os.path.getsize(f"{workspace}/pid"):
                    break
                await asyncio.sleep(0.05)
            pid = int((await session.get_file("pid")).decode())
            await terms.release("s", tid)
            await asyncio.sleep(0.2)
            assert not _alive(pid)
            assert len(terms) == 0
        finally:
            await terms.close()
            await session.destroy()

    run(scenario(), 60)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_refusals_name_the_rule(sandbox):
    async def scenario():
        session, _, terms = await _session_terminals(sandbox, max_terminals=2)
        try:
            for command, args, cwd, env, field in [
                ("", None, None, None, "command"),
                ("ls", None, "relative/dir", None, "cwd"),
                ("ls", None, "/etc", None, "cwd"),
                ("ls", None, None, [EnvVariable(name="LD_PRELOAD", value="/x.so")], "env"),
                ("definitely-not-a-program-here", ["x"], None, None, "command"),
            ]:
                with pytest.raises(RequestError) as refused:
                    await terms.create("s", command, args, cwd, env)
                assert refused.value.code == -32602 and field in refused.value.data, (
                    command,
                    refused.value.data,
                )
            # a shell line is the shell's to judge: a missing program or a bad quote is its exit status
            for line, status in (("definitely-not-a-program-here", 127), ("echo 'unterminated", 2)):
                tid = (await terms.create("s", line)).terminal_id
                assert (await terms.wait_for_exit("s", tid)).exit_code == status, line
                await terms.release("s", tid)
            with pytest.raises(RequestError) as outside:
                await terms.create("s", "ls", cwd="/etc")
            assert "workspace" in outside.value.data["cwd"]
            # bounded count
            a = (await terms.create("s", "sleep", ["30"])).terminal_id
            await terms.create("t", "sleep", ["30"])
            with pytest.raises(RequestError) as full:
                await terms.create("s", "sleep", ["30"])
            assert "terminal limit reached (2)" in full.value.data["terminal_id"]
            # another ACP session's terminal is not this one's
            with pytest.raises(RequestError) as other:
                await terms.output("t", a)
            assert other.value.code == -32600
            # the end of a session releases its terminals only
            await terms.cleanup_session("s")
            assert [t["session_id"] for t in terms.describe()] == ["t"]
        finally:
            await terms.close()
            await session.destroy()

    run(scenario(), 60)


@pytest.mark.docker
def test_docker_terminals_run_in_the_container():
    docker_support = pytest.importorskip("tests.support.docker")
    docker_support.docker_client().close()

    async def scenario():
        sandbox = docker_support.provider()
        session = await sandbox.create(docker_support.spec("agents-terminals", ttl_seconds=300))
        workspace = (await session.info()).workspace
        terms = SessionTerminals(session, cwd=workspace, timeout_seconds=60)
        try:
            tid = (await terms.create("s", "sh", ["-c", "cat /etc/hostname; pwd; exit 5"])).terminal_id
            waited = await terms.wait_for_exit("s", tid)
            out = await terms.output("s", tid)
            hostname, cwd = out.output.split()
            assert waited.exit_code == 5 and cwd == workspace
            assert hostname != os.uname().nodename  # the container's, not the server's
            await terms.release("s", tid)
            tid = (await terms.create("s", "sleep 60")).terminal_id
            await terms.release("s", tid)  # kills it first
            assert len(terms) == 0
            ps = await session.exec(["ps", "-eo", "args"], timeout_seconds=30)
            assert b"ps -eo args" in ps.stdout and b"sleep 60" not in ps.stdout
        finally:
            await terms.close()
            await session.destroy()
            await sandbox.close()

    run(scenario(), 180)
