"""Side-by-side benchmarks: our API against the raw mechanisms underneath it, and a peer.

One entry point: ``python benchmarks/run.py`` (``--quick`` for fewer rounds,
``--only NAME`` to run some groups: local, docker, create, stream, server, peer, agent, kernel, vm,
observability;
``--out DIR`` for the results folder).
Every baseline is measured in the same run on the same machine; the table shows
medians, p95 and the ratio to the baseline, then each target with PASS or MISS.
Results go to ``benchmarks/results/`` as JSON and a PNG chart. Everything stays on
this machine: the Docker engine's local socket and a Jupyter server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import RESULTS, Report
from _groups import GROUPS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--only", action="append", choices=sorted(GROUPS), help="run only these groups")
    parser.add_argument("--image", default=None, help="session image (default: the minimal test image)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"folder for the JSON and chart (default: {RESULTS})"
    )
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> int:
    report = Report(quick=args.quick, image=args.image)
    started = time.monotonic()
    for name in args.only or list(GROUPS):
        print(f"== {name}", flush=True)
        try:
            await GROUPS[name](report)
        except Exception as e:  # a group that cannot run is reported, the others still run
            report.note(f"group {name} did not complete: {type(e).__name__}: {e}")
            print(f"   !! {name}: {type(e).__name__}: {e}", flush=True)
    report.meta = {
        "seconds": round(time.monotonic() - started, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    chart = report.chart(args.out / "latest.png")
    data = report.to_json()
    for name in (f"bench-{stamp}.json", "latest.json"):
        (args.out / name).write_text(json.dumps(data, indent=1))
    print(report.table())
    print(f"\nwrote {args.out / 'latest.json'}" + (f" and {chart}" if chart else ""))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
