"""What the panel tells a user before and when they act, in a real ``jupyter lab`` and Debian's
chromium (fixtures and helpers of tests/support/lab.py; screenshots in tests/artifacts/); the
numbers are issue 25's points:

3. a kernel-start error shows whole in JupyterLab's "Error Starting Kernel" dialog, its fix inside
   the dialog and the 1400x900 viewport; POST /api/kernels answers the error's own status, while
   POST /api/sessions answers 500 (jupyter_server turns every error of a session's kernel start into
   a 500: ``except Exception: raise web.HTTPError(500, str(e))``), with the same readable message;
8. (tests/panel/test_panel_browser.py::test_panel_shows_whole_json_errors) New session off, saying why, under an
   isolation floor the provider cannot give;
9. the local provider says "no isolation: code runs on this host as you" in the status and in the
   New session dialog;
12. the docker New session dialog shows the operator's cpu/memory defaults and maxima;
15. sandbox terminals and sessions in JupyterLab's Running sidebar: listed, opened, shut down.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from jupyter_tai_sandbox.sandboxes import PROVIDER_CHOICES
from tests.support.lab import (
    BROWSER_MARKS,
    DISPLAY_NAME,
    KERNEL_NAME,
    Lab,
    LabProcess,
    install_kernelspec,
    not_clipped,
    open_lab,
    open_new_session_dialog,
    open_panel,
    process_gone,
    shot,
    type_line,
    wait_for_text,
)

pytestmark = [*BROWSER_MARKS, pytest.mark.slow(75)]


def jupyter_post(lab: Lab, path: str, body: Any) -> tuple[int, Any]:
    """POST to jupyter_server's own /api/<path>; (status, JSON)."""
    request = urllib.request.Request(
        f"{lab.url}/api/{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["left"] >= outer["left"] - 0.5
        and inner["top"] >= outer["top"] - 0.5
        and inner["right"] <= outer["right"] + 0.5
        and inner["bottom"] <= outer["bottom"] + 0.5
    )


#: the box of the text `text` inside `node` (a Range over its characters), and of the node's dialog
TEXT_BOX = """(node, text) => {
    const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
    let found = null;
    while (walker.nextNode()) {
        const at = walker.currentNode.textContent.indexOf(text);
        if (at >= 0) { found = [walker.currentNode, at]; break; }
    }
    if (!found) { return null; }
    const range = document.createRange();
    range.setStart(found[0], found[1]);
    range.setEnd(found[0], found[1] + text.length);
    const box = r => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
    const dialog = node.closest('.jp-Dialog-content');
    return {
        text: box(range.getBoundingClientRect()),
        dialog: box(dialog.getBoundingClientRect()),
        viewport: {left: 0, top: 0, right: window.innerWidth, bottom: window.innerHeight},
    };
}"""


def test_kernel_start_error_shows_its_fix(lab_process: LabProcess, page: Any) -> None:
    """Point 3: a misspelled provider; the kernel's start fails with the fix visible."""
    from playwright.sync_api import expect

    data_dir = lab_process.base / "data"
    install_kernelspec(data_dir)
    lab = lab_process.start("lcoal", extra_env={"JUPYTER_DATA_DIR": str(data_dir)})
    fix = PROVIDER_CHOICES  # every built-in name, as the error words them

    # the kernels route answers the error's own status (503: the provider cannot run) ...
    code, body = jupyter_post(lab, "kernels", {"name": KERNEL_NAME})
    assert code == 503, (code, body)
    message = body["message"]
    assert "'lcoal'" in message and fix in " ".join(message.split()), message
    assert all(len(line) <= 72 for line in message.splitlines()), message
    # ... the sessions route (what JupyterLab calls) 500, which jupyter_server imposes, same words
    code, body = jupyter_post(
        lab, "sessions", {"path": "x.ipynb", "type": "notebook", "name": "", "kernel": {"name": KERNEL_NAME}}
    )
    assert code == 500, (code, body)
    assert body["message"] == message, body

    open_lab(page, lab)
    card = page.locator(f'.jp-LauncherCard[data-category="Notebook"][title="{DISPLAY_NAME}"]')
    expect(card).to_be_visible(timeout=60_000)
    card.click()
    dialog = page.locator(".jp-Dialog", has_text="Error Starting Kernel")
    expect(dialog).to_be_visible(timeout=60_000)
    pre = dialog.locator(".jp-Dialog-body pre").first
    expect(pre).to_contain_text("module:Class")
    assert "could not start" in pre.inner_text()
    assert not_clipped(pre), "the error's <pre> scrolls: part of it is hidden"
    last_line = message.splitlines()[-1]
    assert fix.split()[-1] in last_line, last_line
    boxes = pre.evaluate(TEXT_BOX, last_line)
    assert boxes is not None, pre.inner_text()
    assert inside(boxes["text"], boxes["dialog"]), boxes
    assert inside(boxes["text"], boxes["viewport"]), boxes
    shot(page, "kernel-start-error-whole")


def test_no_isolation_is_said_where_a_user_decides(lab_process: LabProcess, page: Any) -> None:
    """Point 9: the local provider runs code on this host: the status and the New session dialog say so."""
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    panel = open_panel(page, lab)
    status = panel.locator(".jp-TaiSandbox-status")
    expect(status).to_contain_text("Provider local")
    notice = status.locator(".jp-TaiSandbox-notice")
    expect(notice).to_be_visible()
    expect(notice).to_have_attribute("data-kind", "no-isolation")
    expect(notice).to_contain_text("No isolation: code runs on this host as you.")
    assert not_clipped(notice)
    expect(panel.locator(".jp-TaiSandbox-new")).to_have_attribute("aria-disabled", "false")
    shot(page, "local-no-isolation-status")

    dialog = open_new_session_dialog(page, panel)
    warning = dialog.locator(".jp-TaiSandbox-formWarning")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text("No isolation: code runs on this host as you.")
    assert not_clipped(warning)
    # the local provider enforces no caps: the fields say so instead of "no limit"
    assert dialog.locator('input[name="cpu"]').get_attribute("placeholder") == "not supported"
    shot(page, "local-no-isolation-dialog")
    dialog.locator(".jp-Dialog-button.jp-mod-reject").click()


def test_docker_dialog_shows_the_operators_limits(lab_process: LabProcess, page: Any) -> None:
    """Point 12: the CPUs and Memory fields say the operator's defaults and maxima."""
    from playwright.sync_api import expect

    from tests.support import docker as docker_support

    docker_support.docker_client()  # an engine, or skip (fail in CI)
    deployment = f"{os.environ['TAI_SANDBOX_DEPLOYMENT']}-panel-limits"
    lab = lab_process.start(
        "docker",
        f"--DockerSandbox.deployment={deployment}",
        f"--DockerSandbox.image={docker_support.TEST_IMAGE}",
        "--DockerSandbox.max_cpu=1.5",
        isolation="container",
    )
    code, status = lab.api("GET", "status")
    assert code == 200, status
    assert status["limits"] == {
        "default_cpu": 1.0,
        "max_cpu": 1.5,
        "default_memory_mb": 1024,
        "max_memory_mb": 4096,
    }
    panel = open_panel(page, lab)
    expect(panel.locator(".jp-TaiSandbox-status")).to_contain_text("Provider docker")
    # no warning: docker isolates
    expect(panel.locator(".jp-TaiSandbox-notice")).to_be_hidden()
    dialog = open_new_session_dialog(page, panel)
    cpu, memory = dialog.locator('input[name="cpu"]'), dialog.locator('input[name="memoryMb"]')
    assert cpu.get_attribute("placeholder") == "default 1 CPU"
    assert memory.get_attribute("placeholder") == "default 1 GiB"
    cpu_hint = dialog.locator('.jp-TaiSandbox-formHint[data-field="cpu"]')
    memory_hint = dialog.locator('.jp-TaiSandbox-formHint[data-field="memoryMb"]')
    expect(cpu_hint).to_have_text("empty: 1 CPU, at most 1.5 CPUs (the operator's settings)")
    expect(memory_hint).to_have_text("empty: 1 GiB, at most 4 GiB (the operator's settings)")
    assert "no limit" not in dialog.inner_text()
    assert not_clipped(cpu_hint) and not_clipped(memory_hint)
    shot(page, "docker-new-session-limits")
    dialog.locator(".jp-Dialog-button.jp-mod-reject").click()


def test_sandbox_terminals_and_sessions_in_the_running_sidebar(lab_process: LabProcess, page: Any) -> None:
    """Point 15: listed as JupyterLab's terminals and kernels are; click opens, shut down ends."""
    from playwright.sync_api import expect

    lab = lab_process.start("local")
    code, kept = lab.api("POST", "sessions", {"ttl_seconds": 900})
    assert code == 201, kept
    code, other = lab.api("POST", "sessions", {"ttl_seconds": 900})
    assert code == 201, other
    panel = open_panel(page, lab)
    item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{kept["id"]}"]')
    item.locator(".jp-TaiSandbox-openTerminal").click()
    terminal = page.locator(f'.jp-TaiSandbox-terminal[data-session-id="{kept["id"]}"]')
    expect(terminal).to_have_attribute("data-phase", "running")
    type_line(page, terminal, "echo $$ > shell.pid; echo pid-saved")
    wait_for_text(terminal, "pid-saved")
    code, result = lab.api(
        "POST", f"sessions/{kept['id']}/exec", {"argv": ["cat", "shell.pid"], "timeout_seconds": 10}
    )
    assert code == 200, result
    pid = int(result["stdout"])

    # the Running sidebar: a section for each, with our rows
    page.locator('.lm-TabBar-tab[data-id="jp-running-sessions"]').click()
    running = page.locator("#jp-running-sessions")
    expect(running).to_be_visible()
    # a section of its own each (the accordion's title, like JupyterLab's "Terminals", "Kernels")
    expect(running.locator(".lm-AccordionPanel-title", has_text="Sandbox Terminals")).to_have_count(1)
    expect(running.locator(".lm-AccordionPanel-title", has_text="Sandbox Sessions")).to_have_count(1)
    terminals = sessions = running
    terminal_row = terminals.locator(f'.jp-TaiSandbox-runningTerminal[data-context="{kept["id"]}"]')
    expect(terminal_row).to_have_count(1)
    expect(terminal_row).to_contain_text("Sandbox ")
    session_rows = sessions.locator(".jp-TaiSandbox-runningSession")
    expect(session_rows).to_have_count(2)
    expect(sessions.locator(f'[data-context="{other["id"]}"]')).to_contain_text(other["id"])
    shot(page, "running-sidebar")

    # clicking the terminal's row focuses its tab (another tab was current)
    page.evaluate("() => window.jupyterapp.commands.execute('launcher:create')")
    expect(page.locator(".jp-Launcher").last).to_be_visible()
    assert not terminal.is_visible()
    terminal_row.locator(".jp-RunningSessions-itemLabel").click()
    expect(terminal).to_be_visible()
    current = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
    expect(current).to_contain_text("Sandbox ")

    # clicking a session's row shows it in the Sandbox panel
    sessions.locator(f'[data-context="{other["id"]}"] .jp-RunningSessions-itemLabel').click()
    expect(panel).to_be_visible()
    expect(panel.locator(f'.jp-TaiSandbox-session[data-session-id="{other["id"]}"]')).to_have_class(
        "jp-TaiSandbox-session jp-mod-revealed"
    )

    # shut down from the sidebar: the terminal's tab closes and its shell ends; the session goes
    page.locator('.lm-TabBar-tab[data-id="jp-running-sessions"]').click()
    expect(running).to_be_visible()
    terminal_row.hover()  # the shut-down button shows on hover, as for JupyterLab's own rows
    terminal_row.locator(".jp-RunningSessions-itemShutdown").click()
    expect(terminal).to_have_count(0)
    expect(terminal_row).to_have_count(0)
    assert process_gone(pid), f"the terminal's shell {pid} still runs after its shut down"
    other_row = sessions.locator(f'.jp-TaiSandbox-runningSession[data-context="{other["id"]}"]')
    other_row.hover()
    expect(other_row.locator(".jp-RunningSessions-itemShutdown")).to_have_attribute("title", "Destroy")
    other_row.locator(".jp-RunningSessions-itemShutdown").click()
    expect(sessions.locator(f'[data-context="{other["id"]}"]')).to_have_count(0)
    deadline = time.monotonic() + 20
    while lab.api("GET", f"sessions/{other['id']}")[0] != 404 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert lab.api("GET", f"sessions/{other['id']}")[0] == 404
    assert lab.api("GET", f"sessions/{kept['id']}")[0] == 200
    expect(session_rows).to_have_count(1)
    shot(page, "running-sidebar-after-shutdown")
