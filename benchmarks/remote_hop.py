"""The remote provider's hop: RemoteSandbox over a real server vs the provider called directly, same run.

Starts a ``jupyter server`` with the extension (``--provider``, local by default)
on 127.0.0.1 and, round-robin in the same run:

* a one-shot ``true`` exec (ms per call): the provider in this process, then
  RemoteSandbox talking to the server's REST and websocket API;
* 256 MiB of stdout read through ``exec_start`` (MiB/s), the same two ways.

Prints medians, p95 and the ratio remote/direct of each (for the exec, time:
lower is better; for the stream, throughput: higher is better). Not a test:
nothing is asserted.

    python benchmarks/remote_hop.py [--provider local|docker] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench import Report, Row, interleaved, interleaved_throughput
from _groups import BENCH_LABEL, STREAM_BYTES, TRUE_DOCKER, drain
from _server import JupyterServer

from jupyter_tai_sandbox.contract import Sandbox, SessionSpec
from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.remote import RemoteSandbox


def direct_provider(provider: str, root: str) -> Sandbox:
    if provider == "docker":
        from jupyter_tai_sandbox.providers.docker import DockerSandbox

        return DockerSandbox(image=DEFAULT_IMAGE, extra_labels=BENCH_LABEL)
    from jupyter_tai_sandbox.providers.local import LocalSandbox

    return LocalSandbox(root=root)


async def pair(
    report: Report,
    unit: str,
    measure: Callable[..., Awaitable[dict[str, list[float]]]],
    rounds: int,
    variants: dict[str, Callable[[], Awaitable[Any]]],
) -> None:
    """Measure ``direct`` and ``remote`` round-robin; the first variant is the baseline."""
    samples = await measure(rounds, variants)
    (base, base_samples), (name, values) = samples.items()
    report.add(Row("remote", base, unit, base_samples))
    report.add(Row("remote", name, unit, values, baseline=base))


async def bench(provider: str, quick: bool) -> Report:
    report = Report(quick=quick)
    root = tempfile.mkdtemp(prefix="tai-bench-remote-")
    true = TRUE_DOCKER if provider == "docker" else ["true"]
    argv = ["head", "-c", str(STREAM_BYTES), "/dev/zero"]
    with JupyterServer(provider=provider) as server:
        direct = direct_provider(provider, root)
        remote = RemoteSandbox(url=server.url, token=server.token)
        here = await direct.create(SessionSpec())
        there = await remote.create(SessionSpec())
        try:

            async def exec_direct() -> None:
                assert (await here.exec(true, timeout_seconds=30)).exit_code == 0

            async def exec_remote() -> None:
                assert (await there.exec(true, timeout_seconds=30)).exit_code == 0

            await pair(
                report,
                "ms",
                interleaved,
                report.rounds(100),
                {
                    f"{provider} exec true: direct": exec_direct,
                    f"{provider} exec true: remote": exec_remote,
                },
            )

            async def stream_direct() -> int:
                return await drain(await here.exec_start(argv, timeout_seconds=300))

            async def stream_remote() -> int:
                return await drain(await there.exec_start(argv, timeout_seconds=300))

            await pair(
                report,
                "MiB/s",
                interleaved_throughput,
                report.rounds(4),
                {
                    f"{provider} stdout 256 MiB: direct": stream_direct,
                    f"{provider} stdout 256 MiB: remote": stream_remote,
                },
            )
        finally:
            await here.destroy()
            await there.destroy()
            await direct.close()
            await remote.close()
            shutil.rmtree(root, ignore_errors=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--provider", default="local", choices=["local", "docker"])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    report = asyncio.run(bench(args.provider, args.quick))
    print(report.table())
    for row in report.rows.values():
        if row.baseline is not None:
            print(
                f"ratio remote/direct, {row.name.split(': ')[0]} ({row.unit}): {report.ratio(row.name):.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
