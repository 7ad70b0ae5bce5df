"""The JupyterLab panel in a real browser: a live ``jupyter lab`` with the extension,
driven through Debian's chromium by Playwright (no browser downloads).

Outside CI the test skips, saying what to install, when chromium, Playwright or the
built labextension is missing; with ``CI=true`` it fails instead.
Screenshots land in ``tests/artifacts/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("TAI_SANDBOX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).parent / "artifacts"
LABEXTENSION = "jupyter-tai-sandbox"
START_SECONDS = 90
UI_TIMEOUT_MS = 30_000

pytestmark = pytest.mark.timeout(600)


def _labextension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(
        (Path(folder) / LABEXTENSION / "package.json").is_file() for folder in jupyter_path("labextensions")
    )


def _missing() -> list[str]:
    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append("Debian's chromium (apt-get install -y chromium; or run bash .ci/ui-up)")
    for module, how in (
        ("playwright", "pip install playwright (in the test extra); never 'playwright install'"),
        ("jupyterlab", "pip install jupyterlab (in the test extra)"),
    ):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"the Python package {module} ({how})")
    if not _labextension_installed():
        missing.append(
            "the built labextension (pip install -e . builds it with node/jlpm; "
            "bash .ci/ui-up installs what that needs)"
        )
    return missing


@pytest.fixture(scope="module", autouse=True)
def browser_prerequisites() -> None:
    missing = _missing()
    if missing:
        message = "browser test needs: " + "; ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    url: str
    token: str
    log: Path
    root: Path

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A call to /api/sandbox/<path> with the token; returns (status, JSON or bytes)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/api/sandbox/{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, raw, kind = e.code, e.read(), e.headers.get("Content-Type", "")
        return status, json.loads(raw) if raw and kind.startswith("application/json") else raw


class LabProcess:
    """One ``jupyter lab`` subprocess on a free localhost port; restartable on the same port."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None
        for name in ("notebooks", "sandboxes", "config", "runtime", "settings", "workspaces"):
            (base / name).mkdir(parents=True, exist_ok=True)
        (base / "cookie_secret").write_bytes(secrets.token_bytes(32))
        # no "official news?" toast over the panel
        notification = base / "settings" / "@jupyterlab" / "apputils-extension"
        notification.mkdir(parents=True, exist_ok=True)
        (notification / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )
        self.lab = Lab(f"http://127.0.0.1:{self.port}", self.token, base / "lab.log", base / "sandboxes")

    def start(
        self,
        provider: str,
        *extra: str,
        isolation: str | None = "none",
        extra_env: dict[str, str] | None = None,
    ) -> Lab:
        """Start the lab; ready once status answers in JSON (200, or 503 for a provider that failed)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TAI_MCP_", "SANDBOX_"))}
        env.update(
            JUPYTER_CONFIG_DIR=str(self.base / "config"),
            JUPYTER_RUNTIME_DIR=str(self.base / "runtime"),
            JUPYTER_PLATFORM_DIRS="1",
            **(extra_env or {}),
        )
        argv = [
            sys.executable, "-m", "jupyter", "lab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.cookie_secret_file={self.base / 'cookie_secret'}",
            f"--ServerApp.root_dir={self.base / 'notebooks'}",
            f"--LabApp.user_settings_dir={self.base / 'settings'}",
            f"--LabApp.workspaces_dir={self.base / 'workspaces'}",
            # tests reach the app as window.jupyterapp (commands: run all cells, change the theme)
            "--LabApp.expose_app_in_browser=True",
            f"--SandboxApp.provider={provider}",
            *([f"--SandboxPolicy.isolation={isolation}"] if isolation else []),
            f"--LocalSandbox.root={self.base / 'sandboxes'}",
            *extra,
        ]  # fmt: skip
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv.append("--allow-root")
        log = self.lab.log.open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                status, body = self.lab.api("GET", "status")
                if status == 200 or (status == 503 and isinstance(body, dict)):
                    return self.lab
            time.sleep(0.3)
        self.stop()
        pytest.fail(f"jupyter lab did not answer within {START_SECONDS}s; its log:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.lab.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@pytest.fixture
def lab_process(tmp_path: Path) -> Iterator[LabProcess]:
    process = LabProcess(tmp_path)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    # function scope: Playwright's loop must be gone before pytest-jupyter closes its own
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield page
    finally:
        with contextlib.suppress(Exception):
            shot(page, f"last-{request.node.name}")  # what the screen showed at the end
        context.close()


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def open_panel(page: Any, lab: Lab) -> Any:
    page.goto(f"{lab.url}/lab?token={lab.token}")
    tab = page.locator('.lm-TabBar-tab[data-id="jp-tai-sandbox-panel"]')
    tab.wait_for(timeout=60_000)
    panel = page.locator("#jp-tai-sandbox-panel")
    if not panel.is_visible():
        tab.click()
    panel.wait_for(state="visible")
    return panel


def type_in_editor(page: Any, editor: Any, text: str, *, replace: bool = False) -> None:
    """Type ``text`` into a CodeMirror editor (its ``.cm-content``) and check that it landed there.

    Keys typed while JupyterLab still moves the focus would go elsewhere (a notebook that finishes
    starting takes it back, in command mode, where letters are shortcuts), so the editor must hold
    the focus first and contain the text after. ``replace`` types over the editor's whole text,
    trying again when the text did not land; otherwise the text goes at its end, once.
    """
    from playwright.sync_api import expect

    for attempt in range(3 if replace else 1):
        editor.click()
        expect(editor).to_be_focused()
        page.keyboard.press("Control+a" if replace else "Control+End")
        page.keyboard.type(text)
        try:
            expect(editor).to_contain_text(text, timeout=5_000)
            return
        except AssertionError:
            if attempt == (2 if replace else 0):
                raise


def open_new_session_dialog(page: Any, panel: Any) -> Any:
    """Click "New session" once the panel enables it, and return its dialog.

    The status line can show before the toolbar button's re-render enables it, and a click
    on the button while it is still disabled does nothing.
    """
    from playwright.sync_api import expect

    button = panel.locator(".jp-TaiSandbox-new")
    expect(button).to_have_attribute("aria-disabled", "false")
    button.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible()
    return dialog


def terminal_text(terminal: Any) -> str:
    return terminal.locator(".xterm-rows").inner_text()


def type_line(page: Any, terminal: Any, line: str) -> None:
    terminal.locator(".xterm").click()
    page.keyboard.type(line)
    page.keyboard.press("Enter")


def wait_for_text(terminal: Any, text: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = terminal_text(terminal)
        if text in seen.replace("\xa0", " "):
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not on the terminal screen; it shows:\n{seen}")


def notification_texts(page: Any) -> str:
    return " | ".join(page.locator(".Toastify__toast").all_inner_texts())


def wait_for_notification(page: Any, text: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in notification_texts(page):
            return
        time.sleep(0.2)
    raise AssertionError(f"no notification with {text!r}; seen: {notification_texts(page)}")


def test_panel_session_terminal_files_destroy(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("local", "--SandboxApp.max_upload_bytes=100000")
    panel = open_panel(page, lab)
    expect(panel.locator(".jp-TaiSandbox-status")).to_contain_text("Provider local")
    expect(panel.locator(".jp-TaiSandbox-status")).to_contain_text("isolation floor none")

    # New session dialog
    dialog = open_new_session_dialog(page, panel)
    dialog.locator('input[name="ttlSeconds"]').fill("900")
    dialog.locator('select[name="durability"]').select_option("persistent")
    dialog.locator('input[name="workspaceKey"]').fill("browser-test")
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    item = panel.locator(".jp-TaiSandbox-session")
    expect(item).to_have_count(1)
    session_id = item.get_attribute("data-session-id")
    assert session_id
    expect(item).to_contain_text("browser-test")
    expect(item.locator(".jp-TaiSandbox-timeLeft")).to_contain_text("reaped in 1")
    # issue 18.3: the title and the New session button whole, the network said once
    title = panel.locator(".jp-TaiSandbox-title")
    expect(title).to_have_text("Sandbox sessions")
    assert not_clipped(title) and not_clipped(panel.locator(".jp-TaiSandbox-new"))
    status_text = panel.locator(".jp-TaiSandbox-status").inner_text()
    assert "egress egress" not in status_text and "network ceiling egress" in status_text, status_text
    shot(page, "panel-session")

    # Terminal: typing, Ctrl-C, resize, a large paste, exit status
    item.locator(".jp-TaiSandbox-openTerminal").click()
    terminal = page.locator(f'.jp-TaiSandbox-terminal[data-session-id="{session_id}"]')
    expect(terminal).to_have_attribute("data-phase", "running")
    type_line(page, terminal, "echo hello-$((6*7))")
    wait_for_text(terminal, "hello-42")
    shot(page, "terminal")

    type_line(page, terminal, "sleep 300")
    time.sleep(0.5)
    page.keyboard.press("Control+C")
    type_line(page, terminal, "echo after-$((40+2))")
    wait_for_text(terminal, "after-42")

    page.set_viewport_size({"width": 1100, "height": 700})
    page.wait_for_timeout(500)
    rows, cols = terminal.get_attribute("data-rows"), terminal.get_attribute("data-cols")
    type_line(page, terminal, "clear; stty size")
    wait_for_text(terminal, f"{rows} {cols}")

    line = "0123456789" * 9 + "abcdefghi"  # 99 characters + newline
    big = (line + "\n") * 1000  # 100 kB
    type_line(page, terminal, "stty -echo; cat > pasted.txt")
    time.sleep(0.5)
    page.evaluate(
        """text => {
            const area = document.querySelector('.jp-TaiSandbox-terminal .xterm-helper-textarea');
            const data = new DataTransfer();
            data.setData('text/plain', text);
            area.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
        }""",
        big,
    )
    deadline = time.monotonic() + 30
    size = None
    while time.monotonic() < deadline:
        status, result = lab.api(
            "POST", f"sessions/{session_id}/exec",
            {"argv": ["sh", "-c", "wc -c < pasted.txt"], "timeout_seconds": 10},
        )  # fmt: skip
        if status == 200 and result["stdout"].strip() == str(len(big)):
            size = len(big)
            break
        time.sleep(0.5)
    page.keyboard.press("Control+D")
    assert size == len(big), f"pasted.txt has {result} bytes, not {len(big)}"
    type_line(page, terminal, "stty echo; clear; echo pasted-ok")
    wait_for_text(terminal, "pasted-ok")

    type_line(page, terminal, "exit 3")
    wait_for_text(terminal, "exited with status 3")
    expect(terminal).to_have_attribute("data-exit-code", "3")
    shot(page, "terminal-exit")

    # Closing a terminal tab kills its command
    panel.locator(".jp-TaiSandbox-session .jp-TaiSandbox-openTerminal").click()
    second = page.locator(f'.jp-TaiSandbox-terminal[data-session-id="{session_id}"][data-phase="running"]')
    expect(second).to_have_count(1)
    type_line(page, second, "echo $$ > shell.pid; echo pid-saved")
    wait_for_text(second, "pid-saved")
    status, result = lab.api(
        "POST", f"sessions/{session_id}/exec", {"argv": ["cat", "shell.pid"], "timeout_seconds": 10}
    )
    assert status == 200, result
    pid = int(result["stdout"])
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabCloseIcon").click()
    expect(second).to_have_count(0)
    assert _process_gone(pid), f"the terminal's shell {pid} still runs after its tab closed"

    # Files: upload by button and by drag-and-drop, see them listed, download one
    panel.locator(".jp-TaiSandbox-session .jp-TaiSandbox-openFiles").click()
    files = page.locator(f'.jp-TaiSandbox-files[data-session-id="{session_id}"]')
    expect(files.locator('.jp-TaiSandbox-fileRow[data-name="pasted.txt"]')).to_have_count(1)
    files.locator(".jp-TaiSandbox-uploadInput").set_input_files(
        files=[
            {"name": "uploaded.txt", "mimeType": "text/plain", "buffer": b"uploaded by the browser test\n"}
        ]
    )
    expect(files.locator('.jp-TaiSandbox-fileRow[data-name="uploaded.txt"]')).to_have_count(1)
    files.evaluate(
        """node => {
            const data = new DataTransfer();
            data.items.add(new File(['dropped by the browser test\\n'], 'dropped.txt', {type: 'text/plain'}));
            for (const type of ['dragover', 'drop']) {
                node.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
            }
        }"""
    )
    expect(files.locator('.jp-TaiSandbox-fileRow[data-name="dropped.txt"]')).to_have_count(1)
    assert lab.api("GET", f"sessions/{session_id}/files/uploaded.txt") == (
        200,
        b"uploaded by the browser test\n",
    )
    assert lab.api("GET", f"sessions/{session_id}/files/dropped.txt") == (
        200,
        b"dropped by the browser test\n",
    )
    with page.expect_download() as download:
        files.locator('.jp-TaiSandbox-fileRow[data-name="uploaded.txt"] button').click()
    assert Path(download.value.path()).read_bytes() == b"uploaded by the browser test\n"
    shot(page, "files")

    # An upload over the server's limit is a readable notification, not a silent failure
    files.locator(".jp-TaiSandbox-uploadInput").set_input_files(
        files=[{"name": "too-big.bin", "mimeType": "application/octet-stream", "buffer": b"x" * 200_000}]
    )
    wait_for_notification(page, "max_upload_bytes")
    expect(files.locator('.jp-TaiSandbox-fileRow[data-name="too-big.bin"]')).to_have_count(0)
    shot(page, "upload-too-large")

    # Destroy, with confirmation
    panel.locator(".jp-TaiSandbox-session .jp-TaiSandbox-destroy").click()
    confirm = page.locator(".jp-Dialog")
    expect(confirm).to_contain_text(session_id)
    confirm.locator(".jp-Dialog-button.jp-mod-accept").click()
    expect(panel.locator(".jp-TaiSandbox-session")).to_have_count(0)
    expect(panel.locator(".jp-TaiSandbox-empty")).to_contain_text("No sessions")
    assert lab.api("GET", f"sessions/{session_id}")[0] == 404
    shot(page, "destroyed")


def test_panel_provider_off_then_server_back(lab_process: LabProcess, page: Any) -> None:
    from playwright.sync_api import expect

    lab = lab_process.start("off")
    panel = open_panel(page, lab)
    status = panel.locator(".jp-TaiSandbox-status")
    expect(status).to_have_attribute("data-connection", "off")
    expect(status).to_contain_text("TAI_MCP_SANDBOX")
    expect(panel.locator(".jp-TaiSandbox-new")).to_have_attribute("aria-disabled", "true")
    shot(page, "provider-off")

    # the server goes away: the panel says so; it comes back with a provider: the panel recovers
    lab_process.stop()
    expect(status).to_have_attribute("data-connection", "unreachable", timeout=30_000)
    expect(status).to_contain_text("Cannot reach the Jupyter server")
    # JupyterLab's own modal "Server Connection Error" covers the toasts: dismiss it for good
    lost = page.locator(".jp-Dialog")
    with contextlib.suppress(Exception):
        lost.wait_for(timeout=10_000)
        lost.locator('input[type="checkbox"]').check()
        lost.locator(".jp-Dialog-button").last.click()
    shot(page, "server-gone")
    lab_process.start("local")
    expect(status).to_contain_text("Provider local", timeout=45_000)
    expect(panel.locator(".jp-TaiSandbox-new")).to_have_attribute("aria-disabled", "false")
    shot(page, "server-back")


def not_clipped(locator: Any) -> bool:
    """True when the element shows all of its text (nothing cut off or hidden by overflow)."""
    return locator.evaluate("n => n.scrollWidth <= n.clientWidth + 1 && n.scrollHeight <= n.clientHeight + 1")


def test_panel_shows_whole_json_errors(lab_process: LabProcess, page: Any) -> None:
    """Issue 20.1/20.2: a misspelled provider and the isolation floor's refusal, whole, in the panel."""
    from playwright.sync_api import expect

    lab = lab_process.start("dokcer")
    code, body = lab.api("GET", "status")
    assert code == 503 and body["error"] == "SandboxUnavailableError", body
    panel = open_panel(page, lab)
    status = panel.locator(".jp-TaiSandbox-status")
    expect(status).to_have_attribute("data-connection", "unavailable")
    expect(status).to_have_text(body["message"])
    assert "dokcer" in status.inner_text()
    assert not_clipped(status)
    expect(panel.locator(".jp-TaiSandbox-new")).to_have_attribute("aria-disabled", "true")
    page.wait_for_timeout(1000)
    shown = (status.inner_text() + " " + notification_texts(page)).lower()
    assert "404" not in shown and "not found" not in shown, shown
    shot(page, "provider-misspelled")

    # the local provider under the default isolation floor (container) refuses every create: the panel
    # says so before any click (issue 25 point 8), New session is off with the reason as its tooltip,
    # and the hint names the server's option (this is the server's door)
    lab_process.stop()
    lab = lab_process.start("local", isolation=None)
    code, refusal = lab.api("POST", "sessions", {"ttl_seconds": 60})
    assert 400 <= code < 500 and isinstance(refusal, dict), (code, refusal)
    assert "--SandboxPolicy.isolation=none" in refusal["message"], refusal["message"]
    code, body = lab.api("GET", "status")
    assert code == 200 and "--SandboxPolicy.isolation=none" in body["create_refused"], body
    panel = open_panel(page, lab)
    expect(panel.locator(".jp-TaiSandbox-status")).to_contain_text("Provider local", timeout=45_000)
    expect(panel.locator(".jp-TaiSandbox-status")).to_contain_text("isolation floor container")
    notice = panel.locator(".jp-TaiSandbox-notice")
    expect(notice).to_have_attribute("data-kind", "blocked")
    expect(notice).to_have_text(f"New session is off: {body['create_refused']}")
    assert not_clipped(notice)
    new = panel.locator(".jp-TaiSandbox-new")
    expect(new).to_have_attribute("aria-disabled", "true")
    expect(new).to_have_attribute("title", f"New session is off: {body['create_refused']}")
    assert "no isolation" not in notice.inner_text().lower()
    shot(page, "new-session-off-isolation-floor")
    new.click(force=True)  # a disabled button: no dialog
    page.wait_for_timeout(500)
    expect(page.locator(".jp-Dialog")).to_have_count(0)


def _process_gone(pid: int, timeout: float = 10) -> bool:
    """True once pid has exited (a zombie counts: PID 1 here does not reap orphans)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False
