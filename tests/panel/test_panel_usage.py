"""Issue 55's usage in the panel, in a real browser against a real lab on the docker provider: a session
doing work shows CPU, memory and disk sparklines (SVG paths of several points) under its row that move as
the panel refreshes, with what the session serves; the panel asks for every session's usage in one
request a refresh (GET /api/sandbox/usage), and stops asking while it is hidden.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.request
from typing import Any

import pytest

from tests.support import ARTIFACTS
from tests.support.lab import BROWSER_MARKS, Lab, LabProcess, open_panel, shot

pytestmark = [*BROWSER_MARKS, pytest.mark.docker, pytest.mark.slow(90)]

#: a CPU-bound loop half of every second (half a core: the usage sampler averages over its interval, well
#: over the 0.05 and the idle session's CPU the test asks for, without taking a whole core from the run's
#: other workers for the test's minute) that also writes 200 KB to the workspace every second, 60 s at most
WORK = (
    "i=0; while [ $i -lt 60 ]; do head -c 200000 /dev/zero > f$i; "
    "timeout 0.5 sh -c 'while :; do :; done'; sleep 0.5; i=$((i+1)); done; exit 0"
)


def run_long(lab: Lab, session_id: str, script: str) -> None:
    """A one-shot exec of ``script`` that may run longer than Lab.api's 30 s (its answer is not read)."""
    request = urllib.request.Request(
        f"{lab.url}/api/sandbox/sessions/{session_id}/exec",
        data=json.dumps({"argv": ["sh", "-c", script], "timeout_seconds": 90}).encode(),
        method="POST",
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def spark_state(item: Any) -> dict[str, tuple[int, str]]:
    """Each shown sparkline's points and SVG path."""
    return item.evaluate(
        """node => Object.fromEntries([...node.querySelectorAll('.jp-TaiSandbox-spark')]
            .filter(s => !s.hidden)
            .map(s => [s.dataset.metric, [Number(s.dataset.points), s.querySelector('path').getAttribute('d')]]))"""
    )


def wait_until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {value!r})")


def test_a_working_session_shows_moving_sparklines_and_what_it_serves(
    lab_process: LabProcess, page: Any
) -> None:
    from playwright.sync_api import expect

    from tests.support import docker as docker_support

    docker_support.docker_client()  # an engine, or skip (fail in CI)
    lab = lab_process.start(
        "docker",
        *docker_support.server_args()[1:],  # the test image, this run's label (start names the provider)
        f"--DockerSandbox.deployment={os.environ['TAI_SANDBOX_DEPLOYMENT']}-panel-usage",
        isolation="container",
    )
    made: list[str] = []
    worker: threading.Thread | None = None
    try:
        for consumer in ("agent:usage-demo", "kernel:0123456789abcdef"):
            code, info = lab.api("POST", "sessions", {"ttl_seconds": 600, "consumer": consumer})
            assert code == 201, info
            made.append(info["id"])
        busy, idle = made
        worker = threading.Thread(target=run_long, args=(lab, busy, WORK), daemon=True)
        worker.start()

        usage_requests: list[float] = []
        other_session_gets: list[str] = []

        def seen(request: Any) -> None:
            path = request.url.split("?", 1)[0]
            if path.endswith("/api/sandbox/usage"):
                usage_requests.append(time.monotonic())
            elif any(path.endswith(f"/api/sandbox/sessions/{sid}") for sid in made):
                other_session_gets.append(path)

        page.on("request", seen)
        panel = open_panel(page, lab)
        item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{busy}"]')
        sparks = item.locator(".jp-TaiSandbox-sparks")
        expect(sparks).to_be_visible(timeout=60_000)
        # what the session serves: the coding agent's key; the kernel's session says kernel and its id
        expect(sparks.locator(".jp-TaiSandbox-serves")).to_have_text("agent usage-demo")
        idle_item = panel.locator(f'.jp-TaiSandbox-session[data-session-id="{idle}"]')
        expect(idle_item.locator(".jp-TaiSandbox-serves")).to_have_text("kernel 01234567", timeout=30_000)

        # several samples later: three sparklines of several points each, CPU up while the loop runs
        first = wait_until(
            "three sparklines of 3 points or more",
            lambda: (
                lambda s: (
                    s if set(s) == {"cpu", "memory", "disk"} and min(p for p, _ in s.values()) >= 3 else None
                )
            )(spark_state(item)),
        )
        for metric, (_points, path) in first.items():
            assert path.startswith("M") and path.count("L") >= 2, (metric, path)
        cpu_title = item.locator('.jp-TaiSandbox-spark[data-metric="cpu"]').get_attribute("title") or ""
        assert "of a core now" in cpu_title, cpu_title
        shot(page, "panel-usage-sparklines")
        ARTIFACTS.mkdir(exist_ok=True)
        panel.locator(".jp-TaiSandbox-sessions").screenshot(path=str(ARTIFACTS / "panel-usage-rows.png"))

        # a refresh later every line has moved (a new sample each)
        wait_until(
            "every sparkline moved",
            lambda: all(spark_state(item).get(m, (0, p))[1] != p for m, (_n, p) in first.items()),
            timeout=30,
        )
        # the busy session's CPU well over the idle one's (a loaded machine gives the loop less than a core)
        code, answer = lab.api("GET", "usage")
        assert code == 200, answer
        by_id = {s["id"]: s for s in answer["sessions"]}
        busiest = max(s["cpu"] or 0 for s in by_id[busy]["samples"])
        assert busiest > 0.05 and busiest > 3 * max(s["cpu"] or 0 for s in by_id[idle]["samples"]), answer
        assert by_id[busy]["samples"][-1]["disk_bytes"] > 200_000

        # one request a refresh for all the sessions: never a GET of each session for its usage
        assert other_session_gets == [], other_session_gets
        # hidden, the panel stops asking
        page.locator('.lm-TabBar-tab[data-id="jp-tai-sandbox-panel"]').click()
        expect(panel).to_be_hidden()
        time.sleep(1)  # a request under way as it hid
        hidden_at = len(usage_requests)
        time.sleep(12)
        assert len(usage_requests) == hidden_at, "GET usage went on while the panel was hidden"
    finally:
        for session_id in made:
            lab.api("DELETE", f"sessions/{session_id}")
        if worker is not None:
            worker.join(30)
