"""Issue 14.1 in a real browser: what a sandbox writes under outputs/ never runs in the user's page.

A notebook in a live lab runs a ``%%sandbox`` cell (local provider) that writes
``outputs/evil.html`` (a ``<script>``, an ``onerror``, a remote image) and
``outputs/evil.svg`` (an ``onload``, a ``<script>``, a remote image). Each would set
a global in the page and fetch a URL of a small recording server. The cell shows
them, inert: the HTML in an ``<iframe sandbox="">``, the SVG as an ``<img>``; no
global is set (in the page or in the frame) and the recording server sees nothing
but the test's own control request (which proves a script's fetch would reach it).
"""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import browser_network
from tests.support.lab import BROWSER_MARKS, LabProcess, load_lab, shot

pytestmark = BROWSER_MARKS

GLOBALS = ("__evil_html", "__evil_html_onerror", "__evil_svg", "__evil_svg_script")


class Recorder(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.hits: list[str] = []
        super().__init__(("127.0.0.1", 0), _RecordingHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    server: Recorder

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"recorded")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder(browser: Any) -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser_network.forward(
        server.server_address[1]
    )  # the browser's way to it (after the browser: its namespace)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def evil_cell(url: str) -> str:
    html = (
        '<h1 id="evil">written in the sandbox</h1>\n'
        "<script>window.__evil_html = 1; try { parent.__evil_html = 1; top.__evil_html = 1; } catch (e) {}\n"
        f"fetch('{url}/html-script').catch(function () {{}});</script>\n"
        f'<img src="{url}/html-img" onerror="top.__evil_html_onerror = 1; fetch(\'{url}/html-onerror\')">\n'
    )
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40" '
        f"onload=\"top.__evil_svg = 1; fetch('{url}/svg-onload')\">"
        f"<script>top.__evil_svg_script = 1; fetch('{url}/svg-script');</script>"
        f'<image href="{url}/svg-image" width="10" height="10"/>'
        '<rect width="40" height="40" fill="teal"/></svg>\n'
    )
    return (
        "%%sandbox\n"
        "mkdir -p outputs\n"
        f"cat > outputs/evil.html <<'EOF'\n{html}EOF\n"
        f"cat > outputs/evil.svg <<'EOF'\n{svg}EOF\n"
        "echo written"
    )


def notebook(cells: list[str]) -> dict[str, Any]:
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"c{i}",
                "metadata": {},
                "outputs": [],
                "source": s,
            }
            for i, s in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_sandbox_outputs_run_no_script_in_the_page(
    lab_process: LabProcess, page: Any, recorder: Recorder
) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    (lab_process.base / "notebooks" / "evil.ipynb").write_text(
        json.dumps(
            notebook(
                [
                    "%load_ext jupyter_tai_sandbox",
                    evil_cell(recorder.url),
                    # the opt-in, run last as the detector's own check: trusted HTML does run its script
                    "%%sandbox --trusted-outputs\nsleep 1; touch outputs/evil.html; echo trusted",
                ]
            )
        )
    )
    load_lab(page, f"{lab.url}/lab/tree/evil.ipynb?token={lab.token}")
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return kernel && kernel.status === 'idle';
        }""",
        timeout=90_000,
    )
    # the first two cells: load the magics, write the files
    page.locator(".jp-NotebookPanel .jp-CodeCell").first.click()
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-cell-and-select-next')")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-cell-and-select-next')")

    cell = page.locator(".jp-NotebookPanel .jp-CodeCell").nth(1)
    expect(cell.locator(".jp-OutputArea")).to_contain_text("written", timeout=90_000)
    frame = cell.locator('.jp-OutputArea-output iframe[title="outputs/evil.html"]')
    image = cell.locator('.jp-OutputArea-output img[src^="data:image/svg+xml"]')
    expect(frame).to_have_count(1, timeout=60_000)
    expect(image).to_have_count(1)
    assert frame.get_attribute("sandbox") == "", "the frame must have an empty sandbox (no allow-scripts)"
    assert "<script>" in (frame.get_attribute("srcdoc") or ""), "the script is shown inert, not stripped"
    content = frame.content_frame
    expect(content.locator("#evil")).to_have_text("written in the sandbox")  # the HTML did render
    expect(image).to_have_js_property("complete", True)
    assert image.evaluate("img => img.naturalWidth") == 40  # the SVG did render

    # time for anything that would run; then nothing ran, in the page or in the frame
    time.sleep(3)
    in_page = page.evaluate(f"() => {json.dumps(GLOBALS)}.filter(name => name in window)")
    framed = frame.element_handle().content_frame()
    assert framed is not None
    in_frame = framed.evaluate(f"() => {json.dumps(GLOBALS)}.filter(name => name in window)")
    assert in_page == [] and in_frame == [], (in_page, in_frame)
    assert recorder.hits == [], f"sandbox-written content reached the network: {recorder.hits}"
    shot(page, "outputs-inert")

    # control: a script running in the page does reach the recorder
    page.evaluate("url => fetch(url + '/control').then(r => r.text())", recorder.url)
    assert recorder.hits == ["/control"], recorder.hits

    # and the detector works: --trusted-outputs publishes the HTML as is, and its script runs
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-cell-and-select-next')")
    trusted = page.locator(".jp-NotebookPanel .jp-CodeCell").nth(2)
    expect(trusted.locator(".jp-OutputArea")).to_contain_text("written in the sandbox", timeout=60_000)
    page.wait_for_function("() => window.__evil_html === 1", timeout=10_000)
    deadline = time.monotonic() + 10
    while "/html-script" not in recorder.hits and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "/html-script" in recorder.hits, recorder.hits
