"""Many live docker sessions on one engine (issue 56, targets 3 and 4).

Two measurements, each against its baseline of the same run:

* **Scale**: sessions of several owners (an owner's network holds 61 at the default /26) made up to 10, then up
  to ``--sessions`` (1,000 by default). At each level: a create's latency p50 and its first command's (a few
  new sessions made), a one-shot's on random live ones (each ran one when made, so its agent connection is
  open at every level alike) and ``list()`` p50, with the engine's own listing of the sessions beside it. Beside
  each create, the engine's own floor at that level (an idle container's create + start + exec through the raw
  API, on the same owner's network) and the engine calls inside the create: what the engine itself charges
  with that many containers, apart from what the provider adds. Beside it too, a create from a warm pool of POOL
  (a provider of the same deployment with a pool, refilled before each; one owner's creates, one after another)
  and its first command: what a deployment that runs many sessions gets with the pool on. The targets are create, its first command and
  exec within 1.3x of 10 sessions, the create against the engine's floor within 1.3x of that ratio at 10, and
  list p50 <= 50 ms at the top level (each verdict prints both numbers and their ratio). The provider runs in this process: its RSS
  growth from 10 sessions to the top is printed (what a server holds per session), and the engine host's
  memory as ``free`` sees it.
* **Burst**: a warm pool of 100 filled (its fill time printed), then 100 creates at once of 10 owners new to
  the engine: creates per second, target >= 20/s; each create's latency, and a claim's breakdown (waiting for the
  owner network to be made, the join to it, the record volume).

``python benchmarks/scale.py [--sessions N] [--concurrency C] [--skip-burst] [--skip-scale]``. It removes
everything it made, also when interrupted (the sessions carry the benchmark's label).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import resource
import secrets
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import _docker_client, engine_floor, time_calls, timed_engine_calls
from _groups import TRUE_DOCKER, _docker_sandbox

from jupyter_tai_sandbox.contract import SandboxError, SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_SESSION

OWNERS = 20
#: the warm pool of the scale run's pooled creates (the same deployment; 0 in the provider's default)
POOL = 4
PROBES = 12
#: how long the burst waits for its pool to fill (the burst then takes what is ready)
FILL_SECONDS = 300


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def host_used_gib() -> float:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / (1 << 20)


def spec(owner: str) -> SessionSpec:
    return SessionSpec(image=DEFAULT_IMAGE, consumer="bench-scale", owner=owner, ttl_seconds=3600)


async def probe(sandbox: Any, live: list[Any], owners: list[str]) -> dict[str, float]:
    """Create latency p50 and its first command's (the agent connection opens then), a one-shot's on a random
    live session (each ran one when made: its connection is open, at every level alike) and list p50 with
    ``live`` sessions (the probes' own go again), and the engine's own listing of the deployment's session
    containers (the SDK's call alone, no provider: what a list from a fresh listing would cost at the least).

    Beside each create, the engine's floor at this level: an idle container's create + start + exec through the
    raw API on the same owner's network (what the engine itself charges with this many containers), and the
    engine calls inside the create (``engine_<call>_ms``: median per create)."""
    creates, firsts, execs, lists, listings, floors = [], [], [], [], [], []
    per_call: dict[str, list[float]] = collections.defaultdict(list)
    client = _docker_client()
    try:
        for i in range(PROBES):
            owner_spec = spec(owners[i % len(owners)])
            with timed_engine_calls() as calls:
                started = time.perf_counter()
                session = await sandbox.create(owner_spec)
                creates.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                assert (await session.exec(TRUE_DOCKER, timeout_seconds=60)).exit_code == 0
                firsts.append((time.perf_counter() - started) * 1000)
            for name, values in calls.items():
                per_call[name].append(sum(values))
            # the owner's network is there now (made by the create when it was not)
            network = str(sandbox._network_of(owner_spec))
            floors.append(await asyncio.to_thread(engine_floor, client, DEFAULT_IMAGE, network) * 1000)
            await session.destroy()
            target = random.choice(live)
            started = time.perf_counter()
            assert (await target.exec(TRUE_DOCKER, timeout_seconds=60)).exit_code == 0
            execs.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await sandbox.list()
            lists.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await sandbox.engine.containers(LABEL_SESSION)
            listings.append((time.perf_counter() - started) * 1000)
    finally:
        client.close()
    return {
        "create_ms": statistics.median(creates),
        "first_exec_ms": statistics.median(firsts),
        "exec_ms": statistics.median(execs),
        "list_ms": statistics.median(lists),
        "engine_listing_ms": statistics.median(listings),
        "engine_floor_ms": statistics.median(floors),
        # a call not made in every create counts 0 in the others
        **{
            f"engine_{name}_ms": statistics.median(v + [0.0] * (PROBES - len(v)))
            for name, v in per_call.items()
        },
    }


async def pooled_probe(pooled: Any, owner: str) -> dict[str, float]:
    """A create from a warm pool (``pooled``: a provider of the same deployment with a pool) and its first
    command, p50 over PROBES creates of one owner (as a user makes one session after another: the pool keeps
    spares on their network, as run.py's pool row measures it), each once the pool has refilled (its refill is
    background work, not the create's)."""
    creates, firsts = [], []
    for _ in range(PROBES):
        await wait_pool(pooled)
        started = time.perf_counter()
        session = await pooled.create(spec(owner))
        creates.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        assert (await session.exec(TRUE_DOCKER, timeout_seconds=60)).exit_code == 0
        firsts.append((time.perf_counter() - started) * 1000)
        await session.destroy()
    return {"pooled_create_ms": statistics.median(creates), "pooled_first_exec_ms": statistics.median(firsts)}


async def wait_pool(pooled: Any) -> None:
    """Until the pool holds all it should (at most FILL_SECONDS: a create then starts its own container)."""
    deadline = time.monotonic() + FILL_SECONDS
    while pooled._pool.ready_count() < pooled.pool_size and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def level(n: int, seen: dict[str, float]) -> str:
    calls = sorted(
        (
            (key[len("engine_") : -len("_ms")], ms)
            for key, ms in seen.items()
            if key.startswith("engine_") and ms >= 1
        ),
        key=lambda row: -row[1],
    )
    return (
        f"{n} sessions: create p50 {seen['create_ms']:.1f} ms (its first command {seen['first_exec_ms']:.1f} ms; "
        f"the engine's floor on the owner's network {seen['engine_floor_ms']:.1f} ms), "
        f"exec p50 {seen['exec_ms']:.1f} ms, "
        f"list p50 {seen['list_ms']:.1f} ms (the engine's own listing of them {seen['engine_listing_ms']:.1f} ms); "
        f"from a warm pool: create p50 {seen['pooled_create_ms']:.1f} ms, "
        f"its first command {seen['pooled_first_exec_ms']:.1f} ms\n"
        f"  engine calls in a create + first command (p50 ms): "
        + ", ".join(f"{name} {ms:.1f}" for name, ms in calls if name not in ("floor", "listing"))
    )


async def sweep(sandbox: Any, owners: list[str]) -> int:
    """Destroy every session of this run's owners still on the engine (a create under way when the run was
    stopped is in no list of ours); how many."""
    mine = set(owners)
    left = [i for i in await sandbox.list() if i.spec.owner in mine]
    for info in left:
        with contextlib.suppress(SandboxError):
            await (await sandbox.get(info.id)).destroy()
    return len(left)


async def scale(sessions: int, concurrency: int) -> list[tuple[str, bool, str]]:
    run = secrets.token_hex(3)  # this run's owners: its sweep leaves other runs' sessions alone
    owners = [f"scale-{run}-{i}" for i in range(max(OWNERS, -(-sessions // 50)))]
    sandbox = _docker_sandbox(DEFAULT_IMAGE)
    # the same deployment with a warm pool (its containers wait on the pool's own holding network)
    pooled = _docker_sandbox(DEFAULT_IMAGE, pool_size=POOL)
    live: list[Any] = []
    gate = asyncio.Semaphore(concurrency)

    async def make(i: int) -> None:
        async with gate:
            session = await sandbox.create(spec(owners[i % len(owners)]))
            live.append(session)
            # one command: its agent connection opens (a probe's exec at 10 sessions and at 1,000 alike finds
            # it open; the first command of a session is the probes' first_exec_ms)
            await session.exec(TRUE_DOCKER, timeout_seconds=60)

    try:
        await asyncio.gather(*(make(i) for i in range(10)))
        small = await probe(sandbox, live, owners)
        await pooled.list()  # connects: its pool fills
        small |= await pooled_probe(pooled, owners[0])
        rss_small, host_small = rss_mib(), host_used_gib()
        print(level(len(live), small), flush=True)
        started = time.perf_counter()
        step = 100
        while len(live) < sessions:
            await asyncio.gather(*(make(i) for i in range(len(live), min(sessions, len(live) + step))))
            print(f"  {len(live)} live ({time.perf_counter() - started:.0f} s)", flush=True)
        big = await probe(sandbox, live, owners) | await pooled_probe(pooled, owners[0])
        rss_big, host_big = rss_mib(), host_used_gib()
        print(level(len(live), big), flush=True)
        print(
            f"this process's RSS {rss_small:.0f} -> {rss_big:.0f} MiB "
            f"({(rss_big - rss_small) * 1024 / max(1, len(live) - 10):.1f} KiB a session); "
            f"the host's memory in use {host_small:.1f} -> {host_big:.1f} GiB",
            flush=True,
        )
    finally:
        stopped = sys.exc_info()[0] is not None  # an error, Ctrl-C or SIGTERM: creates may be under way
        await asyncio.shield(clean_up(sandbox, live, owners, gate, stopped))
        await asyncio.shield(pooled.close())
    n = len(live)
    create_ratio, exec_ratio = big["create_ms"] / small["create_ms"], big["exec_ms"] / small["exec_ms"]
    first_ratio = big["first_exec_ms"] / small["first_exec_ms"]
    pooled_ratio = big["pooled_create_ms"] / small["pooled_create_ms"]
    floor_ratio = big["engine_floor_ms"] / small["engine_floor_ms"]
    # the create and its first command against the engine's own create + start + exec at the same level
    own_small = (small["create_ms"] + small["first_exec_ms"]) / small["engine_floor_ms"]
    own_big = (big["create_ms"] + big["first_exec_ms"]) / big["engine_floor_ms"]
    return [
        (
            f"{n} sessions: create within 1.3x of 10",
            create_ratio <= 1.3,
            f"{create_ratio:.2f}x: {big['create_ms']:.1f} vs {small['create_ms']:.1f} ms; the engine's own floor "
            f"{floor_ratio:.2f}x: {big['engine_floor_ms']:.1f} vs {small['engine_floor_ms']:.1f} ms",
        ),
        (
            f"{n} sessions: a create to its first command against the engine's floor at the same level, "
            "within 1.3x of that at 10",
            own_big <= 1.3 * own_small,
            f"{own_big / own_small:.2f}x: {own_big:.2f}x the floor vs {own_small:.2f}x",
        ),
        (
            f"{n} sessions: a create from a warm pool of {POOL} within 1.3x of 10",
            pooled_ratio <= 1.3,
            f"{pooled_ratio:.2f}x: {big['pooled_create_ms']:.1f} vs {small['pooled_create_ms']:.1f} ms; its first "
            f"command {big['pooled_first_exec_ms']:.1f} vs {small['pooled_first_exec_ms']:.1f} ms",
        ),
        (
            f"{n} sessions: exec within 1.3x of 10",
            exec_ratio <= 1.3,
            f"{exec_ratio:.2f}x: {big['exec_ms']:.1f} vs {small['exec_ms']:.1f} ms",
        ),
        (
            f"{n} sessions: a new session's first command within 1.3x of 10",
            first_ratio <= 1.3,
            f"{first_ratio:.2f}x: {big['first_exec_ms']:.1f} vs {small['first_exec_ms']:.1f} ms",
        ),
        (
            f"{n} sessions: list p50 <= 50 ms",
            big["list_ms"] <= 50,
            f"{big['list_ms']:.1f} ms, {big['list_ms'] / 50:.2f}x the target; "
            f"the engine's own listing {big['engine_listing_ms']:.1f} ms",
        ),
    ]


async def clean_up(
    sandbox: Any, live: list[Any], owners: list[str], gate: asyncio.Semaphore, stopped: bool
) -> None:
    """Destroy the run's sessions; after a stop, also those a create under way made (their engine call
    goes on: looked for again a few seconds later)."""

    async def drop(session: Any) -> None:
        async with gate:
            with contextlib.suppress(SandboxError):
                await session.destroy()

    try:
        await asyncio.gather(*(drop(s) for s in live))
        left = await sweep(sandbox, owners)
        if stopped:
            await asyncio.sleep(5)
            left += await sweep(sandbox, owners)
        if left:
            print(f"removed {left} more sessions of this run (creates under way when it stopped)", flush=True)
    finally:
        await sandbox.close()


async def burst(count: int = 100) -> list[tuple[str, bool, str]]:
    """A pool of ``count`` filled (its fill time printed), then ``count`` creates at once of 10 owners new to
    the engine: creates per second, each create's latency, and where a claim's time goes (waiting for its owner
    network to be made, the join to it, the record volume)."""
    # a deployment of its own: its own holding network, and no other run's sessions in its lists
    sandbox = _docker_sandbox(DEFAULT_IMAGE, pool_size=count, deployment="bench-burst")
    pool = sandbox._pool
    made: list[Any] = []
    times: dict[str, list[float]] = collections.defaultdict(list)
    tag = secrets.token_hex(2)
    owners = [f"burst-{tag}-{i}" for i in range(10)]
    try:
        filling = time.monotonic()
        await sandbox.list()  # connects: the pool fills (several starts at once)
        deadline = filling + FILL_SECONDS
        while pool.ready_count() < count and time.monotonic() < deadline:
            if pool._filler is not None and pool._filler.done():
                break  # it gave up (its starts failed: the log says why)
            await asyncio.sleep(0.2)
        ready, fill = pool.ready_count(), time.monotonic() - filling
        print(f"burst: the pool held {ready} of {count} after {fill:.1f} s", flush=True)
        time_calls(times, "waiting for the owner network to be made", sandbox._pool_networks, "_made")
        time_calls(times, "join", sandbox._engine, "network_connect")
        time_calls(times, "record", pool, "claim")
        latencies: list[float] = []

        async def create(owner: str) -> Any:
            started = time.perf_counter()
            session = await sandbox.create(spec(owner))
            latencies.append((time.perf_counter() - started) * 1000)
            return session

        started = time.perf_counter()
        results = await asyncio.gather(
            *(create(owners[i % 10]) for i in range(count)), return_exceptions=True
        )
        seconds = time.perf_counter() - started
        made = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        pooled = sum(1 for s in made if getattr(s, "record", None) is not None)
        rate = len(made) / seconds
        print(
            f"burst: {len(made)} creates in {seconds:.2f} s ({rate:.1f}/s), {pooled} from the pool of {ready}; "
            f"{len(failed)} failed{': ' + repr(failed[0]) if failed else ''}",
            flush=True,
        )
        if latencies:
            print(
                f"burst: a create's latency p50 {statistics.median(latencies):.0f} ms, max {max(latencies):.0f} ms; "
                + ", ".join(
                    f"{name} p50 {statistics.median(v):.0f} ms (x{len(v)})" for name, v in times.items() if v
                ),
                flush=True,
            )
    finally:
        gate = asyncio.Semaphore(8)

        async def drop(session: Any) -> None:
            async with gate:
                with contextlib.suppress(SandboxError):
                    await session.destroy()

        await asyncio.gather(*(drop(s) for s in made))
        await sweep(sandbox, owners)  # a create under way when the run was stopped
        await sandbox.close()
    return [
        (
            f"a burst of {count} creates from the pool >= 20 creates/s",
            rate >= 20 and not failed,
            f"{rate:.1f}/s",
        ),
    ]


async def main(args: argparse.Namespace) -> int:
    # a SIGTERM (a `timeout`, a CI's stop) cancels the run, so its clean-ups run
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)  # type: ignore[union-attr]
    verdicts = []
    if not args.skip_burst:
        verdicts += await burst()
    if not args.skip_scale:
        verdicts += await scale(args.sessions, args.concurrency)
    for name, passed, seen in verdicts:
        print(f"target {'PASS' if passed else 'MISS'}: {name} ({seen})")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--skip-burst", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
