"""The cost of the docker disk ceiling: sessions with ``disk_limit_mb`` (read-only root, tmpfs
workspace and /tmp) against ``disk_limit_mb=0`` (writable root, workspace on the engine's disk),
round-robin in the same run:

* session create + destroy (ms);
* writing 256 MiB into /workspace with ``dd`` (MiB/s, the data is synced on the disk side);
* an upload of 32 MiB through ``put_file`` and its download (MiB/s).

Prints medians, p95 and the ratio ceiling/no-ceiling of each. Not a test: nothing is asserted.

    python benchmarks/disk_ceiling.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench import Report, Row, interleaved, interleaved_throughput
from _groups import BENCH_LABEL

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox

WRITE_MB = 256
UPLOAD = b"\1" * (32 << 20)


async def pair(
    report: Report,
    unit: str,
    measure: Callable[..., Awaitable[dict[str, list[float]]]],
    rounds: int,
    variants: dict[str, Callable[[], Awaitable[Any]]],
) -> None:
    """The first variant (no ceiling) is the baseline."""
    (base, base_samples), (name, values) = (await measure(rounds, variants)).items()
    report.add(Row("disk", base, unit, base_samples))
    report.add(Row("disk", name, unit, values, baseline=base))


async def bench(quick: bool) -> Report:
    report = Report(quick=quick)
    # the ceiling is memory: give the capped session room for what it writes
    capped = DockerSandbox(image=DEFAULT_IMAGE, extra_labels=BENCH_LABEL, default_memory_mb=2048)
    plain = DockerSandbox(
        image=DEFAULT_IMAGE, extra_labels=BENCH_LABEL, disk_limit_mb=0, default_memory_mb=2048
    )
    sessions = {}
    try:

        async def create_destroy(sandbox: DockerSandbox) -> None:
            session = await sandbox.create(SessionSpec())
            await session.destroy()

        await pair(
            report,
            "ms",
            interleaved,
            report.rounds(10),
            {
                "create+destroy: no ceiling": lambda: create_destroy(plain),
                "create+destroy: disk ceiling": lambda: create_destroy(capped),
            },
        )

        sessions = {"plain": await plain.create(SessionSpec()), "capped": await capped.create(SessionSpec())}

        async def write(which: str) -> int:
            script = f"dd if=/dev/zero of=/workspace/w bs=1M count={WRITE_MB} conv=fsync 2>/dev/null; rm /workspace/w"
            result = await sessions[which].exec(["sh", "-c", script], timeout_seconds=120)
            assert result.exit_code == 0, result
            return WRITE_MB << 20

        await pair(
            report,
            "MiB/s",
            interleaved_throughput,
            report.rounds(5),
            {
                f"write {WRITE_MB} MiB to /workspace: no ceiling": lambda: write("plain"),
                f"write {WRITE_MB} MiB to /workspace: disk ceiling": lambda: write("capped"),
            },
        )

        async def transfer(which: str) -> int:
            await sessions[which].put_file("u.bin", UPLOAD)
            assert len(await sessions[which].get_file("u.bin")) == len(UPLOAD)
            return 2 * len(UPLOAD)

        await pair(
            report,
            "MiB/s",
            interleaved_throughput,
            report.rounds(5),
            {
                "upload+download 32 MiB: no ceiling": lambda: transfer("plain"),
                "upload+download 32 MiB: disk ceiling": lambda: transfer("capped"),
            },
        )
    finally:
        for session in sessions.values():
            await session.destroy()
        await plain.close()
        await capped.close()
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
                f"ratio ceiling/no ceiling, {row.name.split(': ')[0]} ({row.unit}): {report.ratio(row.name):.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
