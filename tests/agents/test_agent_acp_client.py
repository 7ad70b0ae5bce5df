"""SandboxAcpClient over AgentProcess with the tests' ACP agent (tests/support/acp_test_agent.py) running as a
command of a real session: the ACP round trip, fs calls in the session's workspace (outside it refused),
terminals in the session, MCP servers only the operator's, attachments under the workspace, cancel, and an
agent that dies. Mostly the local provider (its commands are real processes); one round trip in docker
(the acp package and pydantic copied into the session)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import acp
import pytest
from acp import text_block
from acp.schema import AgentMessageChunk, TextContentBlock

from jupyter_tai_sandbox.agents.acp_client import SandboxAcpClient
from jupyter_tai_sandbox.agents.transport import AgentProcess
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support import acp_test_agent
from tests.support.aio import run

AGENT = Path(acp_test_agent.__file__)


class RecordingClient(SandboxAcpClient):
    """The client under test, with the agent's messages recorded (the chat they would go to is the
    persona's, which these tests do not run)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.text: dict[str, str] = {}

    async def session_update(self, session_id, update, **kwargs):
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.text[session_id] = self.text.get(session_id, "") + update.content.text

    def steps(self, session_id: str) -> list[dict]:
        return [
            json.loads(line) for line in self.text.pop(session_id, "").splitlines() if line.startswith("{")
        ]


class _Persona:
    """What jupyter-ai's client asks of the persona it serves in these tests: a logger and a status."""

    log = logging.getLogger("tests.agents.persona")

    def set_status(self, *args, **kwargs) -> None:
        pass

    def clear_status(self) -> None:
        pass


@pytest.fixture
def sandbox(tmp_path):
    return LocalSandbox(root=str(tmp_path / "sandbox"))


async def start_agent(session, workspace: str, script: dict, *, argv=None, env=None, **client_kwargs):
    """The test agent as a command of ``session``, connected: (client, process, ACP session id)."""
    argv = argv or [sys.executable, str(AGENT)]
    handle = await session.exec_start(
        argv,
        timeout_seconds=300,
        cwd=workspace,
        env={"ACP_TEST_AGENT_SCRIPT": json.dumps(script), **(env or {})},
    )
    proc = AgentProcess(handle)
    client = RecordingClient(
        agent_subprocess=proc,
        event_loop=asyncio.get_running_loop(),
        session=session,
        workspace=workspace,
        timeout_seconds=60,
        **client_kwargs,
    )
    acp_session = await asyncio.wait_for(client.create_session(_Persona()), 60)
    return client, proc, acp_session.session_id


async def prompt(client: RecordingClient, session_id: str, text: str = "go") -> tuple[str, list[dict]]:
    conn = await client.get_connection()
    response = await asyncio.wait_for(conn.prompt(session_id=session_id, prompt=[text_block(text)]), 60)
    return response.stop_reason, client.steps(session_id)


async def stop(proc: AgentProcess) -> None:
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        await proc.kill()


def test_round_trip_initialize_new_session_prompt_in_the_workspace_with_no_mcp_servers(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            script = {"turns": [[{"do": "info"}, {"do": "echo"}, {"do": "reply", "text": "done"}]]}
            client, proc, sid = await start_agent(session, workspace, script)
            _, init = await client._connection_future
            assert init.agent_info.name == "acp-test-agent" and init.agent_capabilities.load_session
            stop_reason, steps = await prompt(client, sid, "hello agent")
            assert stop_reason == "end_turn"
            info, echo = steps
            # the agent's cwd is the workspace; no MCP server unless the operator lists one; the client
            # offers files and terminals
            assert info == {"step": "info", "cwd": workspace, "mcp_servers": [], "fs": True, "terminal": True}
            assert echo["text"] == "hello agent"
            assert client.text == {}  # "done" was the last chunk and not JSON: steps() consumed it
            # session/load of the same id works too (a server restart's path)
            await client.load_session(_Persona(), sid)
            stop_reason, steps = await prompt(client, sid)
            assert stop_reason == "end_turn" and steps[0]["cwd"] == workspace
            await stop(proc)
            assert proc.returncode == 0
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_fs_calls_read_and_write_the_session_workspace_and_refuse_everything_outside(sandbox, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("server secret\n")

    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        await session.put_file("notes.txt", b"one\r\ntwo\nthree\nfour\n")
        try:
            steps = [
                {"do": "write", "path": f"{workspace}/deep/new.txt", "content": "written by the agent\n"},
                {"do": "write", "path": f"{workspace}/nb.ipynb", "content": '{"cells": []}'},
                {"do": "read", "path": f"{workspace}/notes.txt"},
                {"do": "read", "path": f"{workspace}/notes.txt", "line": 2, "limit": 2},
                {"do": "read", "path": "notes.txt", "line": 4},  # relative: under the workspace
                {"do": "read", "path": str(outside)},
                {"do": "read", "path": f"{workspace}/../../outside.txt"},
                {"do": "write", "path": str(tmp_path / "planted.txt"), "content": "no"},
                {"do": "write", "path": "../planted.txt", "content": "no"},
                {"do": "read", "path": f"{workspace}/missing.txt"},
                {"do": "read", "path": f"{workspace}/deep"},
                {"do": "read", "path": f"{workspace}/notes.txt", "line": 0},
            ]
            client, proc, sid = await start_agent(session, workspace, {"turns": [steps]})
            _, got = await prompt(client, sid)
            assert got[0] == {"step": "write", "ok": True} and got[1] == {"step": "write", "ok": True}
            assert await session.get_file("deep/new.txt") == b"written by the agent\n"
            assert await session.get_file("nb.ipynb") == b'{"cells": []}'
            assert got[2]["content"] == "one\ntwo\nthree\nfour\n"  # universal newlines, as jupyter-ai's
            assert got[3]["content"] == "two\nthree\n"
            assert got[4]["content"] == "four\n"
            for refused in got[5:9]:
                assert refused["error"]["code"] == -32602, refused
                assert (
                    "refused: the agent's files are its session's workspace"
                    in refused["error"]["data"]["path"]
                )
            assert got[9]["error"]["code"] == -32002  # not found
            assert got[10]["error"]["code"] in (-32602, -32603)  # a folder is not a text file
            assert got[11]["error"]["data"] == {"line": "line must be >= 1 (1-indexed)"}
            assert "content" not in json.dumps(got[5:9])
            assert (
                not (tmp_path / "planted.txt").exists()
                and not (tmp_path / "sandbox" / "planted.txt").exists()
            )
            assert outside.read_text() == "server secret\n"
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_terminals_through_acp_run_in_the_session_truncate_kill_and_end_with_the_acp_session(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            steps = [
                {
                    "do": "terminal",
                    "command": "sh",
                    "args": ["-c", "pwd; echo $ANSWER; exit 2"],
                    "env": {"ANSWER": "42"},
                },
                {"do": "terminal", "command": "sh -c 'yes | head -c 50000'", "output_byte_limit": 100},
                {"do": "terminal", "command": "sleep", "args": ["60"], "kill_after": 0.3},
                {"do": "terminal", "command": "ls", "env": {"NODE_OPTIONS": "--require=/x.js"}},
                {
                    "do": "terminal",
                    "command": "sh",
                    "args": ["-c", "echo $$ > held.pid; exec sleep 60"],
                    "kill_after": 0.5,
                    "release": False,
                },
            ]
            client, proc, sid = await start_agent(session, workspace, {"turns": [steps]})
            _, got = await prompt(client, sid)
            plain, truncated, killed, refused, kept = got
            assert (plain["output"], plain["exit_code"], plain["signal"]) == (f"{workspace}\n42\n", 2, None)
            assert truncated["truncated"] is True and truncated["output"] == "y\n" * 50
            assert (killed["exit_code"], killed["signal"]) == (None, "SIGKILL")
            assert refused["error"]["data"] == {"env": "setting 'NODE_OPTIONS' is not allowed"}
            assert len(client.terminals) == 1 and kept["signal"] == "SIGKILL"
            # the one left unreleased goes with the ACP session's end
            await client.end_session(sid)
            assert len(client.terminals) == 0
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_end_session_and_close_kill_running_terminals(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            client, proc, sid = await start_agent(session, workspace, {"turns": [[{"do": "echo"}]]})
            created = await client.create_terminal(
                command="sh", session_id=sid, args=["-c", "echo $$ > t.pid; exec sleep 60"]
            )
            for _ in range(100):
                if os.path.exists(f"{workspace}/t.pid") and os.path.getsize(f"{workspace}/t.pid"):
                    break
                await asyncio.sleep(0.05)
            pid = int(Path(workspace, "t.pid").read_text())
            assert Path(f"/proc/{pid}").exists()
            await client.end_session(sid)
            await asyncio.sleep(0.2)
            assert (
                not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            )
            with pytest.raises(acp.RequestError):
                await client.terminal_output(session_id=sid, terminal_id=created.terminal_id)
            # close() ends them all, whichever ACP session made them
            for owner in ("a", "b"):
                await client.create_terminal(command="sleep", session_id=owner, args=["60"])
            assert len(client.terminals) == 2
            await client.close()
            assert len(client.terminals) == 0
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_mcp_servers_are_only_the_operators(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            servers = [
                {"name": "files", "command": "mcp-files", "args": ["--root", workspace], "env": {"A": "1"}},
                {"name": "web", "url": "http://127.0.0.1:9/mcp", "headers": {"X": "y"}},
            ]
            client, proc, sid = await start_agent(
                session, workspace, {"turns": [[{"do": "info"}]]}, mcp_servers=servers
            )
            _, got = await prompt(client, sid)
            # the test agent does not say it supports http MCP servers: only the stdio one is offered
            assert got[0]["mcp_servers"] == ["files"]
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_attachments_are_files_of_the_workspace(sandbox):
    from jupyterlab_chat.models import FileAttachment

    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            client, proc, sid = await start_agent(session, workspace, {"turns": [[{"do": "echo"}]]})
            attachments = [FileAttachment(value="projects/a b.py"), FileAttachment(value="../../etc/passwd")]
            response = await asyncio.wait_for(
                client.prompt_and_reply(sid, "look", attachments, root_dir="/server/root"), 60
            )
            assert response.stop_reason == "end_turn"
            (echo,) = client.steps(sid)
            assert echo["resources"][0] == {
                "uri": f"file://{workspace}/projects/a%20b.py",
                "name": "a%20b.py",
            }
            assert echo["resources"][1]["uri"] == "../../etc/passwd"  # passed as given: reading it is refused
            assert "/server/root" not in json.dumps(echo)
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_cancel_ends_a_long_prompt_with_stop_reason_cancelled(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            script = {
                "turns": [
                    [{"do": "sleep", "seconds": 60}, {"do": "reply", "text": "never"}],
                    [{"do": "echo"}],
                ]
            }
            client, proc, sid = await start_agent(session, workspace, script)
            conn = await client.get_connection()
            prompting = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("long")]))
            await asyncio.sleep(0.5)
            assert not prompting.done()
            await conn.cancel(session_id=sid)
            response = await asyncio.wait_for(prompting, 10)
            assert response.stop_reason == "cancelled" and "never" not in client.text.get(sid, "")
            stop_reason, steps = await prompt(client, sid, "again")  # the agent serves on
            assert stop_reason == "end_turn" and steps[0]["text"] == "again"
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


def test_an_agent_that_dies_mid_prompt_fails_the_prompt_with_its_status_and_stderr(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        try:
            script = {"turns": [[{"do": "stderr", "text": "about to crash\n"}, {"do": "exit", "code": 9}]]}
            client, proc, sid = await start_agent(session, workspace, script)
            conn = await client.get_connection()
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("die")]), 30)
            assert await asyncio.wait_for(proc.wait(), 10) == 9
            assert "about to crash" in proc.stderr_tail()
            with pytest.raises(ConnectionError):  # the connection says so from then on
                await conn.prompt(session_id=sid, prompt=[text_block("again")])
        finally:
            await session.destroy()

    run(scenario(), 120)


class AnsweringClient(RecordingClient):
    """jupyter-ai's permission prompt goes to the chat (the persona's, covered by the persona tests); here
    the answers are given in order, so the test agent's permission step is pinned on its own."""

    answers: list[str | None] = []

    async def request_permission(self, options, session_id, tool_call, **kwargs):
        from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

        self.asked = [*getattr(self, "asked", []), (tool_call.title, [o.option_id for o in options])]
        answer = self.answers.pop(0)
        if answer is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=answer, outcome="selected"))


def test_the_test_agents_permission_step_acts_on_the_answer(sandbox):
    async def scenario():
        session = await sandbox.create(SessionSpec())
        workspace = (await session.info()).workspace
        step = {
            "do": "permission",
            "title": "write approved.txt",
            "on_allow": [{"do": "write", "path": f"{workspace}/approved.txt", "content": "yes"}],
            "on_reject": [{"do": "reply", "text": '{"step": "rejected"}\n'}],
        }
        try:
            handle = await session.exec_start(
                [sys.executable, str(AGENT)],
                timeout_seconds=300,
                env={"ACP_TEST_AGENT_SCRIPT": json.dumps({"turns": [[step]]})},
            )
            proc = AgentProcess(handle)
            client = AnsweringClient(
                agent_subprocess=proc,
                event_loop=asyncio.get_running_loop(),
                session=session,
                workspace=workspace,
                timeout_seconds=60,
            )
            client.answers = ["reject", "allow", None]
            sid = (await client.create_session(_Persona())).session_id
            _, rejected = await prompt(client, sid)
            assert rejected == [
                {"step": "permission", "outcome": "selected", "option_id": "reject"},
                {"step": "rejected"},
            ]
            _, allowed = await prompt(client, sid)
            assert allowed == [
                {"step": "permission", "outcome": "selected", "option_id": "allow"},
                {"step": "write", "ok": True},
            ]
            assert await session.get_file("approved.txt") == b"yes"
            _, cancelled = await prompt(client, sid)
            assert cancelled[0] == {"step": "permission", "outcome": "cancelled", "option_id": None}
            assert client.asked[0] == ("write approved.txt", ["allow", "reject"])
            await stop(proc)
        finally:
            await session.destroy()

    run(scenario(), 120)


# ------------------------------------------------------------------ docker


@pytest.mark.docker
def test_docker_the_acp_round_trip_files_and_terminals_stay_in_the_container():
    docker_support = pytest.importorskip("tests.support.docker")
    from jupyter_tai_sandbox.images import PYTHON_IMAGE

    docker_support.python_image().close()

    async def scenario():
        sandbox = docker_support.provider()
        session = await sandbox.create(docker_support.spec("agents-acp", image=PYTHON_IMAGE, ttl_seconds=600))
        workspace = (await session.info()).workspace
        try:
            await session.put_file(".agentlib/libs.tar", acp_test_agent.bundle())
            unpacked = await session.exec(
                [
                    "python3",
                    "-c",
                    "import tarfile; tarfile.open('.agentlib/libs.tar').extractall('.agentlib')",
                ],
                timeout_seconds=60,
                cwd=workspace,
            )
            assert unpacked.exit_code == 0, unpacked.stderr
            steps = [
                {"do": "info"},
                {"do": "write", "path": f"{workspace}/out/result.txt", "content": "from the container\n"},
                {"do": "read", "path": f"{workspace}/out/result.txt"},
                {"do": "read", "path": "/etc/hostname"},
                {"do": "terminal", "command": "sh", "args": ["-c", "cat /etc/hostname; cat out/result.txt"]},
            ]
            client, proc, sid = await start_agent(
                session,
                workspace,
                {"turns": [steps]},
                argv=["python3", f"{workspace}/.agentlib/acp_test_agent.py"],
                env={"PYTHONPATH": f"{workspace}/.agentlib"},
            )
            _, got = await prompt(client, sid)
            info, wrote, read, refused, terminal = got
            assert info["cwd"] == workspace and wrote == {"step": "write", "ok": True}
            assert read["content"] == "from the container\n"
            assert await session.get_file("out/result.txt") == b"from the container\n"
            assert refused["error"]["code"] == -32602
            hostname, text = terminal["output"].split("\n", 1)
            assert text == "from the container\n" and terminal["exit_code"] == 0
            assert hostname and hostname != os.uname().nodename
            await stop(proc)
        finally:
            await session.destroy()
            await sandbox.close()

    run(scenario(), 300)
