"""A sandboxed agent outlives its server (issue 53, point 1: "a restart of the server finds them"): a live
``jupyter server`` (a subprocess, stopped cleanly with SIGTERM) and a new one on the same root and config;
the chat's next message is answered by the SAME agent process in the SAME session, which still holds the
chat's ACP session (the test agent counts its prompts per ACP session: the second prompt runs turn two)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import tornado.httpclient
import tornado.websocket
from jupyter_server.utils import url_path_join

from tests.agents.test_agent_persona import (
    CONSUMER,
    FIND_AGENT,
    KEY,
    PERSONA_ID,
    REAL_KEY,
    ChatClient,
    agent_lines,
    chat_server_config,
    docker_needed,
    persona,
)
from tests.support.docker import client, nothing_left
from tests.support.live_server import LiveServer

__all__ = ["client", "nothing_left"]

pytestmark = [pytest.mark.docker, pytest.mark.slow(40), pytest.mark.usefixtures("nothing_left")]

#: turn one: the facts; turn two (the same ACP session's second prompt): a line saying so, and the facts
SCRIPT = {
    "turns": [[{"do": "info"}], [{"do": "reply", "text": "turn two of the same session\n"}, {"do": "info"}]]
}


def start(home: Path) -> LiveServer:
    return LiveServer(
        home,
        root=home / "root",
        keep_sandbox_env=True,
        log_name="server-{port}.log",
        env={"TAI_TEST_MODEL_KEY": REAL_KEY, "JUPYTER_DATA_DIR": str(home / "data")},
    ).start()


def ws_fetch(live: LiveServer) -> Any:
    def fetch(*parts: str, headers: dict[str, str] | None = None) -> Any:
        url = url_path_join(f"ws://127.0.0.1:{live.port}/", *parts)
        request = tornado.httpclient.HTTPRequest(
            url, headers={"Authorization": f"token {live.token}", **(headers or {})}
        )
        return tornado.websocket.websocket_connect(request)

    return fetch


async def call(live: LiveServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.to_thread(live.call, method, path, body)


async def agent_session(live: LiveServer) -> dict[str, Any]:
    status, listed = await call(live, "GET", "sessions")
    assert status == 200, listed
    (session,) = [s for s in listed["sessions"] if s["consumer"] == CONSUMER]
    return session


async def agent_pids(live: LiveServer, session_id: str) -> list[str]:
    status, result = await call(
        live,
        "POST",
        f"sessions/{session_id}/exec",
        {"argv": ["python3", "-c", FIND_AGENT], "timeout_seconds": 30},
    )
    assert status == 200 and result["exit_code"] == 0, result
    return result["stdout"].split()


def test_docker_a_restarted_server_attaches_to_the_agent_still_running_in_its_session(tmp_path):
    docker_needed()
    (tmp_path / "root").mkdir()
    (tmp_path / "config").mkdir()
    config = chat_server_config(
        "docker",
        tmp_path / "sandboxes",
        {KEY: persona("chat", env={"ACP_TEST_AGENT_SCRIPT": json.dumps(SCRIPT)})},
    )
    (tmp_path / "config" / "jupyter_server_config.json").write_text(json.dumps(config))

    async def first_life(live: LiveServer) -> tuple[dict[str, Any], str]:
        chat = await ChatClient.open(ws_fetch(live), "r.chat")
        steps = await chat.ask("before the restart", lambda b: agent_lines(b).get("info"))
        session = await agent_session(live)
        assert steps["cwd"] == session["workspace"].rstrip("/")
        (pid,) = await agent_pids(live, session["id"])
        chat.close()
        return session, pid

    async def second_life(live: LiveServer, session: dict[str, Any], pid: str) -> None:
        chat = await ChatClient.open(ws_fetch(live), "r.chat")
        bodies = await chat.ask(
            "after the restart",
            lambda b: b if agent_lines(b).get("info") and "turn two" in "".join(b) else None,
        )
        assert "turn two of the same session" in "".join(bodies)
        again = await agent_session(live)
        assert again["id"] == session["id"]
        assert await agent_pids(live, session["id"]) == [pid]  # the same process, attached to, not restarted
        assert chat.metadata.get("tai_sandbox_sessions", {PERSONA_ID: session["id"]}) == {
            PERSONA_ID: session["id"]
        }
        chat.close()

    live = start(tmp_path)
    session_id = None
    try:
        session, pid = asyncio.run(first_life(live))
        session_id = session["id"]
        live.stop()
        assert "agent detached, running on in its session" in live.log_path.read_text(), live.log()
        live = start(tmp_path)
        asyncio.run(second_life(live, session, pid))
    except BaseException:
        for log in sorted(tmp_path.glob("server-*.log")):
            print(f"==== {log.name}\n{log.read_text(errors='replace')[-20000:]}")
        raise
    finally:
        if session_id is not None and live.process is not None and live.process.poll() is None:
            with contextlib.suppress(Exception):
                live.call("DELETE", f"sessions/{session_id}")
        live.stop()
