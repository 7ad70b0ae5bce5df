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


#: a test's own MetricsSettings (by the test's name)
SETTINGS = {
    "test_metrics_off_subscribe_nothing_and_move_nothing": {"enabled": False},
    "test_the_sessions_gauge_rereads_what_its_events_cannot_see": {"sessions_refresh_seconds": 0.2},
}


@pytest.fixture
def jp_server_config(tmp_path, request):
    settings = SETTINGS.get(request.node.name, {})
    return server_config("local", tmp_path / "sandboxes", MetricsSettings=settings)


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


async def test_the_sessions_gauge_rereads_what_its_events_cannot_see(jp_fetch, jp_serverapp):
    """Sessions made or ended behind the gate's back (the provider itself: no event) show at a re-read, which a
    scrape starts in the background at most every sessions_refresh_seconds (0.2 s here)."""
    gate = sandbox_app(jp_serverapp).sandbox
    running = key("sessions", provider="local", state="running")

    async def until(count: int) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while (await scrape(jp_fetch))[running] != count:
            assert asyncio.get_running_loop().time() < deadline, count
            await asyncio.sleep(0.1)

    assert (await scrape(jp_fetch))[running] == 0
    hidden = await gate.provider.create(SessionSpec())
    told = await gate.create(SessionSpec())
    assert (await scrape(jp_fetch))[running] in (1, 2)  # the event's at once
    await until(2)  # the hidden one at a re-read
    await told.session.destroy()  # no event
    await until(1)
    await hidden.destroy()
    await until(0)


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
    # servers of earlier tests in this process that are gone but not yet collected would drop out of the
    # gauge whenever the collector runs, in the middle of the counts below: collected first
    gc.collect()
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
