"""A sandboxed coding agent in a real browser (issue 53's browser test): in JupyterLab with jupyterlab-chat
and jupyter-ai's persona manager, a chat message to the sandboxed persona gets the agent's answer, the
Sandbox panel lists the persona's session as the coding agent's, and destroying it there ends the agent (the
chat says so).

The server is a live ``jupyter lab`` with the docker provider and one persona in SandboxAgents.personas
(helper P's test persona: the tests' scripted ACP agent, tests/support/acp_test_agent.py, from source in the
agents image). The persona picker under the chat's input is jupyter-ai's persona manager labextension's
(``@jupyter-ai/persona-manager``, installed with ``jupyter_ai_persona_manager``; no jupyter-ai metapackage).
Screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import pytest

from jupyter_tai_sandbox.images import AGENTS_IMAGE
from tests.agents.test_agent_persona import KEY, persona
from tests.support.docker import client, nothing_left, server_args
from tests.support.lab import BROWSER_MARKS, Lab, LabProcess, load_lab, open_panel_tab, shot

__all__ = ["client", "nothing_left"]

pytestmark = [*BROWSER_MARKS, pytest.mark.docker, pytest.mark.slow(60)]

NAME = "Test agent"
CONSUMER = f"agent:{KEY}"
#: every prompt: the agent says hello and echoes the prompt (one JSON line)
SCRIPT = {"turns": [[{"do": "reply", "text": "Hello from the sandboxed agent.\n"}, {"do": "echo"}]]}
ANSWER_MS = 180_000


def agent_sessions(lab: Lab) -> list[dict[str, Any]]:
    code, body = lab.api("GET", "sessions")
    assert code == 200, body
    return [s for s in body["sessions"] if s["consumer"] == CONSUMER]


@contextlib.contextmanager
def agent_sessions_destroyed(lab: Lab):
    """At the end, the persona's sessions are destroyed (an agent outlives the server's stop on purpose)."""
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            for session in agent_sessions(lab):
                lab.api("DELETE", f"sessions/{session['id']}")


@pytest.mark.usefixtures("nothing_left")
def test_a_chat_message_to_the_sandboxed_persona_is_answered_and_the_panel_lists_its_session(
    lab_process: LabProcess, page: Any, client: Any
) -> None:
    from playwright.sync_api import expect

    try:
        client.images.get(AGENTS_IMAGE)
    except Exception:  # docker.errors.ImageNotFound
        message = f"{AGENTS_IMAGE} is missing: build it with `jupyter tai-sandbox build-image --agents`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    config = {
        "SandboxAgents": {
            "personas": {
                KEY: persona("chat", name=NAME, secrets=[], env={"ACP_TEST_AGENT_SCRIPT": json.dumps(SCRIPT)})
            },
            "start_timeout_seconds": 180,
        }
    }
    (lab_process.base / "config" / "jupyter_server_config.json").write_text(json.dumps(config))
    (lab_process.base / "notebooks" / "agent.chat").write_text("")
    lab = lab_process.start(
        "docker",
        *server_args()[1:],  # the test image, this run's label (start names the provider)
        f"--DockerSandbox.deployment={os.environ['TAI_SANDBOX_DEPLOYMENT']}-panel-agents",
        isolation="container",
    )
    with agent_sessions_destroyed(lab):
        load_lab(page, f"{lab.url}/lab/tree/agent.chat?token={lab.token}")
        chat = page.locator(".jp-chat-input-container")
        expect(chat).to_be_visible(timeout=60_000)

        # the persona picker (jupyter-ai's persona manager labextension) offers the sandboxed persona
        picker = chat.locator(".jp-jai-personaControls-persona-btn")
        expect(picker).to_be_visible(timeout=60_000)
        if (picker.locator(".jp-jai-personaControls-persona").inner_text()).strip() != NAME:
            picker.click()
            page.get_by_role("menuitem", name=NAME).click()
        expect(picker.locator(".jp-jai-personaControls-persona")).to_have_text(NAME)

        box = chat.locator("textarea:not([aria-hidden])")
        box.click()
        page.keyboard.type("hello from the browser")
        page.keyboard.press("Enter")

        # the answer: the agent's words (its reply, then the prompt echoed), written in the chat by the persona
        answer = page.locator(".jp-chat-rendered-message", has_text="Hello from the sandboxed agent.")
        expect(answer.first).to_be_visible(timeout=ANSWER_MS)
        expect(answer.first).to_contain_text('"step": "echo"', timeout=30_000)
        expect(answer.first).to_contain_text("hello from the browser")
        expect(page.get_by_text(NAME, exact=True).first).to_be_visible()
        shot(page, "agent-chat-answer")

        # the agent ran in the user's docker session of consumer agent:<key>
        (session,) = agent_sessions(lab)
        assert session["kind"] == "docker" and session["image"] == AGENTS_IMAGE, session

        # the Sandbox panel lists it as the coding agent's
        panel = open_panel_tab(page)
        row = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{session["id"]}"]')
        expect(row).to_be_visible(timeout=30_000)
        # its key on the line, with the "agent" badge; the hover text names it the coding agent's
        expect(row.locator(".jp-TaiSandbox-sessionLabel")).to_have_text(KEY)
        title = row.locator(".jp-TaiSandbox-sessionRow").get_attribute("title") or ""
        assert title.startswith(f"Coding agent: {KEY} ({session['id']})"), title
        expect(row.locator(".jp-TaiSandbox-agentBadge")).to_be_visible()
        assert row.get_attribute("data-agent") == KEY
        shot(page, "agent-panel-session")

        # the session's row holds the consumer label in its details
        row.locator(".jp-TaiSandbox-sessionRow").click()
        expect(row.locator('.jp-TaiSandbox-field[data-field="consumer"]')).to_have_text(
            f"consumer: {CONSUMER}"
        )

        # Destroy from the panel: the agent ends with its session, and the chat says so
        row.locator(".jp-TaiSandbox-sessionRow .jp-TaiSandbox-destroy").click()
        confirm = page.locator(".jp-Dialog")
        expect(confirm).to_contain_text(session["id"])
        confirm.locator(".jp-Dialog-button.jp-mod-accept").click()
        expect(row).to_have_count(0)
        said = page.locator(
            ".jp-chat-rendered-message", has_text=f"Its sandbox session {session['id']} was destroyed"
        )
        expect(said.first).to_be_visible(timeout=60_000)
        assert lab.api("GET", f"sessions/{session['id']}")[0] == 404
        shot(page, "agent-session-destroyed")
