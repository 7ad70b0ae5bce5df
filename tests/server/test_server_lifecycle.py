"""The reaper, shutdown and restart of the server extension, for every provider."""

import asyncio
import json
import time

import pytest

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.sessions import server_owner
from tests.support.server import call, sandbox_app, server_config


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes", SandboxApp={"reap_interval_seconds": 0.2})


async def test_the_reaper_destroys_sessions_past_their_ttl(jp_fetch, jp_serverapp):
    app = sandbox_app(jp_serverapp)
    app.start_reaper()  # pytest-jupyter does not run the extension's start hook
    _, short = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 0.5})
    _, long = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    deadline = time.monotonic() + 15
    while (await call(jp_fetch, "sessions", short["id"]))[0] != 404:
        assert time.monotonic() < deadline, "the reaper never took the expired session"
        await asyncio.sleep(0.2)
    assert (await call(jp_fetch, "sessions", long["id"]))[0] == 200


async def test_shutdown_stops_its_sessions_and_keeps_persistent_workspaces(
    jp_fetch, jp_ws_fetch, jp_serverapp
):
    app = sandbox_app(jp_serverapp)
    sandbox = app.sandbox
    _, ephemeral = await call(jp_fetch, "sessions", method="POST", body={})
    _, durable = await call(
        jp_fetch,
        "sessions",
        method="POST",
        body={"durability": "persistent", "workspace_key": "shutdown-keep"},
    )
    await call(jp_fetch, "sessions", durable["id"], "files", "kept.txt", method="PUT", raw=b"kept")
    ws = await jp_ws_fetch("api", "sandbox", "sessions", ephemeral["id"], "exec", "ws")
    await ws.write_message('{"type": "start", "argv": ["sleep", "60"], "timeout_seconds": 60}')
    assert '"started"' in await ws.read_message()
    await app.stop_extension()
    # the interactive command ended with its session: one final message, then the socket closes
    assert json.loads(await ws.read_message())["type"] in ("exit", "error")
    assert await ws.read_message() is None
    listed = {info.id for info in await sandbox.list()}
    assert ephemeral["id"] not in listed and durable["id"] not in listed
    # the REST sessions were the server's owner's: so is the workspace (keys are a namespace per owner)
    again = await sandbox.create(
        SessionSpec(durability="persistent", workspace_key="shutdown-keep", owner=server_owner())
    )
    try:
        assert await again.get_file("kept.txt") == b"kept"
    finally:
        await again.destroy(remove_workspace=True)
        await sandbox.close()


async def test_a_restarted_server_reaps_what_an_earlier_one_left(jp_fetch, jp_serverapp, provider, tmp_path):
    app = sandbox_app(jp_serverapp)
    # an "earlier server": another provider instance on the same engine or root, which then went away
    earlier = type(app.sandbox.provider)(**_same_place(app.sandbox.provider))
    left = await earlier.create(SessionSpec(ttl_seconds=0.3, isolation="none", consumer="earlier-server"))
    del earlier
    await asyncio.sleep(0.5)
    assert left.id in await app.reap_once()


def _same_place(provider):
    if provider.kind == "local":
        return {"root": provider.root}
    return {"image": provider.image, "extra_labels": dict(provider.extra_labels)}
