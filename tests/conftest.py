"""Shared fixtures and the run's own checks. Coroutines run through ``asyncio.run`` (no pytest-asyncio:
pytest-jupyter brings its own loop for the server tests).

The suite runs on as many xdist workers as the caller asks for (README's ``python -m pytest -n 4``; without
``-n``, in one process); how it is scheduled, and the serial group of tests that run alone after the others,
is tests/support/scheduling.py.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

import pytest

from jupyter_tai_sandbox import sandboxes
from tests.support import DEPLOYMENT, TOP_LEVEL, browser_network
from tests.support.docker import DISTURB, DISTURB_HINT

os.environ["TAI_SANDBOX_DEPLOYMENT"] = DEPLOYMENT
# the servers of the run keep their audit lines in the run's own file, not the machine user's data dir
os.environ.setdefault(
    "TAI_SANDBOX_AUDIT_PATH",
    os.path.join(tempfile.gettempdir(), f"tai-sandbox-tests-{DEPLOYMENT}", "audit.jsonl"),
)

# tests.support.server's fixtures (``provider``) reach every test module without an import
pytest_plugins = ["pytest_jupyter.jupyter_server", "tests.support.server", "tests.support.scheduling"]

_POLICY_ENV = (
    "TAI_MCP_SANDBOX",
    "TAI_MCP_SANDBOX_ISOLATION",
    "TAI_MCP_SANDBOX_EGRESS",
    "TAI_MCP_SANDBOX_DURABLE",
    "TAI_MCP_SANDBOX_SCRUB_TRANSCRIPT",
    "TAI_MCP_SANDBOX_CREDENTIALS",
    "TAI_MCP_SANDBOX_EGRESS_RULES",
    "TAI_MCP_SANDBOX_SECRETS",
    "TAI_MCP_SANDBOX_EGRESS_AUDIT",
    "SANDBOX_LOCAL_ROOT",
)


@pytest.fixture(autouse=True)
def clean_sandbox_slot(monkeypatch, tmp_path_factory):
    """Every test starts with no provider installed and no policy environment; the egress audit's default
    file is the test's own (never the Jupyter runtime directory of whoever runs the tests)."""
    for name in _POLICY_ENV:
        monkeypatch.delenv(name, raising=False)
    audit = tmp_path_factory.mktemp("egress-audit") / "audit.jsonl"
    monkeypatch.setenv("TAI_MCP_SANDBOX_EGRESS_AUDIT", str(audit))
    sandboxes.unregister_sandbox()
    yield
    sandboxes.unregister_sandbox()


@pytest.fixture
def jp_ws_fetch(jp_ws_fetch):
    """pytest-jupyter's, and every websocket it opened is closed at the test's end (one a test read to its
    end stays open on the client's side: tornado warns of it when collected, in whatever test runs then)."""
    opened = []

    def fetch(*parts, **kwargs):
        connecting = jp_ws_fetch(*parts, **kwargs)

        def done(future) -> None:
            if not future.cancelled() and future.exception() is None:
                opened.append(future.result())

        connecting.add_done_callback(done)
        return connecting

    yield fetch
    for ws in opened:
        ws.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test whose name or parameters say docker needs the engine: it carries the ``docker`` mark. One that
    disturbs the engine skips unless CI=true or TAI_SANDBOX_DISTURB_ENGINE=1."""
    for item in items:
        if "docker" in item.name.lower() and item.get_closest_marker("docker") is None:
            item.add_marker(pytest.mark.docker)
        if item.get_closest_marker("disturbs_engine") is not None and not DISTURB:
            item.add_marker(pytest.mark.skip(reason=DISTURB_HINT))


class EngineChecks:
    """Once per run, in the process that started it (the xdist controller, or the only one without -n):
    another deployment's sessions, workspace and network are planted past their TTL before any test,
    and after the last one (the serial group included) they must all be there, untouched by any test,
    reaper or server of ours; and nothing any part of this run made may be left on the engine."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.planted: dict[str, list[str]] | None = None
        self.checked = False
        self.rules_before: set[str] = set()

    @pytest.hookimpl(tryfirst=True)  # before xdist starts its workers
    def pytest_sessionstart(self) -> None:
        from tests.support import docker as docker_support

        self.planted = docker_support.plant_foreign_sessions()
        self.rules_before = docker_support.firewall_rules()

    # after the serial group's wrapper (tryfirst wrappers enclose the others)
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session):
        try:
            return (yield)
        finally:
            self.check()

    def check(self) -> None:
        if self.checked or self.planted is None:
            return
        self.checked = True
        started = time.monotonic()
        import docker

        from tests.support import docker as docker_support
        from tests.support.scheduling import report_failure

        try:
            # the engine-killed test restarts the engine last: on a loaded machine it may still be starting
            docker_support.wait_for_engine(180)
            gone = docker_support.foreign_survivors(self.planted)
            docker_support.remove_foreign_sessions()
        except Exception as e:  # a failure of the run, reported as one, not an internal error of pytest
            report_failure(
                self.config,
                "tests/conftest.py::the_engine_answered_at_the_end",
                f"the end-of-run engine checks could not run: {e!r}",
            )
            with contextlib.suppress(Exception):
                docker_support.remove_foreign_sessions()
            return
        if gone:
            report_failure(
                self.config,
                "tests/conftest.py::the_run_left_other_deployments_alone",
                f"the test run touched another deployment's things: {gone}",
            )
        client = docker.from_env(version="auto", timeout=120)
        try:
            left = docker_support.run_leftovers(client) + browser_network.leftover_namespaces()
        finally:
            client.close()
        if left:
            report_failure(
                self.config,
                "tests/conftest.py::the_run_left_nothing_on_the_engine",
                f"this run left these on the engine: {left}",
            )
        stale = docker_support.stale_firewall_rules(self.rules_before)
        if stale:
            report_failure(
                self.config,
                "tests/conftest.py::the_run_left_no_firewall_rules",
                f"host firewall rules of networks that are gone: {stale}",
            )
        self.summary = (
            f"engine checks: another deployment's things {'survived' if not gone else 'were touched'}; "
            f"this run left {len(left)} things on the engine and {len(stale)} firewall rules "
            f"(checked in {time.monotonic() - started:.0f} s)"
        )

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        self.check()  # when the loop never ran (a collection error, an interrupt)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if getattr(self, "summary", None):
            terminalreporter.write_line(self.summary)


def pytest_configure(config: pytest.Config) -> None:
    if TOP_LEVEL:
        config.pluginmanager.register(EngineChecks(config), "tai-engine-checks")
