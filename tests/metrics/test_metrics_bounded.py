"""Bounded series: 100 sessions (each created, run and destroyed) add no series to /metrics; two servers in
one process register the series once and add up; a server that stops, or is gone, drops out; metrics off
subscribes nothing."""

from __future__ import annotations

import asyncio
import gc

import prometheus_client
import pytest
from traitlets.config import Config

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.app import SandboxApp
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.metrics.listener import ServerMetrics
from jupyter_tai_sandbox.metrics.series import COLLECTOR
from tests.metrics.scrape import PREFIX, key, moved, scrape
from tests.support.server import call, exec_call, sandbox_app, server_config

pytestmark = [pytest.mark.slow(30)]


@pytest.fixture
def jp_server_config(tmp_path, request):
    extra = {"MetricsSettings": {"enabled": False}} if "off" in request.node.name else {}
    return server_config("local", tmp_path / "sandboxes", **extra)


async def a_session_used_once(jp_fetch) -> None:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120})
    assert status == 201, info
    assert (await exec_call(jp_fetch, info["id"], ["echo", "x"]))[1]["exit_code"] == 0
    assert (await call(jp_fetch, "sessions", info["id"], method="DELETE"))[0] == 204


async def test_a_hundred_sessions_add_no_series(jp_fetch):
    await a_session_used_once(jp_fetch)
    before = await scrape(jp_fetch)
    for _ in range(100):
        await a_session_used_once(jp_fetch)
    after = await scrape(jp_fetch)
    assert set(after) == set(before)  # the same names and label sets
    changes = moved(before, after)
    assert changes[key("session_creates_total", provider="local", outcome="ok")] == 100
    assert changes[key("execs_total", provider="local", mode="one_shot", outcome="ok")] == 100
    # no label carries an id: every label value is one of a few
    values = {(name, label, value) for name, labels in after for label, value in labels}
    assert not [v for v in values if v[2].startswith("sbx-")]


async def test_metrics_off_subscribe_nothing_and_move_nothing(jp_fetch, jp_serverapp):
    app = sandbox_app(jp_serverapp)
    assert not app.metrics.enabled
    assert not [listener for listener, _ in app.event_listeners if isinstance(listener, ServerMetrics)]
    before = await scrape(jp_fetch)
    await a_session_used_once(jp_fetch)
    after = await scrape(jp_fetch)
    assert {k: v for k, v in moved(before, after).items() if k[0] != PREFIX + "sessions"} == {}


def make_app(tmp_path, name: str) -> SandboxApp:
    config = Config(
        {
            "SandboxApp": {"provider": "local", "presets_path": str(tmp_path / f"{name}-presets.json")},
            "SandboxPolicy": {"isolation": "none"},
            "LocalSandbox": {"root": str(tmp_path / name)},
            "MetricsSettings": {"sessions_refresh_seconds": 0},
        }
    )
    app = SandboxApp(config=config)
    app.initialize_settings()
    return app


def sessions_gauge() -> float:
    """jupyter_tai_sandbox_sessions{provider="local",state="running"} in the process's registry."""
    value = prometheus_client.REGISTRY.get_sample_value(
        PREFIX + "sessions", {"provider": "local", "state": "running"}
    )
    return value or 0.0


def test_two_servers_in_one_process_register_once_add_up_and_drop_out(tmp_path):
    start = sessions_gauge()
    first, second = make_app(tmp_path, "first"), make_app(tmp_path, "second")  # no duplicate registration
    creates = prometheus_client.REGISTRY.get_sample_value(
        PREFIX + "session_creates_total", {"provider": "local", "outcome": "ok"}
    )

    async def main(first: SandboxApp, second: SandboxApp) -> None:
        try:
            await first.sandbox.create(SessionSpec())
            await second.sandbox.create(SessionSpec())
            await second.sandbox.create(SessionSpec())
            assert sessions_gauge() - start == 3
            after = prometheus_client.REGISTRY.get_sample_value(
                PREFIX + "session_creates_total", {"provider": "local", "outcome": "ok"}
            )
            assert after - (creates or 0) == 3
            await second.stop_extension()  # destroys its sessions; a stopping server adds nothing
            assert sessions_gauge() - start == 1
        finally:
            await first.stop_extension()
            await second.stop_extension()

    try:
        asyncio.run(main(first, second))
    finally:
        sandboxes.unregister_sandbox()
    assert sessions_gauge() == start
    held = len(COLLECTOR._sources)
    del first, second
    gc.collect()
    assert len(COLLECTOR._sources) == held - 2  # held weakly: a server that is gone is dropped
