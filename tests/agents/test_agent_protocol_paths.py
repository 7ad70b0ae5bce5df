"""The ACP paths the real agent does not walk (issue 53's test list), at the persona level: a real jupyter_server
with jupyterlab_chat, jupyter-ai's router, persona manager and ACP client, and this extension; a chat client
over the chat websocket writes to the sandboxed persona, whose agent is the tests' scripted ACP agent
(tests/support/acp_test_agent.py) in the user's docker session (the agents image: python3 and ``acp``).

Pinned, each with the agent's own report lines in the chat:

- terminals: the agent's terminal command runs in the session (a marker file it writes is in the session's
  workspace, and nowhere on the host; the command sees the session's host name, not the server's);
- permission: the request reaches the chat as a pending tool call with its options, the way jupyter-ai's
  frontend renders it; resolved through jupyter-ai's own route (``POST /ai/acp/permissions``, what the
  frontend's buttons call), an approved action runs in the session and a rejected one does not;
- cancellation: jupyter-ai's cancel route (``POST /api/ai/personas/cancel``, the stop button) ends the agent's
  turn with stop reason ``cancelled`` at once, the rest of the turn never comes, and the agent (same session)
  answers the next message;
- an agent that dies: killed inside its session in the middle of a turn, or exiting on its own (with its
  stderr), the chat says so and the session is destroyed.

The chat client and the persona's settings are test_agent_persona.py's (helper P's); each test's server has the
one persona with the test's own script.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.agents.test_agent_persona import (
    KEY,
    PERSONA_ID,
    REAL_KEY,
    ChatClient,
    agent_lines,
    agent_pids,
    agent_sessions,
    agent_sessions_destroyed,
    chat_server_config,
    docker_needed,
    multi_user,
    persona,
)
from tests.support.docker import client, nothing_left
from tests.support.server import call, exec_call
from tests.support.users import as_user

__all__ = ["client", "nothing_left"]

USER = "alice"
#: a marker only this module's agent writes (a file name nothing else on the host has)
MARKER = "tai-acp-terminal-marker-7f3c9a"

TERMINAL_SCRIPT = {
    "turns": [
        [
            {
                "do": "terminal",
                "command": "sh",
                "args": ["-c", f"echo from-the-session > {MARKER}; pwd; uname -n"],
            }
        ]
    ]
}
PERMISSION_SCRIPT = {
    "turns": [
        [
            {
                "do": "permission",
                "title": "write approved.txt",
                "on_allow": [{"do": "terminal", "command": "sh", "args": ["-c", "echo yes > approved.txt"]}],
                "on_reject": [{"do": "reply", "text": "left alone\n"}],
            }
        ],
        [
            {
                "do": "permission",
                "title": "write rejected.txt",
                "on_allow": [{"do": "terminal", "command": "sh", "args": ["-c", "echo yes > rejected.txt"]}],
                "on_reject": [{"do": "reply", "text": "left alone\n"}],
            }
        ],
    ]
}
CANCEL_SCRIPT = {
    "turns": [
        [{"do": "echo"}],
        [
            {"do": "reply", "text": "working on it\n"},
            {"do": "sleep", "seconds": 90},
            {"do": "reply", "text": "the rest of the turn\n"},
        ],
        [{"do": "echo"}],
    ]
}
#: the first turn sleeps (the test kills the agent meanwhile); a later one (a new agent) echoes
KILL_SCRIPT = {"turns": [[{"do": "reply", "text": "working on it\n"}, {"do": "sleep", "seconds": 90}]]}
EXIT_SCRIPT = {
    "turns": [[{"do": "stderr", "text": "boom: the agent's last words\n"}, {"do": "exit", "code": 3}]]
}


@pytest.fixture
def jp_server_config(request, tmp_path, monkeypatch):
    """One persona (helper P's test persona) with the test's script, its agent in a docker session."""
    monkeypatch.setenv("TAI_TEST_MODEL_KEY", REAL_KEY)
    docker_needed()
    config = chat_server_config(
        "docker",
        tmp_path / "sandboxes",
        {KEY: persona("chat", env={"ACP_TEST_AGENT_SCRIPT": json.dumps(request.param)})},
        ServerApp=multi_user(),
        SandboxApp={"live_command_grace_seconds": 0},
    )
    # jupyter-ai's ACP client extension: the permission route its frontend calls
    config["ServerApp"]["jpserver_extensions"]["jupyter_ai_acp_client"] = True
    return config


class Chat(ChatClient):
    """P's chat client, keeping the chat's id (the cancel route names the chat by it)."""

    def __init__(self, ws: Any, first: dict[str, Any]) -> None:
        super().__init__(ws, first)
        self.chat_id: str = first["id"]


async def open_chat(jp_ws_fetch: Any, path: str = "a.chat") -> Chat:
    chat = await Chat.open(jp_ws_fetch, path, USER)
    assert isinstance(chat, Chat)
    return chat


def persona_of(serverapp: Any, chat: Chat) -> Any:
    managers = serverapp.web_app.settings["jupyter-ai"]["persona-managers"]
    return managers[chat.chat_id].personas[PERSONA_ID]


def steps_after(chat: Chat, mark: int) -> dict[str, dict[str, Any]]:
    return agent_lines(chat.from_persona(mark))


def pending_tool_calls(chat: Chat) -> list[dict[str, Any]]:
    """The tool calls awaiting the user's choice, as jupyter-ai's frontend finds them: in the persona's
    messages' metadata (``tool_calls``, with ``permission_status`` pending and the agent's options)."""
    found = []
    for message_id in chat.order:
        message = chat.messages[message_id]
        if message["sender"] != PERSONA_ID:
            continue
        for call_ in (message.get("metadata") or {}).get("tool_calls") or []:
            if call_.get("permission_status") == "pending":
                found.append(call_)
    return found


async def post(
    jp_fetch: Any, *parts: str, body: Any = None, params: dict[str, str] | None = None
) -> tuple[int, Any]:
    """A POST to one of jupyter-ai's routes as the user: (status, JSON or None), never raising on 4xx."""
    try:
        response = await jp_fetch(
            *parts,
            method="POST",
            body=json.dumps(body if body is not None else {}),
            params=params or {},
            headers=as_user(USER),
        )
    except HTTPClientError as e:
        response = e.response
        assert response is not None, e
    return response.code, json.loads(response.body) if response.body else None


async def choose(jp_fetch: Any, tool_call: dict[str, Any], option_id: str) -> int:
    """The user's click on a permission button: jupyter_ai_acp_client's route, as its frontend posts it; the
    route's status."""
    request = {
        "session_id": tool_call["session_id"],
        "tool_call_id": tool_call["tool_call_id"],
        "option_id": option_id,
    }
    status, body = await post(jp_fetch, "ai", "acp", "permissions", body=request)
    assert status != 200 or body == {"status": "ok"}, body
    return status


async def session_file(jp_fetch: Any, session_id: str, path: str) -> tuple[int, str]:
    """(exit code, text) of ``cat path`` in the session (relative to its workspace)."""
    status, result = await exec_call(jp_fetch, session_id, ["cat", path], headers=as_user(USER))
    assert status == 200, result
    return result["exit_code"], result["stdout"]


async def only_agent_session(jp_fetch: Any) -> dict[str, Any]:
    (session,) = await agent_sessions(jp_fetch, USER)
    return session


# ------------------------------------------------------------------------------------------ terminals


@pytest.mark.docker
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [TERMINAL_SCRIPT], indirect=True)
async def test_docker_an_agents_terminal_runs_in_its_session_not_on_the_host(
    jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir, tmp_path
):
    (jp_root_dir / "proj").mkdir()
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await open_chat(jp_ws_fetch, "proj/t.chat")
        mark = await chat.send("run the marker command")
        steps = await chat.wait_for(
            lambda: (s := steps_after(chat, mark)) and "terminal" in s and s, 180, "the terminal's report"
        )
        report = steps["terminal"]
        assert "error" not in report, report
        assert report["exit_code"] == 0 and report["signal"] is None, report
        session = await only_agent_session(jp_fetch)
        workspace = session["workspace"].rstrip("/")
        pwd, hostname = report["output"].split()[:2]
        # the command's working directory: in the session's workspace (SessionTerminals' default: the agent's
        # own working directory, the workspace)
        assert pwd == workspace or pwd.startswith(workspace + "/"), report
        relative = pwd[len(workspace) + 1 :]
        # the session's host name (its container), not the server's
        assert hostname != socket.gethostname(), report
        status, uname = await exec_call(jp_fetch, session["id"], ["uname", "-n"], headers=as_user(USER))
        assert status == 200 and uname["stdout"].strip() == hostname, uname

        # the marker is in the session ...
        assert await session_file(jp_fetch, session["id"], f"{relative}/{MARKER}".lstrip("/")) == (
            0,
            "from-the-session\n",
        )
        # ... and nowhere on the host: not in the server's contents, its working directory, the test's
        # folders, nor at the session's workspace path on this machine
        for folder in (jp_root_dir, jp_root_dir / "proj", Path.cwd(), tmp_path, Path(workspace), Path(pwd)):
            assert not (folder / MARKER).exists(), folder
        assert not list(jp_root_dir.rglob(MARKER)) and not list(tmp_path.rglob(MARKER))
        chat.close()


# ------------------------------------------------------------------------------------------ permission


@pytest.mark.docker
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [PERMISSION_SCRIPT], indirect=True)
async def test_docker_a_permission_request_reaches_the_chat_and_only_an_approved_action_runs(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await open_chat(jp_ws_fetch)

        # approved: the action runs, in the session
        mark = await chat.send("write approved.txt, please")
        (request,) = await chat.wait_for(
            lambda: pending_tool_calls(chat), 180, "a pending permission request"
        )
        assert request["title"] == "write approved.txt", request
        options = {o["option_id"]: o["kind"] for o in request["permission_options"]}
        assert options == {"allow": "allow_once", "reject": "reject_once"}, request
        session = await only_agent_session(jp_fetch)
        # nothing ran before the user chose
        assert (await session_file(jp_fetch, session["id"], "approved.txt"))[0] != 0
        assert await choose(jp_fetch, request, "allow") == 200
        steps = await chat.wait_for(
            lambda: (s := steps_after(chat, mark)) and "terminal" in s and s,
            60,
            "the approved action's report",
        )
        assert steps["permission"] == {"step": "permission", "outcome": "selected", "option_id": "allow"}
        assert steps["terminal"]["exit_code"] == 0, steps
        assert await session_file(jp_fetch, session["id"], "approved.txt") == (0, "yes\n")
        await chat.wait_for(lambda: not pending_tool_calls(chat), 30, "the request marked resolved")

        # rejected: the action does not run
        mark = await chat.send("and rejected.txt?")
        (request,) = await chat.wait_for(
            lambda: pending_tool_calls(chat), 60, "the second permission request"
        )
        assert request["title"] == "write rejected.txt", request
        assert await choose(jp_fetch, request, "reject") == 200
        await chat.wait_for(
            lambda: any("left alone" in body for body in chat.from_persona(mark)),
            60,
            "the rejection's branch",
        )
        steps = steps_after(chat, mark)
        assert steps["permission"] == {"step": "permission", "outcome": "selected", "option_id": "reject"}
        assert "terminal" not in steps, steps
        assert (await session_file(jp_fetch, session["id"], "rejected.txt"))[0] != 0
        # a choice for a request already answered is refused by jupyter-ai's route (nothing pending)
        assert await choose(jp_fetch, request, "allow") == 404
        assert (await session_file(jp_fetch, session["id"], "rejected.txt"))[0] != 0
        chat.close()


# ------------------------------------------------------------------------------------------ cancellation


@pytest.mark.docker
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [CANCEL_SCRIPT], indirect=True)
async def test_docker_the_stop_button_ends_the_agents_turn_cancelled(jp_fetch, jp_ws_fetch, jp_serverapp):
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await open_chat(jp_ws_fetch)
        mark = await chat.send("hello")
        await chat.wait_for(lambda: "echo" in steps_after(chat, mark), 180, "the first answer")
        agent = persona_of(jp_serverapp, chat)
        session = await only_agent_session(jp_fetch)
        # how each turn ends: the ACP prompt's response, recorded where the persona's client receives it
        connection = await (await agent.get_client()).get_connection()
        stop_reasons: list[str] = []
        prompt = connection.prompt

        async def recording_prompt(*args: Any, **kwargs: Any) -> Any:
            response = await prompt(*args, **kwargs)
            stop_reasons.append(response.stop_reason)
            return response

        connection.prompt = recording_prompt

        mark = await chat.send("take your time")
        await chat.wait_for(
            lambda: any("working on it" in body for body in chat.from_persona(mark)), 60, "the turn's start"
        )
        assert agent.processing
        # the stop button: jupyter-ai's cancel route for the chat
        started = time.monotonic()
        status, body = await post(
            jp_fetch, "api", "ai", "personas", "cancel", params={"chat_id": chat.chat_id}
        )
        assert status == 200 and body == {"status": "cancelled", "cancelled": [PERSONA_ID]}, body
        await chat.wait_for(lambda: stop_reasons, 30, "the turn's end")
        assert stop_reasons == ["cancelled"]
        await chat.wait_for(lambda: not agent.processing, 30, "the persona's turn to end")
        assert time.monotonic() - started < 30  # not the agent's 90 s sleep
        bodies = chat.from_persona(mark)
        assert not any("the rest of the turn" in b for b in bodies), bodies
        assert "sleep" not in agent_lines(bodies), bodies  # the sleep reports only when not cancelled

        # the agent lives on in the same session and answers the next message
        mark = await chat.send("still there?")
        steps = await chat.wait_for(
            lambda: (s := steps_after(chat, mark)) and "echo" in s and s, 60, "the next turn's answer"
        )
        assert "still there?" in steps["echo"]["text"]
        assert stop_reasons == ["cancelled", "end_turn"], stop_reasons
        assert (await only_agent_session(jp_fetch))["id"] == session["id"]
        chat.close()


# ------------------------------------------------------------------------------------------ a dead agent


@pytest.mark.docker
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [KILL_SCRIPT], indirect=True)
async def test_docker_an_agent_killed_in_its_session_mid_turn_is_said_and_its_session_destroyed(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await open_chat(jp_ws_fetch)
        mark = await chat.send("take your time")
        await chat.wait_for(
            lambda: any("working on it" in body for body in chat.from_persona(mark)), 180, "the turn's start"
        )
        session = await only_agent_session(jp_fetch)
        (pid,) = await agent_pids(jp_fetch, session["id"], USER)
        status, killed = await exec_call(jp_fetch, session["id"], ["kill", "-9", pid], headers=as_user(USER))
        assert status == 200 and killed["exit_code"] == 0, killed
        said = await chat.wait_for(
            lambda: [b for b in chat.from_persona(mark) if "exited with status" in b], 60, "the agent's exit"
        )
        assert "137" in said[0] and session["id"] in said[0], said
        agent = persona_of(jp_serverapp, chat)
        await chat.wait_for(lambda: not agent.processing, 30, "the turn's end")
        await chat.wait_for(
            lambda: PERSONA_ID not in chat.metadata.get("tai_sandbox_sessions", {PERSONA_ID: 0}),
            30,
            "the session forgotten in the chat's metadata",
        )
        gone, _ = await call(jp_fetch, "sessions", session["id"], headers=as_user(USER))
        assert gone == 404
        assert await agent_sessions(jp_fetch, USER) == []
        chat.close()


@pytest.mark.docker
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [EXIT_SCRIPT], indirect=True)
async def test_docker_an_agent_that_exits_on_its_own_is_said_with_its_stderr_and_its_session_destroyed(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await open_chat(jp_ws_fetch)
        mark = await chat.send("do your thing")
        # the session, while it lives (the agent exits at once)
        session_ids = await chat.wait_for(
            lambda: [v for v in [chat.metadata.get("tai_sandbox_sessions", {}).get(PERSONA_ID)] if v],
            180,
            "the session recorded in the chat",
        )
        said = await chat.wait_for(
            lambda: [b for b in chat.from_persona(mark) if "exited with status" in b], 180, "the agent's exit"
        )
        assert "exited with status 3" in said[0], said
        assert "boom: the agent's last words" in said[0], said
        assert session_ids and await agent_sessions(jp_fetch, USER) == []
        gone, _ = await call(jp_fetch, "sessions", session_ids[0], headers=as_user(USER))
        assert gone == 404
        chat.close()
