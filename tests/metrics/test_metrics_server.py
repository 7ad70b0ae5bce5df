"""The sandbox series on a real jupyter_server's /metrics, scraped over HTTP, after a scripted workload:
each counter and histogram moves by exactly what the workload did, for every provider."""

from __future__ import annotations

import json

import pytest

from jupyter_tai_sandbox.contract import SandboxError, SessionSpec
from tests.metrics.scrape import key, moved, scrape
from tests.support.server import call, exec_call, read_all, sandbox_app, server_config

pytestmark = [pytest.mark.slow(20)]


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes", SandboxApp={"live_command_grace_seconds": 0})


async def new_session(jp_fetch) -> str:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    assert status == 201, info
    return info["id"]


async def ws_exec(jp_ws_fetch, session_id: str, argv: list[str], *, kill=None):
    """An interactive command over the websocket; ``kill``: once it printed ready, await kill() then kill it."""
    ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws")
    await ws.write_message(json.dumps({"type": "start", "timeout_seconds": 60, "argv": argv}))
    assert json.loads(await ws.read_message())["type"] == "started"
    if kill is not None:
        assert await ws.read_message() == b"\x01ready\n"
        await kill()
        await ws.write_message(json.dumps({"type": "kill"}))
    return await read_all(ws, seconds=30)


async def test_a_workload_moves_each_series_by_exactly_what_it_did(
    jp_fetch, jp_ws_fetch, jp_serverapp, provider
):
    before = await scrape(jp_fetch)
    sid = await new_session(jp_fetch)
    # a create that fails in the gate (caps beyond what the provider allows), by server-side code
    with pytest.raises(SandboxError) as failed:
        await sandbox_app(jp_serverapp).sandbox.create(SessionSpec(cpu=1000.0, ttl_seconds=60))
    failed_as = type(failed.value).__name__
    # a request the policy refuses at the REST door (caps beyond what the provider allows): a refusal
    status, body = await call(jp_fetch, "sessions", method="POST", body={"cpu": 1000.0, "ttl_seconds": 60})
    assert status == 400, body
    refused_as = body["error"]
    assert (await exec_call(jp_fetch, sid, ["echo", "hi"]))[1]["exit_code"] == 0  # 3 bytes of stdout
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", "echo err >&2; exit 3"])  # 4 of stderr
    assert (status, result["exit_code"]) == (200, 3)
    status, body = await exec_call(jp_fetch, sid, ["sleep", "30"], 1)
    assert status == 504 and body["error"] == "SandboxExecTimeoutError", body
    _out, _err, final, _ = await ws_exec(jp_ws_fetch, sid, ["printf", "abcde"])
    assert final == {"type": "exit", "exit_code": 0}
    live = key("live_commands", state="running")

    async def while_it_runs() -> None:  # the live command is held while it runs
        assert (await scrape(jp_fetch))[live] == 1

    _out, _err, final, _ = await ws_exec(
        jp_ws_fetch, sid, ["sh", "-c", "echo ready; exec sleep 60"], kill=while_it_runs
    )
    assert final == {"type": "exit", "exit_code": 137}
    during = await scrape(jp_fetch)
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE")
    assert status == 204
    after = await scrape(jp_fetch)

    p = provider
    one, inter = {"provider": p, "mode": "one_shot"}, {"provider": p, "mode": "interactive"}
    # the live session is counted while it lives, and no longer once destroyed
    running = key("sessions", provider=p, state="running")
    assert during[running] - before.get(running, 0) == 1 and after[running] == before.get(running, 0)
    assert key("sessions", provider=p, state="paused") in after

    changes = moved(before, after)
    # sessions: a create ok, one failed in the gate, one refused at the door, a destroy
    expected = {
        key("session_creates_total", provider=p, outcome="ok"): 1,
        key("session_creates_total", provider=p, outcome="error"): 1,
        key("session_create_failures_total", provider=p, error=failed_as): 1,
        key("session_events_total", provider=p, event="destroy"): 1,
        key("refusals_total", door="rest", error=refused_as): 1,
        key("session_create_seconds_count", provider=p, outcome="ok"): 1,
        key("session_create_seconds_count", provider=p, outcome="error"): 1,
        key("execs_total", outcome="ok", **one): 1,
        key("execs_total", outcome="nonzero", **one): 1,
        key("execs_total", outcome="timeout", **one): 1,
        key("execs_total", outcome="ok", **inter): 1,
        key("execs_total", outcome="killed", **inter): 1,
        key("exec_timeouts_total", **one): 1,
        key("exec_kills_total", cause="signal", **inter): 1,
        key("exec_seconds_count", **one): 3,
        key("exec_seconds_count", **inter): 2,
        key("exec_output_bytes_total", provider=p, stream="stdout"): 3 + 5 + 6,  # hi, abcde, ready
        key("exec_output_bytes_total", provider=p, stream="stderr"): 4,
    }
    for k, value in expected.items():
        assert changes.pop(k, 0) == value, (k, value)
    # the histograms' sums and buckets: every observation under +Inf, the timeout's (>= 1 s) above 0.5 s
    for labels, count in ((one, 3), (inter, 2)):
        assert changes.pop(key("exec_seconds_bucket", le="+Inf", **labels)) == count
        assert changes.pop(key("exec_seconds_sum", **labels)) > 0
    assert changes[key("exec_seconds_bucket", le="300.0", **one)] == 3
    assert changes.get(key("exec_seconds_bucket", le="0.5", **one), 0) <= 2
    assert changes[key("exec_seconds_bucket", le="2.5", **one)] == 3
    for outcome in ("ok", "error"):
        assert changes.pop(key("session_create_seconds_bucket", le="+Inf", provider=p, outcome=outcome)) == 1
    # nothing else moved but buckets and sums (the pool and engine series are the docker test's)
    others = {
        k: v
        for k, v in changes.items()
        if not k[0].endswith(("_bucket", "_sum"))
        and not k[0].startswith(("jupyter_tai_sandbox_pool_", "jupyter_tai_sandbox_engine_"))
        and k[0] != "jupyter_tai_sandbox_sessions"
    }
    assert others == {}
    # the live commands gauge counts what the server holds now: nothing
    assert after[key("live_commands", state="running")] == 0
    assert sandbox_app(jp_serverapp).metrics.enabled
