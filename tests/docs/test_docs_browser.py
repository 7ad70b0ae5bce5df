"""The built docs site, browsed offline: ``python -m http.server`` over docs/_build/html and Debian's chromium
(Playwright, as tests/support/lab.py launches it: ``executable_path``, no browser download).

The index's navigation reaches each section, the configuration reference opens at a setting's anchor with
its class sections in the page's table of contents, and the search page finds a setting. CI builds
docs/_build/html with .ci/docs before the tests; when it is missing this test builds it the same way (without
-W: tests/docs/test_docs_site.py owns the warning count). A separate module from test_docs_site.py: the
browser tests share one xdist group (one worker), which would split that module's one build in two.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, browser_network, free_port
from tests.support.lab import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, UI_TIMEOUT_MS, shot

pytestmark = [*BROWSER_MARKS, pytest.mark.slow(40)]

SITE = REPO / "docs" / "_build" / "html"
SECTIONS = {
    "Users": "users/index.html",
    "Operators": "operators/index.html",
    "Developers": "developers/index.html",
    "Reference": "reference/index.html",
    "Contributors": "contributors/index.html",
}


def _missing() -> list[str]:
    missing = []
    if not Path(CHROMIUM).is_file():
        missing.append("Debian's chromium (apt-get install -y chromium; or run bash .ci/ui-up)")
    for module, how in (
        ("playwright", "in the test extra"),
        ("sphinx", "the docs extra: pip install -e '.[docs]'"),
    ):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"the Python package {module} ({how})")
    return missing


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    missing = _missing()
    if missing:
        message = "the docs browser test needs: " + "; ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    if not (SITE / "reference" / "configuration.html").is_file():
        built = subprocess.run(
            [sys.executable, "-m", "sphinx", "-q", "-b", "html", "docs", str(SITE)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert built.returncode == 0, built.stderr[-3000:]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(SITE)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "index.html", timeout=2) as answer:
                    assert answer.status == 200
                break
            except OSError:
                assert server.poll() is None, "python -m http.server exited"
                assert time.monotonic() < deadline, "python -m http.server did not answer in 30 s"
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(10)
        if server.poll() is None:
            server.kill()
            server.wait(10)


@pytest.fixture
def docs_page(served: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    # chromium in a network namespace of its own where it can be, as the panel's tests run it: Docker's network
    # churn on the shared engine otherwise aborts its fetches (the search page's index: "Failed to fetch")
    executable, network = CHROMIUM, None
    if browser_network.available():
        network = browser_network.BrowserNetwork(tmp_path_factory.mktemp("chromium"), CHROMIUM)
        executable = str(network.chromium)
        network.forward(int(urllib.parse.urlsplit(served).port or 80))
    with contextlib.ExitStack() as cleanup, sync_playwright() as p:
        if network is not None:
            cleanup.callback(network.close)
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.set_default_timeout(UI_TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.errors = errors
            try:
                yield page
            finally:
                with contextlib.suppress(Exception):
                    shot(page, "last-docs-site")
                context.close()
        finally:
            browser.close()


def test_the_index_navigation_reaches_each_section(served, docs_page):
    page = docs_page
    page.goto(served + "index.html")
    navbar = page.locator(".bd-header")
    for title, href in SECTIONS.items():
        link = navbar.locator(f'a.nav-link[href="{href}"]').first
        link.wait_for(state="visible")
        assert title in link.inner_text()
    navbar.locator('a.nav-link[href="reference/index.html"]').first.click()
    page.wait_for_url("**/reference/index.html")
    assert page.locator("h1").first.inner_text().startswith("Reference")
    # the reference's own pages are in its table of contents, and one click away
    page.locator("article a", has_text="Configuration reference").first.click()
    page.wait_for_url("**/reference/configuration.html")
    assert page.errors == []


def test_the_configuration_reference_opens_at_a_setting(served, docs_page):
    page = docs_page
    page.goto(served + "reference/configuration.html#SandboxPolicy.isolation")
    entry = page.locator('[id="SandboxPolicy.isolation"]')
    entry.wait_for(state="visible")
    assert entry.is_visible()
    box = entry.bounding_box()
    assert box is not None and 0 <= box["y"] < 900, f"the anchor did not scroll into view: {box}"
    body = page.locator("dl:has(> dt[id='SandboxPolicy.isolation']) > dd").first.inner_text()
    assert "isolation floor" in body and "TAI_MCP_SANDBOX_ISOLATION" in body
    # the page's table of contents lists the classes
    toc = page.locator("#pst-page-navigation-heading-2 ~ ul, nav.bd-toc-nav, .bd-toc").first
    toc_text = toc.inner_text()
    for cls in ("SandboxApp", "SandboxPolicy", "DockerSandbox", "VmSandbox", "SandboxProvisioner"):
        assert cls in toc_text, f"{cls} is not in the page's table of contents: {toc_text[:400]}"
    # the section navigation on the left shows where the page is
    assert "Configuration reference" in page.locator(".bd-sidebar-primary").inner_text()
    assert page.errors == []


def test_the_search_page_finds_a_setting(served, docs_page):
    page = docs_page
    page.goto(served + "search.html?q=max_ttl_seconds")
    results = page.locator("#search-results li")
    results.first.wait_for(state="visible")
    hrefs = [results.nth(i).locator("a").first.get_attribute("href") or "" for i in range(results.count())]
    assert any("reference/configuration.html" in h for h in hrefs), hrefs
    assert page.errors == []
