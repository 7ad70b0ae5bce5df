"""GET /api/sandbox/usage and the server's usage history (jupyter_tai_sandbox/usage_history.py): one request
answers every session of the caller from samples a sampler took, the history is bounded, the sampler stops
when nobody asks, and each user sees only their own sessions."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.api_spec import check
from tests.support.server import call, exec_call, sandbox_app, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

#: the sampler's pace in these tests (its minimum), so a test sees several rounds in a few seconds
INTERVAL = 1.0


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(
        provider,
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        UsageHistory={"interval_seconds": INTERVAL, "samples_kept": 4},
    )


async def create(jp_fetch, user: str = "alice", **spec) -> str:
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300, **spec}, headers=as_user(user)
    )
    assert status == 201, info
    return info["id"]


async def usage(jp_fetch, user: str = "alice", **params) -> dict:
    status, body = await call(jp_fetch, "usage", params=params, headers=as_user(user))
    check("/usage", "get", status, body)
    assert status == 200, body
    return body


def by_id(body: dict) -> dict[str, dict]:
    return {s["id"]: s for s in body["sessions"]}


async def wait_for(what: str, check_now, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check_now()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:g} s")


async def test_one_request_answers_every_session_from_the_samplers_rounds(jp_fetch, jp_serverapp, provider):
    history = sandbox_app(jp_serverapp).usage_history
    ids = [await create(jp_fetch, consumer=f"user:alice/kernel:k{i}") for i in range(3)]
    # work in the first session while the panel looks: a CPU-bound loop and a file on its disk
    busy = asyncio.ensure_future(
        exec_call(
            jp_fetch,
            ids[0],
            ["sh", "-c", "head -c 2000000 /dev/zero > big; timeout 6 sh -c 'while :; do :; done'; exit 0"],
            30,
            headers=as_user("alice"),
        )
    )
    try:
        # the first request starts the sampler and waits for its first round: every session has a sample
        first = await usage(jp_fetch)
        assert (
            first["sampling"] is True and first["interval_seconds"] == INTERVAL and first["samples_kept"] == 4
        )
        seen = by_id(first)
        assert sorted(seen) == sorted(ids)
        for sid in ids:
            entry = seen[sid]
            assert entry["serves"] == {"kind": "kernel", "name": f"k{ids.index(sid)}"}
            assert entry["consumer"] == f"user:alice/kernel:k{ids.index(sid)}" and entry["owner"] == "alice"
            assert len(entry["samples"]) == 1, entry
            assert entry["samples"][0]["disk_bytes"] is not None and entry["samples"][0]["cpu"] is None
            assert entry["last"]["measured_at"] == entry["samples"][0]["time"]
        # many refreshes measure nothing themselves: each session is measured once a round, whoever asks
        for _ in range(10):
            await usage(jp_fetch)
        assert history.measures <= 3 * history.rounds_started, (history.measures, history.rounds_started)
        # a few rounds later each session has several samples, newest last, and the busy one shows its work
        await wait_for("three samples", lambda: history.rounds >= 4)
        later = by_id(await usage(jp_fetch))
        samples = later[ids[0]]["samples"]
        assert len(samples) >= 3 and [s["time"] for s in samples] == sorted(s["time"] for s in samples)
        assert samples[-1]["disk_bytes"] >= 2_000_000
        if provider == "docker":
            assert all(s["memory_bytes"] > 0 for s in samples)
            # the loop's share of a core (a loaded machine gives it less than one), well over the idle one's
            busiest = max(s["cpu"] or 0 for s in samples)
            idle = max(s["cpu"] or 0 for s in later[ids[1]]["samples"])
            assert busiest > 0.05 and busiest > 3 * idle, (samples, later[ids[1]]["samples"])
        else:  # local cannot attribute CPU or memory to a session, and says so
            assert all(s["cpu"] is None and s["memory_bytes"] is None for s in samples)
            assert "cannot attribute" in later[ids[0]]["last"]["note"]
    finally:
        status, _ = await busy
    assert status == 200


async def test_the_history_is_bounded_and_forgets_gone_sessions(jp_fetch, jp_serverapp):
    history = sandbox_app(jp_serverapp).usage_history
    kept, gone = await create(jp_fetch), await create(jp_fetch)
    for _ in range(7):  # rounds taken directly (the sampler's own, without its waits)
        await history.sample_once({"alice"})
    answer = by_id(history.answer("alice"))
    assert [len(answer[sid]["samples"]) for sid in (kept, gone)] == [4, 4]  # UsageHistory.samples_kept
    times = [s["time"] for s in answer[kept]["samples"]]
    assert times == sorted(times) and len(set(times)) == 4
    status, _ = await call(jp_fetch, "sessions", gone, method="DELETE", headers=as_user("alice"))
    assert status == 204
    await history.sample_once({"alice"})
    assert list(by_id(history.answer("alice"))) == [kept]
    assert gone not in history._rings and gone not in history._sessions and gone not in history._last


async def test_the_sampler_stops_when_nobody_asks_and_starts_again(jp_fetch, jp_serverapp):
    history = sandbox_app(jp_serverapp).usage_history
    history.idle_seconds = 1.5
    sid = await create(jp_fetch)
    assert not history.running and history.rounds == 0  # nobody asked yet: nothing is measured
    await usage(jp_fetch)
    assert history.running
    await wait_for("the sampler to stop", lambda: not history.running, timeout=15)
    rounds, measures = history.rounds, history.measures
    await asyncio.sleep(2.5 * INTERVAL)
    assert (history.rounds, history.measures) == (rounds, measures)  # stopped: no round, no engine call
    again = by_id(await usage(jp_fetch))
    assert history.running and again[sid]["samples"]  # the next request starts it, and answers a sample
    assert history.rounds > rounds


async def test_each_user_sees_only_their_own_sessions(jp_fetch, jp_serverapp):
    history = sandbox_app(jp_serverapp).usage_history
    alices, bobs = await create(jp_fetch, "alice"), await create(jp_fetch, "bob")
    assert list(by_id(await usage(jp_fetch, "alice"))) == [alices]
    # only those who look have their sessions measured: bob has not asked yet
    assert alices in history._rings and bobs not in history._rings
    bob = by_id(await usage(jp_fetch, "bob"))
    assert list(bob) == [bobs] and bob[bobs]["samples"]
    # an admin gets their own (none here) unless they ask for every user's
    assert (await usage(jp_fetch, "admin"))["sessions"] == []
    assert sorted(by_id(await usage(jp_fetch, "admin", all="1"))) == sorted([alices, bobs])
    for params, status_wanted in (({"all": "1"}, 403), ({"all": "maybe"}, 400)):
        status, body = await call(jp_fetch, "usage", params=params, headers=as_user("alice"))
        check("/usage", "get", status, body)
        assert status == status_wanted, body


@pytest.mark.parametrize("provider", ["off"])
async def test_no_provider_answers_503(jp_fetch, provider):
    status, body = await call(jp_fetch, "usage")
    check("/usage", "get", status, body)
    assert status == 503 and body["error"] == "SandboxUnavailableError"


@pytest.mark.parametrize("provider", [pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_paused_session_is_not_measured(jp_fetch, jp_serverapp, provider):
    history = sandbox_app(jp_serverapp).usage_history
    sid = await create(jp_fetch)
    await history.sample_once({"alice"})
    status, _ = await call(jp_fetch, "sessions", sid, "pause", method="POST", headers=as_user("alice"))
    assert status == 200
    measures = history.measures
    await history.sample_once({"alice"})
    entry = by_id(history.answer("alice"))[sid]
    assert entry["paused"] is True and len(entry["samples"]) == 1 and history.measures == measures
    status, _ = await call(jp_fetch, "sessions", sid, "resume", method="POST", headers=as_user("alice"))
    assert status == 200
    await history.sample_once({"alice"})
    assert len(by_id(history.answer("alice"))[sid]["samples"]) == 2
