"""How long past its deadline a timed-out one-shot returns, local and docker: a command whose output ended with
the kill (the baseline), against one whose output a process it started with ``setsid`` still holds (the
timeout then carries the held-output note), same session, same run.

The provider decides "held" from state (the process group is dead and a pipe still has a writer; the agent's
word on each stream), not by a fixed wait, so the held case returns within milliseconds of the baseline.

``python benchmarks/stop_latency.py [--rounds N] [--skip-docker]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import _docker_sandbox

from jupyter_tai_sandbox.contract import SandboxExecTimeoutError, SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.local import LocalSandbox

DEADLINE = 0.3
#: a local session's holders outlive it (what a one-shot left running keeps running): for a few seconds only
ENDED = "head -c 1000 /dev/zero; exec sleep 5"
HELD = "setsid sleep 5 & head -c 1000 /dev/zero; sleep 5"


async def past_deadline(session: Any, script: str, rounds: int) -> tuple[list[float], int]:
    """ms past DEADLINE at which each timeout was raised, and how many carried the held-output note."""
    times, noted = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        try:
            await session.exec(["sh", "-c", script], timeout_seconds=DEADLINE)
        except SandboxExecTimeoutError as e:
            times.append((time.perf_counter() - started - DEADLINE) * 1000)
            noted += "held its output" in str(e)
        else:
            raise AssertionError(f"{script!r} ended within its {DEADLINE} s deadline")
    return times, noted


async def measure(name: str, sandbox: Any, spec: SessionSpec, rounds: int) -> bool:
    session = await sandbox.create(spec)
    try:
        ended, ended_noted = await past_deadline(session, ENDED, rounds)
        held, held_noted = await past_deadline(session, HELD, rounds)
    finally:
        await session.destroy()
        await sandbox.close()
    base, ours = statistics.median(ended), statistics.median(held)
    print(
        f"{name}: output ended with the kill: {base:.1f} ms past the deadline (p50; note on {ended_noted}/{rounds})"
    )
    print(
        f"{name}: output held by a setsid process: {ours:.1f} ms past the deadline (p50, max {max(held):.1f}; "
        f"note on {held_noted}/{rounds}), +{ours - base:.1f} ms over the baseline"
    )
    return ended_noted == 0 and held_noted == rounds


async def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="tai-bench-stop-") as root:
        right = await measure("local", LocalSandbox(root=root), SessionSpec(), args.rounds)
    if not args.skip_docker:
        right &= await measure(
            "docker", _docker_sandbox(DEFAULT_IMAGE), SessionSpec(image=DEFAULT_IMAGE), args.rounds
        )
    if not right:
        print("a timeout's note was not what its output was (see the counts above)")
    return 0 if right else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--skip-docker", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
