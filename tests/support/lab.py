"""A live ``jupyter lab`` with the extension, driven through Debian's chromium by Playwright (no browser
downloads), and the panel's helpers the browser tests share.

Outside CI a browser test skips, saying what to install, when chromium, Playwright or the built
labextension is missing; with ``CI=true`` it fails instead. Screenshots land in ``tests/artifacts/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ARTIFACTS, browser_network, free_port

#: the marks of every browser test module: the marker, one group (one worker: one lab at a time, so a
#: starved lab does not fail its test), and room for a lab and chromium to start
BROWSER_MARKS = [pytest.mark.browser, pytest.mark.xdist_group("browser"), pytest.mark.timeout(600)]


CHROMIUM = os.environ.get("TAI_SANDBOX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


LABEXTENSION = "jupyter-tai-sandbox"


START_SECONDS = 90


UI_TIMEOUT_MS = 30_000


def _labextension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(
        (Path(folder) / LABEXTENSION / "package.json").is_file() for folder in jupyter_path("labextensions")
    )


def missing_prerequisites() -> list[str]:
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


@pytest.fixture(scope="module")
def browser_prerequisites() -> None:
    missing = missing_prerequisites()
    if missing:
        message = "browser test needs: " + "; ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


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
        self.port = free_port()
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
        browser_network.forward(self.port)  # the browser's way to it, when the browser has a namespace
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
        exited = self.proc.poll()
        self.stop()
        if exited is not None:
            pytest.fail(f"jupyter lab exited with status {exited}; its log:\n{self.log_tail()}")
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
def lab_process(browser_prerequisites: None, tmp_path: Path) -> Iterator[LabProcess]:
    process = LabProcess(tmp_path)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def browser(browser_prerequisites: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Chromium, in a network namespace of its own where it can be (tests/support/browser_network.py)."""
    # function scope: Playwright's loop must be gone before pytest-jupyter closes its own
    from playwright.sync_api import sync_playwright

    executable, network = CHROMIUM, None
    if browser_network.available():
        try:
            network = browser_network.BrowserNetwork(tmp_path_factory.mktemp("chromium"), CHROMIUM)
            executable = str(network.chromium)
        except (OSError, subprocess.CalledProcessError) as e:
            warnings.warn(
                f"chromium runs on the host's network (Docker's churn may abort its requests): {e}",
                stacklevel=2,
            )
    browser_network.current = network
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        browser_network.current = None
        if network is not None:
            network.close()


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


THEME_ERROR = '.jp-Dialog[aria-label^="Error Loading Theme"]'


def load_lab(page: Any, url: str | None = None) -> None:
    """Go to ``url`` (a JupyterLab page; None: reload this one) and wait until its theme is in.

    Now and then, with Docker making and removing networks beside it, chromium aborts the requests a
    page load has in flight (``net::ERR_NETWORK_CHANGED``, nothing in the lab's log): JupyterLab then
    shows its theme-error modal over an unstyled page, which is not the panel's doing, so the page is
    loaded again (up to 3 more times, each a warning naming chromium's failed requests)."""
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
    attempts = 4
    for attempt in range(1, attempts + 1):
        if url is None or attempt > 1:
            page.reload()
        else:
            page.goto(url)
        page.wait_for_function(
            f"() => document.body.dataset.jpThemeName || document.querySelector('{THEME_ERROR}')",
            timeout=90_000,
        )
        if attempt == attempts or page.locator(THEME_ERROR).count() == 0:
            return
        warnings.warn(
            f"JupyterLab could not load its theme (load {attempt}); page loaded again. "
            f"Failed requests: {failed}",
            stacklevel=2,
        )
        failed.clear()
        time.sleep(0.5 * attempt)


def open_lab(page: Any, lab: Lab) -> None:
    load_lab(page, f"{lab.url}/lab?token={lab.token}")


def open_panel(page: Any, lab: Lab) -> Any:
    open_lab(page, lab)
    tab = page.locator('.lm-TabBar-tab[data-id="jp-tai-sandbox-panel"]')
    tab.wait_for(timeout=60_000)
    panel = page.locator("#jp-tai-sandbox-panel")
    # JupyterLab restores the sidebar it last showed, while the page settles: a click racing that restore
    # can collapse the panel it would open, so look again and click again (a few times) until it shows
    for _ in range(3):
        if panel.is_visible():
            break
        tab.click()
        with contextlib.suppress(Exception):
            panel.wait_for(state="visible", timeout=10_000)
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


def open_terminal(page: Any, session_id: str) -> Any:
    """The panel's Terminal action (the command its button runs) on ``session_id``; the tab's locator."""
    page.evaluate("id => window.jupyterapp.commands.execute('tai-sandbox:open-terminal', { id })", session_id)
    return page.locator(f'.jp-TaiSandbox-terminal[data-session-id="{session_id}"]')


def dismiss_connection_lost(page: Any, timeout: float = 10) -> None:
    """JupyterLab's own modal "Server Connection Error" (shown while the server is down) covers the page and
    takes its clicks: wait up to ``timeout`` seconds for it and dismiss it for good, if it comes."""
    lost = page.locator(".jp-Dialog")
    with contextlib.suppress(Exception):
        lost.wait_for(timeout=timeout * 1000)
        lost.locator('input[type="checkbox"]').check()
        lost.locator(".jp-Dialog-button").last.click()


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


def not_clipped(locator: Any) -> bool:
    """True when the element shows all of its text (nothing cut off or hidden by overflow)."""
    return locator.evaluate("n => n.scrollWidth <= n.clientWidth + 1 && n.scrollHeight <= n.clientHeight + 1")


def process_gone(pid: int, timeout: float = 10) -> bool:
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


def new_session(lab: Lab) -> str:
    code, info = lab.api("POST", "sessions", {"ttl_seconds": 900})
    assert code == 201, info
    return info["id"]


def read_file(lab: Lab, session_id: str, path: str) -> bytes:
    code, body = lab.api("GET", f"sessions/{session_id}/files/{path}")
    assert code == 200, body
    return body


KERNEL_NAME = "python3-sandbox"


DISPLAY_NAME = "Python 3 (sandbox)"


def install_kernelspec(data_dir: Path) -> None:
    """``jupyter tai-sandbox kernelspec install --user`` into ``data_dir`` (the test server's own)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JUPYTER_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_tai_sandbox.cli", "kernelspec", "install", "--user"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    spec = json.loads((data_dir / "kernels" / KERNEL_NAME / "kernel.json").read_text())
    assert spec["display_name"] == DISPLAY_NAME, spec


def open_panel_tab(page: Any) -> Any:
    page.locator('.lm-TabBar-tab[data-id="jp-tai-sandbox-panel"]').click()
    panel = page.locator("#jp-tai-sandbox-panel")
    panel.wait_for(state="visible")
    return panel
