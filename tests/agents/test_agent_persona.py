"""Sandboxed coding agents as jupyter-ai personas (issue 53, point 1), on a real jupyter_server with
jupyterlab_chat, jupyter_ai_router, jupyter_ai_persona_manager and this extension: a chat client over the
chat websocket (what JupyterLab uses when no collaboration provider is installed) writes to the persona; the
agent is the tests' ACP agent (tests/support/acp_test_agent.py) running in a docker session of the user.

Pinned: the reply comes from an agent in the user's docker session (consumer agent:<key>, owner the user, the
configured secret a placeholder there, the agent's working directory the chat's folder in the workspace);
another chat gets its own session (scope chat) or shares it (scope persona); another user's message is
refused in the chat; a killed agent is said in the chat, its session destroyed, and the next message starts a
new one; /sandbox status and stop are the persona's, not the agent's; the local provider refuses in the chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_tai_sandbox.images import AGENTS_IMAGE
from jupyter_tai_sandbox.server_lookup import sandbox_app
from tests.support import REPO
from tests.support.docker import client, nothing_left
from tests.support.server import call, exec_call, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

__all__ = ["client", "nothing_left"]

KEY = "test-agent"
PERSONA_ID = "jupyter-ai-personas::jupyter_tai_sandbox::SandboxedTestAgentPersona"
CONSUMER = f"agent:{KEY}"
AGENT_SOURCE = (REPO / "tests" / "support" / "acp_test_agent.py").read_text()
#: every prompt: the session's facts, then the prompt echoed
SCRIPT = {"turns": [[{"do": "info"}, {"do": "echo"}]]}
REAL_KEY = "sk-test-Model-Key-Real-42"
CHAT_EXTENSIONS = {
    "jupyter_tai_sandbox": True,
    "jupyterlab_chat": True,
    "jupyter_ai_router": True,
    "jupyter_ai_persona_manager": True,
}
#: finds the agent's process in its session by its source (python3 -c <the test agent>)
FIND_AGENT = (
    "import os\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit() and int(p) != os.getpid():\n"
    "        try:\n"
    "            cmd = open(f'/proc/{p}/cmdline', 'rb').read()\n"
    "        except OSError:\n"
    "            continue\n"
    "        if b'class ScriptedAgent' in cmd and cmd.startswith(b'python3'):\n"
    "            print(p)\n"
)


def persona(scope: str = "chat", **extra: Any) -> dict[str, Any]:
    """The tests' persona: the test agent from source in the agents image (python3 and the acp package)."""
    return {
        "name": "Test agent",
        "command": ["python3", "-c", AGENT_SOURCE],
        "image": AGENTS_IMAGE,
        "egress_allow": ["api.model.test"],
        "secrets": ["model"],
        "env": {"ACP_TEST_AGENT_SCRIPT": json.dumps(SCRIPT)},
        "scope": scope,
        "ttl_seconds": 600,
        **extra,
    }


def chat_server_config(provider: str, root: Path, personas: dict[str, Any], **extra: Any) -> dict[str, Any]:
    sections: dict[str, Any] = {
        "SandboxAgents": {"personas": personas, "start_timeout_seconds": 180},
        "SandboxPolicy": {
            "isolation": "none",
            "secrets": {
                "model": {
                    "hosts": ["api.model.test"],
                    "from_env": "TAI_TEST_MODEL_KEY",
                    "env": "MODEL_KEY",
                    "consumers": ["user:admin"],
                }
            },
        },
    }
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    config = server_config(provider, root, **sections)
    config["ServerApp"]["jpserver_extensions"] = dict(CHAT_EXTENSIONS)
    return config


def multi_user(**server_app: Any) -> dict[str, Any]:
    return {
        "identity_provider_class": f"{HeaderUsers.__module__}.HeaderUsers",
        "authorizer_class": f"{AdminOnlyAdmin.__module__}.AdminOnlyAdmin",
        **server_app,
    }


def docker_needed() -> None:
    from tests.support.docker import docker_client

    docker_client().close()  # skips without an engine (fails in CI)


# ------------------------------------------------------------------------------------------ a chat client


class ChatClient:
    """A client of jupyterlab_chat's websocket (one chat file), as JupyterLab's chat panel is one: it sends
    messages (``metadata.to_persona`` names the persona, as the persona picker does) and keeps the server's
    frames (messages by id, users, metadata)."""

    def __init__(self, ws: Any, first: dict[str, Any]) -> None:
        self.ws = ws
        self.user = first["user"]["username"]
        self.messages: dict[str, dict[str, Any]] = {m["id"]: m for m in first["messages"]}
        self.order: list[str] = [m["id"] for m in first["messages"]]
        self.users: dict[str, Any] = dict(first["users"])
        self.announced: set[str] = (
            set()
        )  # users announced after the connection (a persona manager's personas)
        self.metadata: dict[str, Any] = {}
        self.changed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(
        cls, ws_fetch: Callable[..., Any], path: str, user: str | None = None, *, live: bool = False
    ) -> ChatClient:
        """Connect to the chat ``path``; unless it is ``live`` already (another client has it open), wait until
        its persona manager has announced its personas (the router routes its messages from then on)."""
        ws = await ws_fetch("api", "chat", "ws", path, headers=as_user(user) if user else None)
        first = json.loads(await asyncio.wait_for(ws.read_message(), 30))
        assert first["action"] == "connection", first
        chat = cls(ws, first)
        if live:
            assert PERSONA_ID in chat.users, chat.users
        else:
            await chat.wait_for(lambda: PERSONA_ID in chat.announced, 60, "the persona manager's personas")
        return chat

    async def _read(self) -> None:
        while True:
            raw = await self.ws.read_message()
            if raw is None:
                return
            frame = json.loads(raw)
            action = frame.get("action")
            if action == "message":
                message = frame["message"]
                if message["id"] not in self.messages:
                    self.order.append(message["id"])
                self.messages[message["id"]] = message
            elif action == "users":
                self.users.update(frame["users"])
                self.announced.update(frame["users"])
            elif action == "metadata":
                self.metadata.update(frame["metadata"])
            self.changed.set()

    async def wait_for(self, ready: Callable[[], Any], seconds: float, what: str) -> Any:
        deadline = time.monotonic() + seconds
        while True:
            value = ready()
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {seconds} s; the chat: {self.transcript()}")
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))

    def transcript(self) -> list[tuple[str, str]]:
        return [(self.messages[i]["sender"], self.messages[i]["body"]) for i in self.order]

    def from_persona(self, after: int = 0) -> list[str]:
        return [
            self.messages[i]["body"] for i in self.order[after:] if self.messages[i]["sender"] == PERSONA_ID
        ]

    async def send(self, body: str, to: str = PERSONA_ID) -> int:
        """Send ``body`` to the persona ``to``; the index the replies start after."""
        mark = len(self.order)
        await self.ws.write_message(
            json.dumps(
                {
                    "type": "client",
                    "action": "send",
                    "id": str(uuid.uuid4()),
                    "body": body,
                    "metadata": {"to_persona": to},
                }
            )
        )
        return mark

    async def ask(self, body: str, done: Callable[[list[str]], Any], seconds: float = 180) -> Any:
        """Send ``body`` and wait until the persona's messages after it satisfy ``done`` (its value)."""
        mark = await self.send(body)
        return await self.wait_for(lambda: done(self.from_persona(mark)), seconds, f"answer to {body!r}")

    def close(self) -> None:
        self.ws.close()
        self._reader.cancel()


def agent_lines(bodies: list[str]) -> dict[str, dict[str, Any]]:
    """The test agent's report lines (one JSON object per step) in the persona's messages, by step."""
    steps: dict[str, dict[str, Any]] = {}
    for body in bodies:
        for line in body.splitlines():
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and "step" in data:
                    steps[data["step"]] = data
    return steps


def answered(bodies: list[str]) -> dict[str, dict[str, Any]] | None:
    steps = agent_lines(bodies)
    return steps if {"info", "echo"} <= set(steps) else None


@contextlib.asynccontextmanager
async def agent_sessions_destroyed(serverapp: Any) -> AsyncIterator[None]:
    """At the end, every agent session of the server's deployment is destroyed (they outlive a server's stop
    on purpose; a test leaves none)."""
    try:
        yield
    finally:
        sandbox = sandbox_app(serverapp).sandbox  # type: ignore[union-attr]
        if sandbox is not None:
            for info in await sandbox.list():
                if info.consumer.startswith("agent:"):
                    with contextlib.suppress(Exception):
                        await (await sandbox.get(info.id)).destroy()


async def agent_sessions(jp_fetch: Any, user: str) -> list[dict[str, Any]]:
    status, listed = await call(jp_fetch, "sessions", headers=as_user(user))
    assert status == 200, listed
    sessions = listed["sessions"] if isinstance(listed, dict) else listed
    return [s for s in sessions if s["consumer"] == CONSUMER]


async def agent_pids(jp_fetch: Any, session_id: str, user: str) -> list[str]:
    status, result = await exec_call(
        jp_fetch, session_id, ["python3", "-c", FIND_AGENT], headers=as_user(user)
    )
    assert status == 200 and result["exit_code"] == 0, result
    return result["stdout"].split()


# ------------------------------------------------------------------------------------------ docker


@pytest.fixture
def jp_server_config(request, tmp_path, monkeypatch):
    """The server of a test: ``(provider, scope)`` by indirect parametrization."""
    monkeypatch.setenv("TAI_TEST_MODEL_KEY", REAL_KEY)
    provider, scope, *script = request.param
    if provider == "docker":
        docker_needed()
    return chat_server_config(
        provider,
        tmp_path / "sandboxes",
        {
            KEY: persona(
                scope, **({"env": {"ACP_TEST_AGENT_SCRIPT": json.dumps(script[0])}} if script else {})
            )
        },
        ServerApp=multi_user(),
        SandboxApp={"live_command_grace_seconds": 0},
    )


@pytest.mark.docker
@pytest.mark.slow(120)
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [("docker", "chat")], indirect=True)
async def test_docker_each_chat_gets_the_users_own_agent_session(
    jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir
):
    app = sandbox_app(jp_serverapp)
    assert app is not None
    # granted at start: the secret's consumers gain agent:<key>; its egress rule is the persona's list
    assert app.policy.secrets["model"]["consumers"] == ["user:admin", CONSUMER]
    assert app.policy.egress_rules[CONSUMER] == {"allow": ["api.model.test"], "deny": []}
    (jp_root_dir / "proj").mkdir()
    async with agent_sessions_destroyed(jp_serverapp):
        alice = await ChatClient.open(jp_ws_fetch, "proj/a.chat", "alice")
        steps = await alice.ask("hello agent", answered)
        assert "hello agent" in steps["echo"]["text"]
        assert (
            "/sandbox copy-in" in steps["echo"]["text"]
        )  # the persona's sandbox note, not jupyter-ai's MCP note
        assert steps["info"]["mcp_servers"] == [] and steps["info"]["fs"] and steps["info"]["terminal"]

        # the agent runs in alice's docker session of consumer agent:<key>, its cwd the chat's folder there
        (session,) = await agent_sessions(jp_fetch, "alice")
        assert session["owner"] == "alice" and session["kind"] == "docker", session
        assert session["image"] == AGENTS_IMAGE, session
        assert steps["info"]["cwd"] == session["workspace"].rstrip("/")
        assert alice.metadata["tai_sandbox_sessions"] == {PERSONA_ID: session["id"]}
        (pid,) = await agent_pids(jp_fetch, session["id"], "alice")
        # the model's key: granted to agent:<key> at start, a placeholder in the session, never the value
        status, env = await exec_call(
            jp_fetch, session["id"], ["printenv", "MODEL_KEY"], headers=as_user("alice")
        )
        assert status == 200 and env["exit_code"] == 0 and env["stdout"].strip(), env
        assert REAL_KEY not in env["stdout"]

        # bob, in alice's chat: refused, and nothing is started for him
        bob = await ChatClient.open(jp_ws_fetch, "proj/a.chat", "bob", live=True)
        refusal = await bob.ask("let me in", lambda bodies: [b for b in bodies if "works for" in b])
        assert "alice" in refusal[0] and "bob" in refusal[0]
        assert await agent_sessions(jp_fetch, "bob") == []
        bob.close()

        # another chat of alice's: its own session and agent (scope chat)
        other = await ChatClient.open(jp_ws_fetch, "b.chat", "alice")
        steps_b = await other.ask("second chat", answered)
        sessions = await agent_sessions(jp_fetch, "alice")
        assert len(sessions) == 2, sessions
        (second,) = [s for s in sessions if s["id"] != session["id"]]
        assert steps_b["info"]["cwd"] == second["workspace"].rstrip("/")
        assert other.metadata["tai_sandbox_sessions"] == {PERSONA_ID: second["id"]}

        # /sandbox status is the persona's answer (the agent never sees it)
        status_body = await alice.ask("/sandbox status", lambda bodies: [b for b in bodies if "```json" in b])
        assert session["id"] in status_body[0] and '"running": true' in status_body[0]

        # the agent killed in its session: the chat says so, the session goes, the next message starts afresh
        status, killed = await exec_call(
            jp_fetch, session["id"], ["kill", "-9", pid], headers=as_user("alice")
        )
        assert status == 200, killed
        said = await alice.wait_for(
            lambda: [b for b in alice.from_persona() if "exited with status" in b],
            60,
            "the agent's exit in the chat",
        )
        assert "137" in said[0] and session["id"] in said[0], said
        gone, _ = await call(jp_fetch, "sessions", session["id"], headers=as_user("alice"))
        assert gone == 404
        steps = await alice.ask("are you back?", answered)
        (fresh,) = [s for s in await agent_sessions(jp_fetch, "alice") if s["id"] != second["id"]]
        assert fresh["id"] != session["id"] and steps["info"]["cwd"] == fresh["workspace"].rstrip("/")

        # /sandbox stop: the agent ends and its session is destroyed
        stopped = await alice.ask("/sandbox stop", lambda bodies: [b for b in bodies if "Stopped" in b])
        assert fresh["id"] in stopped[0]
        assert [s["id"] for s in await agent_sessions(jp_fetch, "alice")] == [second["id"]]
        alice.close()
        other.close()


@pytest.mark.docker
@pytest.mark.slow(60)
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [("docker", "persona")], indirect=True)
async def test_docker_scope_persona_shares_one_session_between_the_users_chats(
    jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir
):
    (jp_root_dir / "proj").mkdir()
    async with agent_sessions_destroyed(jp_serverapp):
        first = await ChatClient.open(jp_ws_fetch, "a.chat", "alice")
        second = await ChatClient.open(jp_ws_fetch, "proj/b.chat", "alice")
        steps_a = await first.ask("from the first chat", answered)
        steps_b = await second.ask("from the second chat", answered)
        (session,) = await agent_sessions(jp_fetch, "alice")
        workspace = session["workspace"].rstrip("/")
        # one agent, one session: both chats' ACP sessions in its workspace
        assert steps_a["info"]["cwd"] == steps_b["info"]["cwd"] == workspace
        assert len(await agent_pids(jp_fetch, session["id"], "alice")) == 1
        # carol's chat: her own session, never alice's
        carol = await ChatClient.open(jp_ws_fetch, "c.chat", "carol")
        await carol.ask("carol here", answered)
        (hers,) = await agent_sessions(jp_fetch, "carol")
        assert hers["id"] != session["id"] and hers["owner"] == "carol"
        # /sandbox stop in one chat ends the shared agent: the other chat is told, and its next message
        # starts a new one
        await second.ask("/sandbox stop", lambda bodies: [b for b in bodies if "Stopped" in b])
        told = await first.wait_for(
            lambda: [b for b in first.from_persona() if "stopped with /sandbox stop by alice" in b],
            30,
            "the stop",
        )
        assert "next message starts a new one" in told[0]
        steps = await first.ask("again", answered)
        (again,) = await agent_sessions(jp_fetch, "alice")
        assert again["id"] != session["id"] and steps["info"]["cwd"] == again["workspace"].rstrip("/")
        for chat in (first, second, carol):
            chat.close()


EDIT = {
    "turns": [
        [
            {"do": "read", "path": "/workspace/proj/src/a.py"},
            {
                "do": "write",
                "path": "/workspace/proj/src/a.py",
                "content": "print('edited in the sandbox')\n",
            },
        ]
    ]
}


@pytest.mark.docker
@pytest.mark.slow(30)
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [("docker", "chat", EDIT)], indirect=True)
async def test_docker_sandbox_copy_in_and_copy_back_in_the_chat(
    jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir
):
    source = jp_root_dir / "proj" / "src" / "a.py"
    source.parent.mkdir(parents=True)
    source.write_text("print('from jupyter')\n")
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await ChatClient.open(jp_ws_fetch, "proj/h.chat", "alice")
        # nothing to copy back before a session exists; copy-in starts the agent's session
        nothing = await chat.ask(
            "/sandbox copy-back", lambda bodies: [b for b in bodies if "no sandbox session" in b]
        )
        assert nothing
        copied = await chat.ask(
            "/sandbox copy-in src", lambda bodies: [b for b in bodies if "Copied in" in b]
        )
        assert "`proj/src`" in copied[0] and "1 file(s) written" in copied[0], copied
        steps = await chat.ask(
            "edit a.py", lambda bodies: agent_lines(bodies).get("write") and agent_lines(bodies)
        )
        assert steps["read"]["content"] == "print('from jupyter')\n" and steps["write"] == {
            "step": "write",
            "ok": True,
        }
        assert (
            source.read_text() == "print('from jupyter')\n"
        )  # the edit stays in the session until copied back
        status = await chat.ask("/sandbox status", lambda bodies: [b for b in bodies if "```json" in b])
        assert '"copied_in": [\n  "proj/src"\n ]' in status[0], status
        back = await chat.ask("/sandbox copy-back", lambda bodies: [b for b in bodies if "Copied back" in b])
        assert "1 file(s) written" in back[0], back
        assert source.read_text() == "print('edited in the sandbox')\n"
        chat.close()


CRASH = {
    "turns": [
        [{"do": "info"}],
        [{"do": "stderr", "text": "boom: the agent gives up\n"}, {"do": "exit", "code": 3}],
    ]
}


@pytest.mark.docker
@pytest.mark.slow(30)
@pytest.mark.usefixtures("nothing_left")
@pytest.mark.parametrize("jp_server_config", [("docker", "chat", CRASH)], indirect=True)
async def test_docker_an_agent_that_dies_mid_prompt_is_said_with_its_stderr(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await ChatClient.open(jp_ws_fetch, "crash.chat", "alice")
        await chat.ask("first", lambda bodies: agent_lines(bodies).get("info"))
        (session,) = await agent_sessions(jp_fetch, "alice")
        said = await chat.ask("second", lambda bodies: [b for b in bodies if "exited with status" in b])
        assert "exited with status 3" in said[0] and "boom: the agent gives up" in said[0], said
        assert session["id"] in said[0] and "next message starts a new one" in said[0]
        assert await agent_sessions(jp_fetch, "alice") == []
        # a new agent in a new session; the chat's history goes to it as context (its ACP session is new)
        steps = await chat.ask("third", lambda bodies: agent_lines(bodies).get("info"))
        (fresh,) = await agent_sessions(jp_fetch, "alice")
        assert fresh["id"] != session["id"] and steps["cwd"] == fresh["workspace"].rstrip("/")
        assert not [b for b in chat.from_persona() if "Traceback" in b]  # said once, plainly
        chat.close()


# ------------------------------------------------------------------------------------------ local


@pytest.mark.parametrize("jp_server_config", [("local", "chat")], indirect=True)
async def test_the_local_provider_refuses_in_the_chat_and_runs_nothing(jp_fetch, jp_ws_fetch, jp_serverapp):
    chat = await ChatClient.open(jp_ws_fetch, "local.chat", "alice")
    refusal = await chat.ask("run on the host?", lambda bodies: [b for b in bodies if "cannot run" in b], 60)
    assert "SandboxSpecRejectedError" in refusal[0] and "isolation" in refusal[0], refusal
    status, listed = await call(jp_fetch, "sessions", headers=as_user("alice"))
    assert status == 200 and not (listed["sessions"] if isinstance(listed, dict) else listed)
    chat.close()
