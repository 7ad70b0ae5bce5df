"""Issue 24.1 in a real browser: a notebook a session writes runs no script when opened from the drive.

A command in a local session writes ``evil.ipynb`` whose cells all carry
``metadata.trusted: true`` (and a ``metadata.signature``), with outputs that would
each run script in the Jupyter origin: an HTML output with an inline ``<script>``
and an ``<img onerror>``, an ``application/javascript`` output, an SVG output with
``onload`` and a ``<script>``, and a Markdown cell with an ``<img onerror>``. Each
would set ``window.__pwned_<tag>`` and PUT ``pwned-<tag>.txt`` into the server's
root through the contents API. Opened from the Sandbox drive, JupyterLab shows the
notebook untrusted: no marker is set and no file lands on the host; saving it from
the drive writes no ``trusted`` back. The control at the end runs the same payload
from the page and sees its marker and its file, so the detector would have seen one.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from tests.support.lab import BROWSER_MARKS, LabProcess, new_session, open_panel, read_file, shot

pytestmark = BROWSER_MARKS

TAGS = ("html_script", "html_onerror", "javascript", "svg_onload", "svg_script", "markdown")

# sets a marker on the top window and writes a file on the host through the contents API,
# as the user (the page's cookie and XSRF token); single quotes only, to sit in an attribute
PAYLOAD = (
    "(function (tag) {"
    " window.top['__pwned_' + tag] = 1;"
    " var m = document.cookie.match(/(?:^|; )_xsrf=([^;]*)/);"
    " fetch(window.top.location.origin + '/api/contents/pwned-' + tag + '.txt', {"
    "  method: 'PUT', credentials: 'same-origin',"
    "  headers: {'Content-Type': 'application/json', 'X-XSRFToken': m ? decodeURIComponent(m[1]) : ''},"
    "  body: JSON.stringify({type: 'file', format: 'text', content: tag})"
    " });"
    "})"
)


def run(tag: str) -> str:
    return f"{PAYLOAD}('{tag}')"


def planted_notebook() -> dict[str, Any]:
    html = (
        '<div class="planted-html">planted html output</div>'
        f"<script>{run('html_script')}</script>"
        f'<img src="missing-planted.png" onerror="{run("html_onerror")}">'
    )
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" '
        f'onload="{run("svg_onload")}"><script>{run("svg_script")}</script>'
        '<rect width="40" height="40" fill="teal"/></svg>'
    )
    outputs = [
        {"output_type": "display_data", "metadata": {}, "data": {"text/html": html, "text/plain": "html"}},
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"application/javascript": run("javascript"), "text/plain": "planted js fallback"},
        },
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"image/svg+xml": svg, "text/plain": "planted svg fallback"},
        },
    ]
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 1,
                "id": "planted",
                "metadata": {"trusted": True},
                "outputs": outputs,
                "source": "print('planted by the session')",
            },
            {
                "cell_type": "markdown",
                "id": "planted-md",
                "metadata": {"trusted": True},
                "source": f'planted markdown <img src="missing-md.png" onerror="{run("markdown")}">',
            },
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "signature": "sha256:" + "0" * 64,
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def markers(page: Any) -> list[str]:
    return page.evaluate("tags => tags.filter(tag => ('__pwned_' + tag) in window)", [*TAGS, "control"])


def planted_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("pwned-*"))


def test_drive_notebook_marked_trusted_runs_no_script_and_saves_no_trust(
    lab_process: LabProcess, page: Any
) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    root = lab_process.base / "notebooks"
    session_id = new_session(lab)
    # the session itself writes the notebook (a command in it, not an upload by the user)
    encoded = base64.b64encode(json.dumps(planted_notebook()).encode()).decode()
    code, result = lab.api(
        "POST",
        f"sessions/{session_id}/exec",
        {"argv": ["sh", "-c", f"echo {encoded} | base64 -d > evil.ipynb"], "timeout_seconds": 10},
    )
    assert code == 200 and result["exit_code"] == 0, result
    assert json.loads(read_file(lab, session_id, "evil.ipynb"))["cells"][0]["metadata"] == {"trusted": True}

    open_panel(page, lab)
    page.evaluate("id => window.jupyterapp.commands.execute('tai-sandbox:browse-drive', {id})", session_id)
    drive = page.locator("#tai-sandbox-filebrowser")
    drive.locator(".jp-DirListing-item", has_text="evil.ipynb").dblclick()
    notebook = page.locator(".jp-NotebookPanel")
    outputs = notebook.locator(".jp-CodeCell .jp-OutputArea-output")
    expect(outputs).to_have_count(3, timeout=60_000)
    expect(outputs.nth(0)).to_contain_text("planted html output")  # the HTML rendered, sanitized
    expect(notebook.locator(".jp-MarkdownCell")).to_contain_text("planted markdown")

    # time for anything that would run: nothing did, in the page or on the host
    time.sleep(3)
    assert markers(page) == [], f"sandbox-written outputs ran script in the page: {markers(page)}"
    assert planted_files(root) == [], (
        f"sandbox-written outputs wrote files on the host: {planted_files(root)}"
    )
    shot(page, "drive-notebook-untrusted")

    # JupyterLab holds every cell untrusted (the status bar's "not trusted")
    trust = page.evaluate(
        """() => {
            const model = window.jupyterapp.shell.currentWidget.content.model;
            return Array.from(model.cells).map(cell => cell.trusted);
        }"""
    )
    assert trust == [False, False], trust

    # saved from the drive: no trust written back, not even for a cell JupyterLab adds as trusted
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:insert-cell-below')")
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + 20
    while True:
        raw = read_file(lab, session_id, "evil.ipynb")
        saved = json.loads(raw)
        if len(saved["cells"]) == 3:
            break
        assert time.monotonic() < deadline, raw[:2000]
        time.sleep(0.3)
    assert [cell.get("metadata", {}).get("trusted") for cell in saved["cells"]] == [None, None, None], saved
    assert b'"trusted"' not in raw and "signature" not in saved["metadata"], raw[:2000]
    assert saved["cells"][0]["outputs"][1]["data"]["application/javascript"] == run("javascript")
    assert markers(page) == [] and planted_files(root) == []

    # control: the same payload run in the page sets its marker and writes its file
    page.evaluate(f"() => {run('control')}")
    deadline = time.monotonic() + 20
    while planted_files(root) != ["pwned-control.txt"]:
        assert time.monotonic() < deadline, (planted_files(root), lab_process.log_tail())
        time.sleep(0.2)
    assert markers(page) == ["control"]
