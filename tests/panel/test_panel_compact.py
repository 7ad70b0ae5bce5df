"""Issue 48: the panel's session list is compact like JupyterLab's Running panel (one line per session,
details and the rarer actions on expand, Terminal / Files / Destroy on hover), Pause and Fork are offered
only where GET status says the provider can, and a session the %sandbox magics made shows by its name and
notebook. A live ``jupyter lab`` on the local provider, driven in chromium at 1440x900; screenshots in
``tests/artifacts/``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.lab import (
    BROWSER_MARKS,
    Lab,
    LabProcess,
    open_panel,
    open_terminal,
    shot,
    type_line,
    wait_for_notification,
    wait_for_text,
)
from tests.support.live_server import wait_for_connection_file

pytestmark = [*BROWSER_MARKS, pytest.mark.slow(60)]

VIEWPORT = {"width": 1440, "height": 900}


def _rows_fit(panel: Any) -> list[dict[str, float]]:
    """The rows' boxes, after checking that each is one line inside the sidebar's visible part, unscrolled."""
    body = panel.locator(".jp-TaiSandbox-body")
    assert body.evaluate("n => n.scrollTop") == 0
    frame = body.bounding_box()
    assert frame is not None
    bottom = min(frame["y"] + frame["height"], VIEWPORT["height"])
    boxes = []
    for row in panel.locator(".jp-TaiSandbox-sessionRow").all():
        box = row.bounding_box()
        assert box is not None
        assert box["height"] <= 30, box  # one line, as the Running panel's rows
        assert frame["y"] <= box["y"] and box["y"] + box["height"] <= bottom, (box, frame)
        assert frame["x"] <= box["x"] and box["x"] + box["width"] <= frame["x"] + frame["width"] + 1, (
            box,
            frame,
        )
        boxes.append(box)
    return boxes


def test_eight_sessions_show_one_line_each_in_the_sidebar_at_1440x900_without_pause_or_fork_on_local(
    lab_process: LabProcess, page: Any
) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    code, status = lab.api("GET", "status")
    assert code == 200 and status["pausable"] is False and status["forkable"] is False, status
    made = []
    for i in range(8):
        spec: dict[str, Any] = {"ttl_seconds": 900 + 60 * i}
        if i % 3 == 0:
            spec.update(durability="persistent", workspace_key=f"compact-{i}")
        code, info = lab.api("POST", "sessions", spec)
        assert code == 201, info
        made.append(info["id"])

    page.set_viewport_size(VIEWPORT)
    panel = open_panel(page, lab)
    rows = panel.locator(".jp-TaiSandbox-session")
    expect(rows).to_have_count(8)
    for session_id in made:
        row = panel.locator(
            f'.jp-TaiSandbox-session[data-session-id="{session_id}"] .jp-TaiSandbox-sessionRow'
        )
        expect(row).to_be_visible()
        expect(row.locator(".jp-TaiSandbox-sessionLabel")).to_have_text(session_id)
        expect(row.locator(".jp-TaiSandbox-sessionMeta")).to_have_text(re.compile(r"^local · \d\dm \d\ds$"))
    boxes = _rows_fit(panel)
    assert len(boxes) == 8
    # the eight rows together take less than a third of the sidebar's height
    assert boxes[-1]["y"] + boxes[-1]["height"] - boxes[0]["y"] < VIEWPORT["height"] / 3, boxes
    shot(page, "panel-compact-8-sessions")

    # hover: Terminal / Files / Destroy show over the row's end; the details stay folded
    first = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{made[-1]}"]')
    first.locator(".jp-TaiSandbox-sessionRow").hover()
    terminal = first.locator(".jp-TaiSandbox-openTerminal")
    expect(terminal).to_have_css("opacity", "1")
    expect(terminal).to_have_attribute("aria-label", "Open a terminal in this session")
    expect(first.locator(".jp-TaiSandbox-sessionBody")).to_be_hidden()
    shot(page, "panel-compact-hover")

    # a click opens the details: the id, the fields, +30 min; no Pause and no Fork on local
    first.locator(".jp-TaiSandbox-sessionLabel").click()
    body = first.locator(".jp-TaiSandbox-sessionBody")
    expect(body).to_be_visible()
    expect(first.locator(".jp-TaiSandbox-sessionRow")).to_have_attribute("aria-expanded", "true")
    expect(body.locator(".jp-TaiSandbox-sessionId")).to_have_text(made[-1])
    expect(body.locator(".jp-TaiSandbox-timeLeft")).to_contain_text("reaped in")
    expect(body.locator(".jp-TaiSandbox-extend")).to_be_visible()
    expect(body.locator(".jp-TaiSandbox-pause")).to_be_hidden()
    expect(body.locator(".jp-TaiSandbox-fork")).to_be_hidden()
    expect(body.locator("button:visible")).to_have_text(["+30 min", "Extend by…", "Save transcript"])
    # nor in the command palette (the commands hide while the provider cannot)
    hidden = page.evaluate(
        "() => ['tai-sandbox:pause', 'tai-sandbox:resume', 'tai-sandbox:fork']"
        ".map(id => window.jupyterapp.commands.isVisible(id))"
    )
    assert hidden == [False, False, False], hidden
    shot(page, "panel-compact-expanded-local")

    # "Extend by…" takes a duration with units: a bad one is refused saying what to type, 1h30m is added
    before = lab.api("GET", f"sessions/{made[-1]}")[1]
    body.locator(".jp-TaiSandbox-extendBy").click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator("input").fill("soon")
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    wait_for_notification(
        page, 'The extension must be seconds (90) or with units: 90s, 10m, 1h, 1h30m, 2d; "soon"'
    )
    dialog = page.locator(".jp-Dialog")
    dialog.locator("input").fill("1h30m")
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    expect(body.locator(".jp-TaiSandbox-timeLeft")).to_contain_text("reaped in 1h 5")
    after = lab.api("GET", f"sessions/{made[-1]}")[1]
    assert round(after["expires_at"] - before["expires_at"]) == 5400, (before, after)
    # still one line for every other session, all eight in view
    for session_id in made[:-1]:
        expect(
            panel.locator(
                f'.jp-TaiSandbox-session[data-session-id="{session_id}"] .jp-TaiSandbox-sessionBody'
            )
        ).to_be_hidden()
    expect(panel.locator(".jp-TaiSandbox-sessionRow")).to_have_count(8)
    for row in panel.locator(".jp-TaiSandbox-sessionRow").all():
        expect(row).to_be_in_viewport()

    # issue 55: "Save transcript" saves the session's commands as a notebook in Jupyter's root and opens it
    code, ran = lab.api(
        "POST",
        f"sessions/{made[-1]}/exec",
        {"argv": ["sh", "-c", "echo hello transcript"], "timeout_seconds": 30},
    )
    assert code == 200 and ran["exit_code"] == 0, ran
    body.locator(".jp-TaiSandbox-saveTranscript").click()
    name = f"{made[-1]}-transcript.ipynb"
    wait_for_notification(page, f"The transcript of sandbox session {made[-1]} is saved as {name}")
    saved = json.loads((lab_process.base / "notebooks" / name).read_text())
    assert ["".join(c["source"]) for c in saved["cells"][1:]] == ["echo hello transcript"], saved["cells"]
    assert "signature" not in json.dumps(saved["metadata"])
    notebook = page.locator(".jp-NotebookPanel:visible")
    expect(
        page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
    ).to_have_text(name)
    expect(notebook.locator(".jp-OutputArea-output").first).to_contain_text("hello transcript")
    expect(notebook.locator(".jp-MarkdownOutput").first).to_contain_text(f"Sandbox session {made[-1]}")
    shot(page, "panel-transcript-saved")


def _jupyter_api(lab: Lab, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"{lab.url}/api/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def test_a_magics_session_lists_and_shows_by_its_name_and_notebook(
    lab_process: LabProcess, page: Any
) -> None:
    from jupyter_client import BlockingKernelClient
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    notebook = "work/analysis one.ipynb"
    (lab_process.base / "notebooks" / "work").mkdir()
    # a kernel started for a notebook, as JupyterLab starts one (jupyter_server names the notebook to it)
    started = _jupyter_api(lab, "POST", "sessions", {
        "path": notebook, "type": "notebook", "name": "analysis one.ipynb", "kernel": {"name": "python3"},
    })  # fmt: skip
    kernel_id = started["kernel"]["id"]
    client = BlockingKernelClient()
    client.load_connection_file(
        str(wait_for_connection_file(Path(lab_process.base / "runtime"), kernel_id, 60))
    )
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        for cell in ("%load_ext jupyter_tai_sandbox", "%sandbox new train"):
            reply = client.execute_interactive(cell, timeout=120)
            assert reply["content"]["status"] == "ok", (cell, reply["content"])
        code, listing = lab.api("GET", "sessions")
        assert code == 200
        [session] = listing["sessions"]
        # over REST: its name and notebook ride in its consumer label, under the caller's own
        code, status = lab.api("GET", "status")
        # (the notebook as jupyter_server names it to the kernel: its absolute path)
        absolute = str(lab_process.base / "notebooks" / notebook)
        quoted = urllib.parse.quote(absolute, safe="")
        assert session["consumer"] == f"{status['consumer']}/magics:train@{quoted}", session

        page.set_viewport_size(VIEWPORT)
        panel = open_panel(page, lab)
        item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{session["id"]}"]')
        expect(item.locator(".jp-TaiSandbox-sessionLabel")).to_have_text("train")
        sub = item.locator(".jp-TaiSandbox-sessionSub")
        expect(sub).to_have_text("analysis one.ipynb")
        expect(sub).to_have_attribute("title", notebook)  # the path under the server's root
        expect(item.locator(".jp-TaiSandbox-magicsBadge")).to_have_text("%sandbox")
        expect(item.locator(".jp-TaiSandbox-sessionRow")).to_have_attribute(
            "title", re.compile(session["id"])
        )
        shot(page, "panel-magics-session-named")
        item.locator(".jp-TaiSandbox-sessionLabel").click()
        expect(item.locator('.jp-TaiSandbox-field[data-field="%sandbox name"]')).to_have_text(
            "%sandbox name: train"
        )
        expect(item.locator('.jp-TaiSandbox-field[data-field="notebook"]')).to_have_text(
            f"notebook: {notebook}"
        )
        shot(page, "panel-magics-session-details")

        # its Terminal opens, though it lives the magics' 8 h, past the operator's longest command
        assert session["expires_at"] - time.time() > status["policy"]["max_timeout_seconds"], (
            session,
            status,
        )
        terminal = open_terminal(page, session["id"])
        expect(terminal).to_have_attribute("data-phase", "running")
        type_line(page, terminal, "echo magics-terminal-$((6*7))")
        wait_for_text(terminal, "magics-terminal-42")
        shot(page, "panel-magics-session-terminal")
    finally:
        client.stop_channels()
        _jupyter_api(lab, "DELETE", f"sessions/{started['id']}")
