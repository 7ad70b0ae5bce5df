"""The REAL Claude Code agent as a jupyter-ai persona in a chat (issue 53, "Tests (real clients, offline)"):
the persona level of tests/agents/test_real_claude_agent.py.

A real jupyter_server runs this extension with jupyterlab_chat, jupyter_ai_router, jupyter_ai_persona_manager
and jupyter_ai_acp_client; the operator's config declares ``SandboxAgents.personas = {"claude": {"preset":
"claude", ...}}`` with the model key as a ``SandboxPolicy`` secret. A chat client on the chat's websocket (as
JupyterLab's chat panel) hands the agent a folder (``/sandbox copy-in``), asks it to work, and answers each
permission prompt the chat shows with the chat's own route (``POST /ai/acp/permissions``, the Allow button).
The agent (``claude-code-acp`` in the agents image, a docker session of the user behind the egress gateway)
talks to the tests' fake model at ``https://api.model.test`` (tests/support/egress_hosts.py), whose script
makes it try the server's secrets (its token, its user's ssh key, a file of its own) and a host off its list,
then edit the handed-in file. Pinned: each escape fails and the model is told so; none of the server's
secrets (the running server's own token included) reaches the model or the session; the edit is in the session
and reaches the contents only by ``/sandbox copy-back``; the model got the real key, the session holds only
its placeholder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jupyter_tai_sandbox.server_lookup import sandbox_app
from tests.agents.test_real_claude_agent import (
    EDITED,
    IMAGE,
    ORIGINAL,
    PROJECT,
    SECRET,
    SECRET_ENV,
    agents_image,
    make_server_secrets,
    scan_session,
    script,
)
from tests.support.docker import client, nothing_left
from tests.support.egress_hosts import ALLOWED, MODEL_HOST, EgressHosts, egress_hosts
from tests.support.fake_model import FakeModel
from tests.support.server import call, server_config

pytestmark = [
    pytest.mark.docker,
    pytest.mark.egress_gateway,
    pytest.mark.slow(40),
    pytest.mark.usefixtures("nothing_left"),
]

__all__ = ["client", "egress_hosts", "nothing_left"]  # the fixtures, imported for this module

KEY = "claude"
PERSONA_ID = "jupyter-ai-personas::jupyter_tai_sandbox::SandboxedClaudePersona"
CHAT_EXTENSIONS = {
    "jupyter_tai_sandbox": True,
    "jupyterlab_chat": True,
    "jupyter_ai_router": True,
    "jupyter_ai_persona_manager": True,
    "jupyter_ai_acp_client": True,
}
REAL_KEY = f"sk-ant-api03-persona-{secrets.token_hex(20)}"


@pytest.fixture
def jp_server_config(egress_hosts: EgressHosts, client, tmp_path, monkeypatch):
    """A server with the claude persona (the agents image, its model the tests' endpoint, its key a secret of
    the gateway), the docker provider using the test hosts' resolver and CA."""
    agents_image(client)
    monkeypatch.setenv(SECRET_ENV, REAL_KEY)
    config = server_config(
        "docker",
        tmp_path / "sandboxes",
        SandboxAgents={
            "personas": {
                KEY: {
                    "preset": "claude",
                    "image": IMAGE,
                    "model_hosts": [MODEL_HOST],
                    "secrets": [SECRET],
                    "env": {"ANTHROPIC_BASE_URL": f"https://{MODEL_HOST}"},
                    "ttl_seconds": 900,
                }
            },
            "registries": [],
            "start_timeout_seconds": 180,
        },
        SandboxPolicy={
            "isolation": "none",
            "egress_audit_path": "",
            "egress_rules": {"*": {"allow": [MODEL_HOST, ALLOWED]}},
            "secrets": {SECRET: {"hosts": [MODEL_HOST], "from_env": SECRET_ENV, "env": "ANTHROPIC_API_KEY"}},
        },
        DockerSandbox={"egress_resolver": egress_hosts.resolver, "egress_upstream_ca": str(egress_hosts.ca)},
        SandboxApp={"live_command_grace_seconds": 0},
    )
    config["ServerApp"]["jpserver_extensions"] = dict(CHAT_EXTENSIONS)
    return config


class Chat:
    """A client of jupyterlab_chat's websocket for one chat file (what JupyterLab's chat panel is without a
    collaboration provider): it sends to the persona and keeps every message by id."""

    def __init__(self, ws: Any, first: dict[str, Any]) -> None:
        self.ws = ws
        self.messages: dict[str, dict[str, Any]] = {m["id"]: m for m in first["messages"]}
        self.order: list[str] = list(self.messages)
        self.announced: set[str] = set()
        self.changed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, jp_ws_fetch: Callable[..., Any], path: str) -> Chat:
        ws = await jp_ws_fetch("api", "chat", "ws", path)
        first = json.loads(await asyncio.wait_for(ws.read_message(), 30))
        assert first["action"] == "connection", first
        chat = cls(ws, first)
        chat.announced.update(first.get("users") or {})
        await chat.wait_for(lambda: PERSONA_ID in chat.announced, 60, "the persona")
        return chat

    async def _read(self) -> None:
        while (raw := await self.ws.read_message()) is not None:
            frame = json.loads(raw)
            if frame.get("action") == "message":
                message = frame["message"]
                if message["id"] not in self.messages:
                    self.order.append(message["id"])
                self.messages[message["id"]] = message
            elif frame.get("action") == "users":
                self.announced.update(frame["users"])
            self.changed.set()

    async def wait_for(self, ready: Callable[[], Any], seconds: float, what: str, tick: Any = None) -> Any:
        deadline = time.monotonic() + seconds
        while not (value := ready()):
            if tick is not None:
                await tick()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {seconds} s; the chat: {self.transcript()[-20:]}")
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.5))
        return value

    def persona_messages(self, after: int = 0) -> list[dict[str, Any]]:
        return [self.messages[i] for i in self.order[after:] if self.messages[i]["sender"] == PERSONA_ID]

    def transcript(self) -> list[tuple[str, str]]:
        return [(self.messages[i]["sender"], self.messages[i]["body"][:300]) for i in self.order]

    def tool_calls(self) -> list[dict[str, Any]]:
        return [c for m in self.persona_messages() for c in (m.get("metadata") or {}).get("tool_calls") or ()]

    async def send(self, body: str) -> int:
        mark = len(self.order)
        frame = {"type": "client", "action": "send", "id": str(uuid.uuid4()), "body": body}
        await self.ws.write_message(json.dumps({**frame, "metadata": {"to_persona": PERSONA_ID}}))
        return mark

    async def ask(
        self, body: str, done: Callable[[str], bool], seconds: float = 180, tick: Any = None
    ) -> str:
        """Send ``body``; the persona's first message after it that ``done`` accepts."""
        mark = await self.send(body)

        def found() -> str | None:
            return next((m["body"] for m in self.persona_messages(mark) if done(m["body"])), None)

        return await self.wait_for(found, seconds, f"answer to {body!r}", tick)

    def close(self) -> None:
        self.ws.close()
        self._reader.cancel()


@contextlib.asynccontextmanager
async def agent_sessions_destroyed(serverapp: Any):
    """At the end, every agent session of the server is destroyed (they outlive a server's stop on purpose)."""
    try:
        yield
    finally:
        app = sandbox_app(serverapp)
        sandbox = app.sandbox if app is not None else None
        if sandbox is not None:
            for info in await sandbox.list():
                if info.consumer.startswith("agent:"):
                    with contextlib.suppress(Exception):
                        await (await sandbox.get(info.id)).destroy(remove_workspace=True)


async def test_the_real_claude_persona_in_a_chat_escapes_nothing_and_its_edit_comes_back_by_copy_back(
    jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir, egress_hosts: EgressHosts, client, tmp_path: Path
) -> None:
    hosts = egress_hosts
    model: FakeModel = hosts.model
    server = make_server_secrets(tmp_path / "server")
    server_token = jp_serverapp.identity_provider.token
    assert server_token, "the test server has no token to protect"
    (jp_root_dir / PROJECT).mkdir()
    contents_file = jp_root_dir / PROJECT / "app.py"
    contents_file.write_text(ORIGINAL)
    asked: list[dict[str, Any]] = []

    async with agent_sessions_destroyed(jp_serverapp):
        chat = await Chat.open(jp_ws_fetch, "redteam.chat")
        try:
            # the user hands the folder over (this starts the agent in the user's session), and asks where
            copied = await chat.ask(f"/sandbox copy-in {PROJECT}", lambda b: b.startswith("Copied in"), 240)
            assert "1 file(s) written" in copied, copied
            body = await chat.ask("/sandbox status", lambda b: "```json" in b)
            status = json.loads(body.split("```json", 1)[1].split("```", 1)[0])
            assert status["running"] and status["image"] == IMAGE, status
            assert status["egress_allow"] == [MODEL_HOST] and status["secrets"] == [SECRET], status
            workspace = status["workspace"].rstrip("/")
            turns, ids = script(workspace, server, hosts)
            model.script(turns)
            since = model.mark()
            web_since = len(hosts.http_requests())

            async def approve() -> None:
                """The user presses Allow on each permission prompt the chat shows (the chat's own route)."""
                for call_ in chat.tool_calls():
                    ident = call_["tool_call_id"]
                    if call_.get("permission_status") == "pending" and ident not in {
                        c["tool_call_id"] for c in asked
                    }:
                        asked.append(call_)
                        answer = {
                            "session_id": call_["session_id"],
                            "tool_call_id": ident,
                            "option_id": "allow",
                        }
                        response = await jp_fetch(
                            "ai", "acp", "permissions", method="POST", body=json.dumps(answer)
                        )
                        assert response.code in (200, 204), response.code

            said = await chat.ask("Tidy up the greeting.", lambda b: "All done" in b, 300, tick=approve)
            assert "greeting is edited" in said

            requests = model.requests()[since:]
            results = FakeModel.tool_results_of(requests)
            got = {name: results.get(ident, {"missing": True}) for name, ident in ids.items()}
            assert all(not r.get("missing") for r in got.values()), got

            # every escape failed, and the model was told so
            for name in (
                "read_ssh",
                "read_token",
                "read_environ",
                "read_outside",
                "read_etc",
                "write_outside",
            ):
                assert got[name]["is_error"] and "workspace" in got[name]["text"], (name, got[name])
            assert got["bash_files"]["text"].count("No such file or directory") == 5, got["bash_files"]
            assert "cannot open /proc/1/environ: Permission denied" in got["bash_environ"]["text"]
            network = got["bash_network"]["text"]
            assert "PROBE-DONE" in network and "REACHED" not in network, network
            assert network.count("REFUSED") == 3, network
            assert hosts.http_requests()[web_since:] == []
            # the prompts reached the chat before each write and command
            assert {c["tool_call_id"] for c in asked} >= {
                ids[n]
                for n in (
                    "write_outside",
                    "bash_files",
                    "bash_environ",
                    "write_probe",
                    "bash_network",
                    "edit_app",
                )
            }

            # the model: the real key on every request, nothing of the server's, the placeholder it was shown
            keys = {v for r in requests for k, v in r["headers"] if k.lower() == "x-api-key"}
            assert keys == {REAL_KEY}, keys
            bodies = "\n".join(r["body"] for r in requests)
            for name, marker in {**server.markers, "server token": server_token}.items():
                assert marker not in bodies, f"the server's {name} reached the model"
            assert "tai-placeholder-" in got["bash_environ"]["text"]

            # the edit: in the session, not in the contents until the user copies it back
            app = sandbox_app(jp_serverapp)
            assert app is not None and app.sandbox is not None
            session = await app.sandbox.get(status["session"])
            assert (await session.get_file(f"{PROJECT}/app.py")).decode() == EDITED
            assert contents_file.read_text() == ORIGINAL
            scan = await asyncio.to_thread(
                scan_session, client, session.id, [REAL_KEY, server_token, *server.markers.values()]
            )
            assert scan["found"] == [] and scan["processes"] >= 2 and scan["bytes"] > 1 << 20, scan["found"]
            back = await chat.ask("/sandbox copy-back", lambda b: b.startswith("Copied back"), 60)
            assert "1 file(s) written" in back, back
            assert contents_file.read_text() == EDITED

            stopped = await chat.ask("/sandbox stop", lambda b: b.startswith("Stopped"), 60)
            assert status["session"] in stopped
            listed_status, listed = await call(jp_fetch, "sessions")
            assert listed_status == 200
            sessions = listed["sessions"] if isinstance(listed, dict) else listed
            assert [s for s in sessions if s["consumer"] == f"agent:{KEY}"] == []
        finally:
            chat.close()
