"""Deep paths against the engine pool (issue 24, point 9), on a real engine and a real server.

A path was once checked with one engine call per component, in the engine object's worker
threads: a 2000-deep folder chain made one listing cost about a thousand calls, and 48 such
listings at once filled the pool so that other users' execs got 503. Now a file request costs
the same few engine calls at any depth (one command in the session walks the path), every
provider refuses a path past the contract's caps before it looks at it, and one principal holds
at most its share of the worker threads.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from tornado.httpclient import AsyncHTTPClient

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import MAX_PATH_DEPTH, SandboxPathTooDeepError, SessionSpec
from jupyter_tai_sandbox.errors import SandboxQuotaError
from jupyter_tai_sandbox.fair_share import act_for
from jupyter_tai_sandbox.providers.docker_engine import DockerEngine
from tests.support import docker
from tests.support.docker import TEST_IMAGE
from tests.support.mcp import AdminOnlyAdmin, HeaderUsers
from tests.support.server import call, exec_call, server_config

pytestmark = [pytest.mark.docker]

#: the chain of the review: 2000 folders, one listing of which cost ~1000 engine calls
DEEP = "/".join(["d"] * 2000)
#: as deep as a path may be
DEEPEST = "/".join(["d"] * MAX_PATH_DEPTH)


# ------------------------------------------------------------ provider: O(1) engine calls


def test_listing_resolving_and_cwd_cost_the_same_engine_calls_at_any_depth(client):
    async def main():
        provider = docker.provider()
        session = await provider.create(SessionSpec(image=TEST_IMAGE, consumer="deep-paths"))
        engine = provider.engine
        try:
            made = await session.exec(
                ["sh", "-c", f"mkdir -p {DEEPEST} && echo x > {DEEPEST}/f"], timeout_seconds=60
            )
            assert made.exit_code == 0, made.stderr

            async def cost(operation) -> int:
                before = engine.calls
                await operation()
                return engine.calls - before

            for path in ("d", DEEPEST):
                listing = await cost(lambda p=path: session.list_files(p))
                resolving = await cost(lambda p=path: session.resolve_path(p))
                in_cwd = await cost(lambda p=path: session.exec(["pwd"], timeout_seconds=30, cwd=p))
                before = engine.calls
                assert session.resolve(path).endswith("/d")
                sync = engine.calls - before
                # a command's create, and its exit polled a few times: the depth is no factor
                assert listing <= 8 and resolving <= 8 and sync <= 8 and in_cwd <= 16, (
                    path.count("/"),
                    listing,
                    resolving,
                    sync,
                    in_cwd,
                )
            assert [e["name"] for e in await session.list_files(DEEPEST)] == ["f"]
            with pytest.raises(SandboxPathTooDeepError):
                await session.list_files(DEEPEST + "/d")
            before = engine.calls
            with pytest.raises(SandboxPathTooDeepError):
                await session.list_files(DEEP)
            with pytest.raises(SandboxPathTooDeepError):
                session.resolve(DEEP)
            assert engine.calls == before, "a path past the caps reached the engine"
        finally:
            await session.destroy()
            await provider.close()

    asyncio.run(main())


# ------------------------------------------------------------ the engine pool's shares


def test_one_principal_holds_at_most_its_share_of_the_engine_threads(client):
    """48 of alice's engine calls that each hold a worker thread: she holds only her share of the
    32 threads, and bob's real engine calls still run at once; hers wait (429 past the timeout)."""

    async def main():
        engine = DockerEngine("unix:///var/run/docker.sock", timeout=3.0, threads_per_principal=8)
        release = threading.Event()
        busy = []
        lock = threading.Lock()
        most = 0

        def hold() -> None:
            nonlocal most
            with lock:
                busy.append(1)
                most = max(most, len(busy))
            release.wait(20)
            with lock:
                busy.pop()

        async def alice_call():
            act_for("alice")
            await engine.blocking(hold)

        async def bob_call():
            act_for("bob")
            started = time.monotonic()
            await engine.containers("tai-sandbox-test.no-such-label")
            return time.monotonic() - started

        try:
            await engine.connect()
            flood = [asyncio.ensure_future(alice_call()) for _ in range(48)]
            await asyncio.sleep(0.5)
            assert most == 8 and engine.share.held("alice") == 8
            took = await asyncio.gather(*(bob_call() for _ in range(8)))
            assert max(took) < 2.0, took  # none waited behind alice's calls
            results = await asyncio.gather(*flood, return_exceptions=True)
            # none of alice's calls ever ran beyond her share; those that waited too long were told why
            assert most == 8
            refused = [r for r in results if isinstance(r, SandboxQuotaError)]
            assert len(refused) == 40 and "engine_threads_per_user" in str(refused[0]), results
            assert engine.share.held("alice") == 8  # her abandoned calls hold their threads until they end
        finally:
            release.set()
            await asyncio.sleep(0.2)
            assert engine.share.held("alice") == 0
            await engine.close()

    asyncio.run(main())


# ------------------------------------------------------------ through REST, two users


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "docker",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={"max_sessions_per_user": 2, "max_ttl_seconds": 600.0},
    )


async def create(jp_fetch, user):
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300}, headers={"X-Test-User": user}
    )
    assert status == 201, info
    return info["id"]


async def run(jp_fetch, user, sid, argv):
    return await exec_call(jp_fetch, sid, argv, 60, headers={"X-Test-User": user})


async def test_a_path_past_the_depth_cap_answers_its_typed_error_through_rest(jp_fetch):
    sid = await create(jp_fetch, "alice")
    try:
        engine = sandboxes.installed().provider.engine
        before = engine.calls
        for path in (DEEP, DEEPEST + "/d", "x" * 5000):
            for method, parts, kwargs in (
                ("GET", ("files", path), {}),
                ("GET", ("resolve",), {"params": {"path": path}}),
                ("PUT", ("files", path), {"raw": b"x"}),
                ("DELETE", ("files", path), {}),
                ("PATCH", ("files", "a"), {"body": {"path": path}}),
            ):
                status, body = await call(
                    jp_fetch,
                    "sessions",
                    sid,
                    *parts,
                    method=method,
                    headers={"X-Test-User": "alice"},
                    **kwargs,
                )
                assert status == 400 and body["error"] == "SandboxPathTooDeepError", (method, parts[0], body)
        # only the session lookups reached the engine, no path walk
        assert engine.calls - before <= 3 * 5 * 8, engine.calls - before
        status, body = await call(
            jp_fetch, "sessions", sid, "resolve", params={"path": DEEPEST}, headers={"X-Test-User": "alice"}
        )
        assert status == 200 and body["resolved"] == "/workspace/" + DEEPEST, body
    finally:
        await call(jp_fetch, "sessions", sid, method="DELETE", headers={"X-Test-User": "alice"})


async def test_one_users_flood_of_deep_listings_leaves_another_users_execs_alone(
    jp_fetch, jp_http_port, jp_base_url, jp_auth_header
):
    """alice sends 48 listings of a 2000-deep chain and 48 of the deepest allowed path at once
    (on the old code each deep one held a worker thread for ~2000 engine calls, and bob's execs
    got 503); bob's execs all answer 200 meanwhile."""
    alice, bob = await create(jp_fetch, "alice"), await create(jp_fetch, "bob")
    # unlike jp_fetch's shared client (10 at once), a client of our own sends all 96 together
    http = AsyncHTTPClient(force_instance=True, max_clients=128)
    try:
        # the review's chain, 2000 deep (4000 bytes: one mkdir -p), and the deepest allowed path
        status, made = await run(jp_fetch, "alice", alice, ["sh", "-c", f"mkdir -p {DEEP} {DEEPEST}"])
        assert status == 200 and made["exit_code"] == 0, made

        base = f"http://localhost:{jp_http_port}{jp_base_url}api/sandbox/sessions/{alice}/files/"

        async def listing(path: str) -> int:
            response = await http.fetch(
                base + path,
                headers={**jp_auth_header, "X-Test-User": "alice"},
                raise_error=False,
                request_timeout=120,
            )
            return response.code

        async def bob_execs() -> list[tuple[int, object]]:
            await asyncio.sleep(0.3)  # alice's flood is under way
            answers = []
            for _ in range(5):
                answers.append(await run(jp_fetch, "bob", bob, ["echo", "still here"]))
            return answers

        flood = asyncio.gather(*(listing(DEEP) for _ in range(48)), *(listing(DEEPEST) for _ in range(48)))
        answers, codes = await asyncio.gather(bob_execs(), flood)
        assert [status for status, _ in answers] == [200] * 5, answers
        assert all(body["stdout"] == "still here\n" for _, body in answers)
        assert codes[:48] == [400] * 48, codes[:48]
        assert set(codes[48:]) <= {200, 429}, codes[48:]  # alice may be told to slow down, never 503
    finally:
        http.close()
        for user, sid in (("alice", alice), ("bob", bob)):
            await call(jp_fetch, "sessions", sid, method="DELETE", headers={"X-Test-User": user})


def test_the_depth_cap_is_the_same_on_every_provider(tmp_path):
    from jupyter_tai_sandbox.providers.local import LocalSandbox

    async def main():
        provider = LocalSandbox(root=str(tmp_path / "root"))
        session = await provider.create(SessionSpec(consumer="deep-paths", isolation="none"))
        try:
            for bad in (DEEP, DEEPEST + "/d"):
                with pytest.raises(SandboxPathTooDeepError):
                    session.resolve(bad)
                with pytest.raises(SandboxPathTooDeepError):
                    await session.list_files(bad)
                with pytest.raises(SandboxPathTooDeepError):
                    await session.put_file(bad, b"x")
            assert (await session.resolve_path(DEEPEST)).endswith("/d")
        finally:
            await session.destroy()
            await provider.close()

    asyncio.run(main())


def test_the_depth_error_is_a_400_and_round_trips_through_the_client():
    from jupyter_tai_sandbox.errors import error_body, error_from_json, error_status

    error = SandboxPathTooDeepError("too deep")
    assert error_status(error) == 400
    assert isinstance(
        error_from_json(json.loads(json.dumps(error_body(error, 400)))), SandboxPathTooDeepError
    )
