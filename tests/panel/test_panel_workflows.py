"""The panel's workflows of issue 18 in a real browser (chromium, Playwright) against a live lab:
a terminal tab that survives a page reload (attach again, repaint from the ring, then live),
the Sandbox drive in its own file browser (open, edit and save a text file and a notebook,
read back through REST; what commands write shows on refresh), the dark theme.

Fixtures and helpers are in tests/support/lab.py; screenshots go to tests/artifacts/.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

import pytest

from tests.support.lab import (
    BROWSER_MARKS,
    Lab,
    LabProcess,
    load_lab,
    new_session,
    open_panel,
    open_panel_tab,
    read_file,
    shot,
    terminal_text,
    type_in_editor,
    type_line,
    wait_for_text,
)

pytestmark = [*BROWSER_MARKS, pytest.mark.slow(72)]


def screen_lines(terminal: Any) -> list[str]:
    return [line.replace("\xa0", " ").strip() for line in terminal_text(terminal).splitlines()]


def wait_for_line(terminal: Any, line: str, timeout: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = screen_lines(terminal)
        if line in lines:
            return lines
        time.sleep(0.2)
    raise AssertionError(f"no line {line!r} on the terminal screen; it shows:\n" + "\n".join(lines))


def numbers(lines: list[str]) -> list[int]:
    return [int(line) for line in lines if re.fullmatch(r"\d{1,3}", line)]


def put_file(lab: Lab, session_id: str, path: str, data: bytes) -> None:
    request = urllib.request.Request(
        f"{lab.url}/api/sandbox/sessions/{session_id}/files/{path}",
        data=data,
        method="PUT",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/octet-stream"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201


def test_terminal_tab_survives_a_page_reload(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    session_id = new_session(lab)
    panel = open_panel(page, lab)
    panel.locator(
        f'.jp-TaiSandbox-session[data-session-id="{session_id}"] .jp-TaiSandbox-openTerminal'
    ).click()
    terminal = page.locator(f'.jp-TaiSandbox-terminal[data-session-id="{session_id}"]')
    expect(terminal).to_have_attribute("data-phase", "running")
    exec_id = terminal.get_attribute("data-exec-id")
    assert exec_id and exec_id.startswith("exe-")

    type_line(page, terminal, "for i in $(seq 100); do echo $i; sleep 0.2; done; echo count-done")
    wait_for_line(terminal, "10")
    code, listed = lab.api("GET", f"sessions/{session_id}/execs")
    assert code == 200 and exec_id in [e["id"] for e in listed["execs"]], listed
    page.wait_for_timeout(1500)  # the workspace (the layout and the tab's exec id) is saved, debounced
    before = max(numbers(screen_lines(terminal)))
    assert before < 60, f"the count is at {before} already"

    load_lab(page)
    restored = page.locator(f'.jp-TaiSandbox-terminal[data-exec-id="{exec_id}"]')
    expect(restored).to_have_count(1, timeout=60_000)
    expect(restored).to_have_attribute("data-phase", "running")
    expect(restored.locator(".jp-TaiSandbox-terminalState")).to_contain_text("Reattached")
    # repainted from the ring at once: the count reached before the reload is on screen again
    repainted = numbers(wait_for_line(restored, str(before), timeout=10))
    assert repainted == list(range(repainted[0], repainted[-1] + 1)), repainted
    # then it goes on live, to the end, nothing skipped or repeated
    lines = wait_for_line(restored, "count-done", timeout=40)
    seen = numbers(lines)
    assert seen and seen[-1] == 100, lines
    assert seen == list(range(seen[0], 101)), f"the count skipped or repeated: {seen}"
    shot(page, "terminal-restored")

    # the restored tab is the same shell: it takes input
    type_line(page, restored, "echo still-$((20+1))")
    wait_for_text(restored, "still-21")

    # a command that is gone (killed here): the restored tab says so instead of a blank screen
    type_line(page, restored, "exit 0")
    wait_for_text(restored, "exited with status 0")
    expect(restored.locator(".jp-TaiSandbox-terminalState")).to_contain_text("has ended")
    load_lab(page)
    gone = page.locator(f'.jp-TaiSandbox-terminal[data-exec-id="{exec_id}"]')
    expect(gone).to_have_attribute("data-phase", "gone", timeout=60_000)
    state = gone.locator(".jp-TaiSandbox-terminalState")
    expect(state).to_contain_text("has ended or is gone (404)")
    shot(page, "terminal-gone")
    # and it can start a new shell in the same tab
    state.locator("button").click()
    fresh = page.locator(f'.jp-TaiSandbox-terminal[data-session-id="{session_id}"][data-phase="running"]')
    expect(fresh).to_have_count(1)
    type_line(page, fresh, "echo fresh-$((40+2))")
    wait_for_text(fresh, "fresh-42")


NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "first",
            "metadata": {},
            "outputs": [],
            "source": "print('from the sandbox drive')",
        }
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def test_sandbox_drive_open_edit_save(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    session_id = new_session(lab)
    put_file(lab, session_id, "notes/todo.txt", b"first line\n")
    put_file(lab, session_id, "book.ipynb", json.dumps(NOTEBOOK).encode())

    open_panel(page, lab)
    page.locator('.lm-TabBar-tab[data-id="tai-sandbox-filebrowser"]').click()
    drive = page.locator("#tai-sandbox-filebrowser")
    expect(drive).to_be_visible()
    item = drive.locator(".jp-DirListing-item", has_text=session_id)
    expect(item).to_have_count(1)
    item.dblclick()
    expect(drive.locator(".jp-BreadCrumbs")).to_contain_text(session_id)
    drive.locator(".jp-DirListing-item", has_text="notes").dblclick()
    drive.locator(".jp-DirListing-item", has_text="todo.txt").dblclick()

    # a text file in JupyterLab's editor: edit, save, read back through REST
    editor = page.locator(".jp-FileEditor .cm-content")
    expect(editor).to_contain_text("first line")
    type_in_editor(page, editor, "added in the browser")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 20
    while read_file(lab, session_id, "notes/todo.txt") != b"first line\nadded in the browser":
        assert time.monotonic() < deadline, read_file(lab, session_id, "notes/todo.txt")
        time.sleep(0.3)
    expect(page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")).not_to_have_class(
        re.compile("jp-mod-dirty")
    )
    shot(page, "drive-text-saved")

    # a notebook: opens in the notebook editor, a cell edited and saved as notebook JSON
    # back to the session folder, through the palette command "Show Sandbox Files"
    page.evaluate("id => window.jupyterapp.commands.execute('tai-sandbox:browse-drive', {id})", session_id)
    drive.locator(".jp-DirListing-item", has_text="book.ipynb").dblclick()
    cell = page.locator(".jp-NotebookPanel .jp-Cell").first
    expect(cell).to_contain_text("from the sandbox drive")
    type_in_editor(page, cell.locator(".cm-content"), "  # edited")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 20
    while True:
        saved = json.loads(read_file(lab, session_id, "book.ipynb"))
        source = "".join(saved["cells"][0]["source"])
        if source.endswith("# edited"):
            break
        assert time.monotonic() < deadline, source
        time.sleep(0.3)
    assert saved["nbformat"] == 4

    # what a command writes in the session shows on refresh
    code, result = lab.api(
        "POST",
        f"sessions/{session_id}/exec",
        {"argv": ["sh", "-c", "echo made > by-command.txt"], "timeout_seconds": 10},
    )
    assert code == 200 and result["exit_code"] == 0, result
    drive.locator(".jp-TaiSandbox-driveRefresh").click()
    expect(drive.locator(".jp-DirListing-item", has_text="by-command.txt")).to_have_count(1)

    # a new folder from the drive's toolbar is a folder in the workspace
    drive.locator(".jp-TaiSandbox-driveNewFolder").click()
    name_editor = drive.locator(".jp-DirListing-editor")
    expect(name_editor).to_be_visible()
    name_editor.press("Enter")  # keep the name it was given
    expect(drive.locator(".jp-DirListing-item", has_text="Untitled Folder")).to_have_count(1)
    code, listing = lab.api("GET", f"sessions/{session_id}/files/")
    assert {"name": "Untitled Folder", "type": "directory"}.items() <= next(
        e for e in listing["entries"] if e["name"] == "Untitled Folder"
    ).items(), listing
    shot(page, "drive")

    # the dark theme, at 1400x900: the drive, then the panel
    page.evaluate(
        "() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})"
    )
    expect(page.locator("body")).to_have_attribute("data-jp-theme-light", "false", timeout=30_000)
    page.wait_for_timeout(500)
    shot(page, "drive-dark")
    panel = open_panel_tab(page)
    expect(panel.locator(".jp-TaiSandbox-session")).to_have_count(1)
    shot(page, "panel-dark")

    # keyboard: the New session button takes the focus and Enter opens its dialog
    panel.locator(".jp-TaiSandbox-new").focus()
    page.keyboard.press("Enter")
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible()
    shot(page, "new-session-dialog-dark")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    for action in ("openTerminal", "openFiles", "destroy"):
        button = panel.locator(f".jp-TaiSandbox-{action}")
        button.focus()
        assert button.evaluate("b => document.activeElement === b"), action
