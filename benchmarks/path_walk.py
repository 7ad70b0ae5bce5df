"""Docker file requests before and after the one-command path walk (issue 24, point 9), same run.

The docker provider used to check a listing's folder (and a command's cwd) with one engine
path stat per component, then run the listing; now one command in the session walks the path
and lists the folder. Round-robin in one run, on one session, this measures both:

* ``previous``: the earlier way, rebuilt here from the engine's public seams (``stat_path``
  for each component in a worker thread, then the earlier listing script);
* ``now``: ``session.list_files`` and ``session.exec(..., cwd=...)`` as the provider does them;

at depth 1 (the usual case), 16 and 128 (the most a path may have now). Prints medians, p95
and the ratio now/previous (ms per call, lower is better). Not a test: nothing is asserted.

    python benchmarks/path_walk.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench import Report, Row, interleaved
from _groups import BENCH_LABEL

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox

#: the listing script before the walk moved into it (argv: the real folder)
PREVIOUS_LIST = r"""cd "$1" || exit 3
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -L "$f" ]; then k=symlink; elif [ -d "$f" ]; then k=directory; elif [ -f "$f" ]; then k=file; else k=other; fi
  set -f
  set -- $(ls -lnd --full-time "$f" 2>/dev/null)
  printf '%s/%s/%s %s %s/%s\0' "$k" "$5" "$6" "$7" "$8" "$f"
done
"""
_MODE_DIR = 1 << 31


def previous_walk(engine: Any, container: str, rel: str) -> str:
    """The earlier check: an engine path stat per component (blocking, in a worker thread)."""
    current = "/workspace"
    stat = engine.stat_path(container, current)
    for name in rel.split("/"):
        assert stat is not None and stat["mode"] & _MODE_DIR
        current = f"{current}/{name}"
        stat = engine.stat_path(container, current)
    return current


async def bench(quick: bool) -> Report:
    report = Report(quick=quick)
    sandbox = DockerSandbox(image=DEFAULT_IMAGE, extra_labels=BENCH_LABEL)
    session = await sandbox.create(SessionSpec())
    engine = sandbox.engine
    try:
        deepest = "/".join(["d"] * 128)
        made = await session.exec(
            ["sh", "-c", f"mkdir -p {deepest} && touch d/a d/b d/c"], timeout_seconds=60
        )
        assert made.exit_code == 0, made.stderr
        for depth in (1, 16, 128):
            rel = "/".join(["d"] * depth)

            async def list_previous(rel: str = rel) -> None:
                real = await engine.blocking(previous_walk, engine, session.container_id, rel)
                code, _, _ = await engine.run(session.container_id, ["sh", "-c", PREVIOUS_LIST, "sh", real])
                assert code == 0

            async def list_now(rel: str = rel) -> None:
                await session.list_files(rel)

            async def cwd_previous(rel: str = rel) -> None:
                # the earlier walk, then the command (the workspace as cwd: no second walk of today's)
                await engine.blocking(previous_walk, engine, session.container_id, rel)
                assert (await session.exec(["sh", "-c", ":"], timeout_seconds=30)).exit_code == 0

            async def cwd_now(rel: str = rel) -> None:
                assert (await session.exec(["sh", "-c", ":"], timeout_seconds=30, cwd=rel)).exit_code == 0

            for what, previous, now in (
                ("list", list_previous, list_now),
                ("exec cwd", cwd_previous, cwd_now),
            ):
                samples = await interleaved(report.rounds(40), {"previous": previous, "now": now})
                base = report.add(Row("paths", f"{what} depth {depth}: previous", "ms", samples["previous"]))
                report.add(
                    Row("paths", f"{what} depth {depth}: now", "ms", samples["now"], baseline=base.name)
                )
    finally:
        await session.destroy()
        await sandbox.close()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    report = asyncio.run(bench(args.quick))
    print(report.table())
    for row in report.rows.values():
        if row.baseline is not None:
            print(
                f"ratio now/previous, {row.name.split(': ')[0]} ({row.unit}): {report.ratio(row.name):.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
