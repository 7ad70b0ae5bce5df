"""The swarm provider vs the single-engine docker provider, measured in the same run, round-robin.

    python benchmarks/swarm_bench.py [--quick] [--json FILE]

Starts a three-node swarm with ``.ci/swarm up`` (root; torn down at the end, even
on failure) and measures, alternating between the two providers:

* **create to first command**: ``create()`` then ``exec(["sh", "-c", ":"])`` (the
  session is destroyed afterwards, outside the timing); docker on the default
  engine, swarm through its manager over TLS with commands on the task's node;
* **exec**: one ``exec`` of ``sh -c :`` in a live session;
* **sessions per minute**: sessions created, used once and destroyed back to back
  by 4 concurrent workers for a fixed time, on each provider.

Prints medians, p95 and the swarm/docker ratio; ratios are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.providers.swarm import SwarmSandbox

REPO = Path(__file__).resolve().parent.parent
ROOT = Path(os.environ.get("TAI_SWARM_ROOT", "/var/lib/tai-swarm"))
LABEL = {"jupyter-tai-sandbox.bench": "swarm"}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def swarm(*args: str) -> None:
    subprocess.run(
        ["bash", str(REPO / ".ci" / "swarm"), *args],
        check=True,
        timeout=300,
        env={**os.environ, "TAI_SWARM_IMAGES": DEFAULT_IMAGE},
    )


def providers() -> dict[str, Any]:
    tls = ROOT / "tls"
    return {
        "docker": DockerSandbox(image=DEFAULT_IMAGE, extra_labels=LABEL),
        "swarm": SwarmSandbox(
            base_url="tcp://10.213.7.11:2376",
            tls_ca=str(tls / "ca.pem"),
            tls_cert=str(tls / "cert.pem"),
            tls_key=str(tls / "key.pem"),
            image=DEFAULT_IMAGE,
            extra_labels=LABEL,
        ),
    }


async def create_to_first(sandbox: Any) -> float:
    started = time.perf_counter()
    session = await sandbox.create(SessionSpec(ttl_seconds=300))
    try:
        await session.exec(["sh", "-c", ":"], timeout_seconds=30)
        return (time.perf_counter() - started) * 1000
    finally:
        await session.destroy()


async def one_exec(session: Any) -> float:
    started = time.perf_counter()
    await session.exec(["sh", "-c", ":"], timeout_seconds=30)
    return (time.perf_counter() - started) * 1000


async def throughput(sandbox: Any, seconds: float, workers: int = 4) -> float:
    """Sessions per minute: create, one command, destroy, by ``workers`` at once."""
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop:
            session = await sandbox.create(SessionSpec(ttl_seconds=300))
            try:
                await session.exec(["sh", "-c", ":"], timeout_seconds=30)
            finally:
                await session.destroy()
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return done * 60 / (time.monotonic() - started)


async def measure(rounds: int, seconds: float) -> dict[str, Any]:
    both = providers()
    samples: dict[str, list[float]] = {f"{kind} {what}": [] for kind in both for what in ("create", "exec")}
    rates: dict[str, float] = {}
    nodes: set[str] = set()  # where the swarm put the exec session
    try:
        for sandbox in both.values():  # warm up: connections, first containers
            await create_to_first(sandbox)
        for _ in range(rounds):
            for name, sandbox in both.items():
                samples[f"{name} create"].append(await create_to_first(sandbox))
        for name, sandbox in both.items():
            session = await sandbox.create(SessionSpec(ttl_seconds=300))
            try:
                if name == "swarm":
                    nodes.add(session.placement.hostname)
                for _ in range(rounds):
                    samples[f"{name} exec"].append(await one_exec(session))
            finally:
                await session.destroy()
        for name, sandbox in both.items():
            rates[name] = await throughput(sandbox, seconds)
    finally:
        for sandbox in both.values():
            await sandbox.close()
    return {"samples": samples, "sessions_per_minute": rates, "exec_session_node": sorted(nodes)}


def report(result: dict[str, Any]) -> None:
    samples = result["samples"]
    print(f"{'row':<16} {'median ms':>10} {'p95 ms':>10}")
    for name, values in samples.items():
        print(f"{name:<16} {statistics.median(values):10.1f} {p95(values):10.1f}")
    for what in ("create", "exec"):
        ratio = statistics.median(samples[f"swarm {what}"]) / statistics.median(samples[f"docker {what}"])
        print(f"ratio swarm/docker {what}: {ratio:.2f}x")
    rates = result["sessions_per_minute"]
    for name, rate in rates.items():
        print(f"{name} sessions per minute (4 workers): {rate:.0f}")
    print(f"ratio swarm/docker sessions per minute: {rates['swarm'] / rates['docker']:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--json", default=None, help="also write the samples to this JSON file")
    args = parser.parse_args()
    rounds, seconds = (4, 10.0) if args.quick else (15, 30.0)
    swarm("down")
    try:
        swarm("up")
        result = asyncio.run(measure(rounds, seconds))
    finally:
        swarm("down")
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
