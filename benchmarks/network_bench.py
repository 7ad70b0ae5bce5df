"""Per-owner session networks (issue 24.5, issue 29): what they cost at create, measured in the same run.

    python benchmarks/network_bench.py [--quick] [--json FILE]

Create to first command (``create()`` then ``exec(["sh", "-c", ":"])``; the session is destroyed
afterwards, outside the timing), alternating round-robin between:

* **egress, default bridge**: the code before per-owner egress bridges (a provider whose egress
  sessions join the engine's default bridge) -- the baseline;
* **egress, new owner**: a session of an owner with no network yet (its bridge with its own subnet,
  and the host firewall rules when the server can set them, are made; they go with the session);
* **egress, owner with a network**: a second session of an owner whose bridge exists;

then the create latency of an ``internal`` session of a new owner while 1, 100 and 200 owner networks
already exist on the engine (each held by a live internal session), against the one at 1.

Prints medians, p95 and ratios against the baseline; ratios are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

from jupyter_tai_sandbox.contract import SandboxError, SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.providers.docker.containers import ContainerStarts

LABEL = {"jupyter-tai-sandbox.bench": "networks"}
POOL = "10.217.0.0/16"


class DefaultBridgeStarts(ContainerStarts):
    def options(self, spec: SessionSpec, *args: Any, **kwargs: Any) -> dict[str, Any]:
        options = super().options(spec, *args, **kwargs)
        if spec.network == "egress":
            options["network_mode"] = "bridge"
        return options


class DefaultBridgeSandbox(DockerSandbox):
    """The provider as it was before per-owner egress bridges: egress sessions on the default bridge."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._starts = DefaultBridgeStarts(self, self._engine)

    def _network_of(self, spec: SessionSpec) -> str | None:
        return super()._network_of(spec) if spec.network == "internal" else None


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def create_to_first(sandbox: DockerSandbox, spec: SessionSpec) -> float:
    started = time.perf_counter()
    session = await sandbox.create(spec)
    try:
        await session.exec(["sh", "-c", ":"], timeout_seconds=30)
        return (time.perf_counter() - started) * 1000
    finally:
        await session.destroy()


async def hold_owners(sandbox: DockerSandbox, held: list[Any], count: int) -> None:
    """Live internal sessions of ``count`` owners in all (their networks stay)."""
    gate = asyncio.Semaphore(6)

    async def one(i: int) -> None:
        async with gate:
            held.append(
                await sandbox.create(SessionSpec(owner=f"held-{i:03d}", network="internal", ttl_seconds=1800))
            )

    await asyncio.gather(*(one(i) for i in range(len(held), count)))


async def main(quick: bool) -> dict[str, list[float]]:
    rounds = 4 if quick else 12
    new = DockerSandbox(
        image=DEFAULT_IMAGE, extra_labels=LABEL, network_pool=POOL, deployment="bench-networks"
    )
    old = DefaultBridgeSandbox(
        image=DEFAULT_IMAGE, extra_labels=LABEL, network_pool=POOL, deployment="bench-networks"
    )
    rows: dict[str, list[float]] = {}
    held: list[Any] = []
    try:
        keeper = await new.create(SessionSpec(owner="kept", ttl_seconds=1800))  # its bridge stays
        held.append(keeper)
        for i in range(rounds):
            rows.setdefault("egress, default bridge (before)", []).append(
                await create_to_first(old, SessionSpec(owner=f"old-{i}", ttl_seconds=300))
            )
            rows.setdefault("egress, new owner (bridge made)", []).append(
                await create_to_first(new, SessionSpec(owner=f"new-{i}", ttl_seconds=300))
            )
            rows.setdefault("egress, owner with a bridge", []).append(
                await create_to_first(new, SessionSpec(owner="kept", ttl_seconds=300))
            )
        for count in (1, 100, 200):
            await hold_owners(new, held, count if count > 1 else 1)  # the keeper's egress bridge is the first
            name = f"internal, new owner, {count} owner networks"
            for i in range(max(3, rounds // 2)):
                rows.setdefault(name, []).append(
                    await create_to_first(
                        new, SessionSpec(owner=f"probe-{count}-{i}", network="internal", ttl_seconds=300)
                    )
                )
    finally:
        gate = asyncio.Semaphore(6)

        async def drop(session: Any) -> None:
            async with gate:
                with contextlib.suppress(SandboxError):
                    await session.destroy()

        await asyncio.gather(*(drop(s) for s in held))
        await new.close()
        await old.close()
    return rows


def report(rows: dict[str, list[float]]) -> None:
    baselines = {
        "egress": "egress, default bridge (before)",
        "internal": "internal, new owner, 1 owner networks",
    }
    print(f"{'create to first command':48} {'median ms':>10} {'p95 ms':>8} {'ratio':>7}")
    for name, values in rows.items():
        base = rows[baselines[name.split(",")[0]]]
        ratio = statistics.median(values) / statistics.median(base)
        print(f"{name:48} {statistics.median(values):10.1f} {p95(values):8.1f} {ratio:6.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    measured = asyncio.run(main(args.quick))
    report(measured)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(measured, f, indent=2)
