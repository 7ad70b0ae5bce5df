"""Where a cold docker create goes (issue 56.1): one create -> first command with the pool off, broken down.

Every coroutine method of the provider's engine adapter (``DockerEngine``: the Docker API calls, the agent's
connection) is timed while a create and its first command run; the time not inside an engine call is the
provider's own work (Python, the agent's handshake, waits). Next to it, the engine's own floor of the same run:
an idle container's create + start + one ``exec`` through the raw API (docker-py's low-level client, same
image), which is what the create cannot beat.

``python benchmarks/create_breakdown.py [--rounds N] [--image IMAGE]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import BENCH_LABEL, TRUE_DOCKER, _docker_client, _docker_sandbox, engine_floor, timed_engine_calls

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE


async def main(rounds: int, image: str) -> None:
    sandbox = _docker_sandbox(image)
    await sandbox.list()  # connected: the engine's version, arch, images asked once, as a server's start does
    warm = await sandbox.create(SessionSpec(image=image))  # the agent volume and the owner network made
    await warm.destroy()
    client = _docker_client()
    bridge = client.networks.create("tai-bench-floor-breakdown", driver="bridge", labels=BENCH_LABEL)
    totals: list[float] = []
    floors: list[float] = []
    bridge_floors: list[float] = []
    per_call: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for _ in range(rounds):
            floors.append(await asyncio.to_thread(engine_floor, client, image) * 1000)
            bridge_floors.append(await asyncio.to_thread(engine_floor, client, image, bridge.name) * 1000)
            with timed_engine_calls() as calls:
                started = time.perf_counter()
                session = await sandbox.create(SessionSpec(image=image))
                assert (await session.exec(TRUE_DOCKER, timeout_seconds=30)).exit_code == 0
                totals.append((time.perf_counter() - started) * 1000)
            await session.destroy()
            for name, values in calls.items():
                per_call[name].append(sum(values))
                per_call[f"{name} (calls)"].append(len(values))
    finally:
        await sandbox.close()
        bridge.remove()
        client.close()
    total, floor, on_bridge = (statistics.median(v) for v in (totals, floors, bridge_floors))
    print(f"create -> first command, pool off: {total:.1f} ms p50 over {rounds} rounds")
    print(f"engine floor (raw create + start + exec): {floor:.1f} ms p50 -> ratio {total / floor:.2f}x")
    print(f"engine floor on a user-defined bridge: {on_bridge:.1f} ms p50 -> ratio {total / on_bridge:.2f}x")
    print("engine calls inside one create (median ms per create, calls per create):")
    rows = sorted(
        ((name, statistics.median(v)) for name, v in per_call.items() if not name.endswith("(calls)")),
        key=lambda row: -row[1],
    )
    inside = 0.0
    for name, ms in rows:
        count = statistics.median(per_call[f"{name} (calls)"])
        inside += ms
        print(f"  {name:28s} {ms:8.1f} ms  x{count:g}")
    print(f"  {'(sum)':28s} {inside:8.1f} ms; outside engine calls ~{max(0.0, total - inside):.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.image))
