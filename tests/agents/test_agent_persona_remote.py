"""A sandboxed coding agent persona (issue 53, point 1) on the remote provider: the user's server (a real
jupyter_server with jupyterlab_chat, jupyter-ai's router and persona manager, this extension on
``SandboxApp.provider=remote``) and a central sandbox server (a ``jupyter server`` subprocess on the docker
provider, as JupyterHub's sandbox service is); the tests' ACP agent (tests/support/acp_test_agent.py) in the
agents image.

Pinned: the reply comes from an agent in the user's session at the remote (consumer agent:<key>, owner the
user, who is the remote's principal for the token as a hub user is for their own token: the user's server is
single-user, as under JupyterHub); its fs/write_text_file lands in that session's workspace (read back
through both servers' exec and files doors), not on either server's disk; ``/sandbox stop`` destroys the
session at the remote. Secrets are the remote's to grant (this server's are refused there, see
tests/server/test_egress_remote.py), so this persona names none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_tai_sandbox.images import AGENTS_IMAGE
from jupyter_tai_sandbox.server_lookup import sandbox_app
from jupyter_tai_sandbox.sessions import server_owner
from tests.agents.test_agent_persona import (
    CONSUMER,
    KEY,
    PERSONA_ID,
    ChatClient,
    agent_lines,
    agent_pids,
    agent_sessions,
    agent_sessions_destroyed,
    chat_server_config,
    persona,
)
from tests.support import DEPLOYMENT
from tests.support.docker import client, nothing_left, server_args
from tests.support.live_server import LiveServer
from tests.support.server import exec_call

__all__ = ["client", "nothing_left"]

#: what the agent writes, and where (the docker provider's workspace is /workspace)
WRITTEN = "written by the agent in its remote session\n"
TARGET = "/workspace/from-the-agent.txt"
SCRIPT = {
    "turns": [
        [
            {"do": "info"},
            {"do": "write", "path": TARGET, "content": WRITTEN},
            {"do": "read", "path": TARGET},
            {"do": "echo"},
        ]
    ]
}

#: the central server's own deployment scope, of this part of the run (the run's end checks know it)
REMOTE_DEPLOYMENT = f"{DEPLOYMENT}-agent-remote"


@pytest.fixture(scope="module")
def docker_remote(nothing_left, tmp_path_factory) -> Iterator[LiveServer]:
    """The central sandbox server on the docker provider (its token's principal: this machine's user); the
    module's nothing_left checks after its stop that it left no container, volume or network."""
    tmp = tmp_path_factory.mktemp("agent-remote")
    server = LiveServer(
        tmp,
        args=(
            *server_args(),
            f"--DockerSandbox.deployment={REMOTE_DEPLOYMENT}",
            "--SandboxPolicy.isolation=none",
            f"--LocalSandbox.root={tmp / 'sandboxes'}",
        ),
        log_name="remote.log",
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def jp_server_config(docker_remote, tmp_path, monkeypatch):
    monkeypatch.setenv("TAI_TEST_MODEL_KEY", "unused-here")
    return chat_server_config(
        "remote",
        tmp_path / "sandboxes",
        {KEY: persona("chat", secrets=[], env={"ACP_TEST_AGENT_SCRIPT": json.dumps(SCRIPT)})},
        SandboxPolicy={"secrets": {}},
        SandboxApp={"live_command_grace_seconds": 0},
        RemoteSandbox={"url": docker_remote.url, "token": docker_remote.token},
    )


def files_named(name: str, *roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob(name)]


@pytest.mark.docker
@pytest.mark.slow(40)
async def test_remote_the_agent_runs_in_the_users_session_at_the_remote(
    jp_fetch, jp_ws_fetch, jp_serverapp, jp_root_dir, docker_remote, tmp_path
):
    app = sandbox_app(jp_serverapp)
    assert app is not None and app.sandbox is not None and app.sandbox.kind == "remote"
    user = server_owner()  # the single-user server's principal, and the remote's for this token
    async with agent_sessions_destroyed(jp_serverapp):
        chat = await ChatClient.open(jp_ws_fetch, "r.chat")
        steps = await chat.ask(
            "hello remote agent", lambda bodies: "echo" in agent_lines(bodies) and agent_lines(bodies)
        )
        assert "hello remote agent" in steps["echo"]["text"]
        assert steps["info"]["fs"] and steps["info"]["terminal"], steps
        assert steps["write"] == {"step": "write", "ok": True}, steps
        assert steps["read"]["content"] == WRITTEN, steps

        # the agent's session, seen from the user's server: consumer agent:<key>, owner the user, docker's
        (session,) = await agent_sessions(jp_fetch, user)
        assert session["owner"] == user and session["kind"] == "docker", session
        assert session["image"] == AGENTS_IMAGE, session
        assert steps["info"]["cwd"] == session["workspace"].rstrip("/") == "/workspace"
        assert chat.metadata["tai_sandbox_sessions"] == {PERSONA_ID: session["id"]}
        assert len(await agent_pids(jp_fetch, session["id"], user)) == 1
        # ... and at the remote: the same session, under the token's own label, its principal the owner
        (at_remote,) = [
            s
            for s in docker_remote.request("GET", "api/sandbox/sessions")["sessions"]
            if s["id"] == session["id"]
        ]
        assert at_remote["consumer"] == f"user:{user}/{CONSUMER}" and at_remote["owner"] == user, at_remote

        # the write is in the session's workspace (both doors read it), on neither server's disk
        status, cat = await exec_call(jp_fetch, session["id"], ["cat", TARGET])
        assert status == 200 and cat["exit_code"] == 0 and cat["stdout"] == WRITTEN, cat
        status, raw = docker_remote.call("GET", f"sessions/{session['id']}/files/from-the-agent.txt")
        assert status == 200 and raw == WRITTEN.encode(), (status, raw)
        assert files_named("from-the-agent.txt", jp_root_dir, tmp_path, docker_remote.tmp) == []

        # /sandbox stop: the agent ends and its session is destroyed at the remote
        stopped = await chat.ask("/sandbox stop", lambda bodies: [b for b in bodies if "Stopped" in b])
        assert session["id"] in stopped[0], stopped
        assert await agent_sessions(jp_fetch, user) == []
        assert session["id"] not in docker_remote.session_ids()
        chat.close()
