"""Sandboxed kernels vs a plain local ipykernel, measured in the same run, round-robin.

    python benchmarks/kernel_bench.py [--quick] [--no-docker]

Rows (p50 and p95 of each, and the ratio against the plain kernel):

* start: kernel start to the first ``execute_reply`` (start_kernel, wait_for_ready, one execute);
  sandboxed on local, on docker (network none) and on docker with the warm pool (network egress,
  the pool serves only the default spec);
* ``1+1``: one execute round trip (request to reply and iopub idle) through the forwarded ports
  (target: <= 1.5x the plain kernel);
* 64 MiB printed by a cell (64 prints of 1 MiB), as throughput (target: >= 0.5x the plain kernel).

Ratios are printed, never asserted. Needs the Python image for the docker rows
(``jupyter tai-sandbox build-image --python``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.kernels import kernelspecs
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox

BENCH_LABEL = {"jupyter-tai-sandbox.bench": "1"}
PRINT_CELL = "import sys\nline = 'x' * ((1 << 20) - 1)\nfor _ in range(64):\n    print(line)"
PRINT_BYTES = 64 << 20


class Target:
    """One way to run a kernel: the kernelspec name and the provider it needs in the slot."""

    def __init__(self, label: str, kernel: str, provider: Any = None, policy: SandboxPolicy | None = None):
        self.label, self.kernel, self.provider, self.policy = label, kernel, provider, policy

    def install(self) -> None:
        if self.provider is not None:
            sandboxes.register_sandbox(self.provider, policy=self.policy, replace=True)


async def started(target: Target) -> tuple[AsyncKernelManager, Any]:
    target.install()
    km = AsyncKernelManager(kernel_name=target.kernel)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return km, kc


async def stop(km: AsyncKernelManager, kc: Any) -> None:
    kc.stop_channels()
    await km.shutdown_kernel(now=False)


@contextlib.asynccontextmanager
async def image_kernel(image: str = PYTHON_IMAGE) -> AsyncIterator[Any]:
    """A client of the image's own ipykernel run in a plain container on the host's network (``docker run
    --network host``, no sandbox, no forwarding): the same kernel software as a sandboxed kernel, so the
    two differ only by the sandbox's path. The container is removed on the way out."""
    from jupyter_client.asynchronous import AsyncKernelClient
    from jupyter_client.connect import write_connection_file

    folder = Path(tempfile.mkdtemp(prefix="tai-kernel-bench-conn-"))
    folder.chmod(0o755)
    path, _ = write_connection_file(str(folder / "kernel.json"), ip="127.0.0.1")
    os.chmod(path, 0o644)
    run = await asyncio.create_subprocess_exec(
        "docker",
        "run",
        "-d",
        "--rm",
        "--network",
        "host",
        "--label",
        "jupyter-tai-sandbox.bench=1",
        "-v",
        f"{folder}:/kernel",
        "--entrypoint",
        "python3",
        image,
        "-m",
        "ipykernel_launcher",
        "-f",
        "/kernel/kernel.json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await run.communicate()
    if run.returncode != 0:
        raise RuntimeError(f"docker run {image}: {err.decode(errors='replace').strip()}")
    container = out.decode().strip()
    kc = AsyncKernelClient()
    kc.load_connection_file(path)
    kc.start_channels()
    try:
        await _answered(kc, container)
        yield kc
    finally:
        kc.stop_channels()
        gone = await asyncio.create_subprocess_exec(
            "docker",
            "rm",
            "-f",
            container,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await gone.wait()
        shutil.rmtree(folder, ignore_errors=True)


async def _answered(kc: Any, container: str, seconds: float = 120.0) -> None:
    """Wait for the kernel's first kernel_info reply. Not ``wait_for_ready``: without a kernel manager it
    takes a heartbeat not yet beating for a dead kernel, and a kernel still starting on a loaded machine
    has none yet. Only a container that stopped is a dead kernel here."""
    from queue import Empty

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kc.kernel_info()
        try:
            msg = await kc.shell_channel.get_msg(timeout=1)
        except Empty:
            probe = await asyncio.create_subprocess_exec(
                "docker",
                "inspect",
                "-f",
                "{{.State.Running}}",
                container,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            out, _ = await probe.communicate()
            if out.strip() != b"true":
                raise RuntimeError(
                    f"the image's kernel (container {container[:12]}) stopped before it answered"
                ) from None
            continue
        if msg["msg_type"] == "kernel_info_reply":
            while True:  # what the starting kernel published meanwhile is not the first cell's
                try:
                    await kc.iopub_channel.get_msg(timeout=0.2)
                except Empty:
                    return
    raise RuntimeError(f"the image's kernel did not answer within {seconds:g} s")


async def time_start(target: Target) -> float:
    t0 = time.perf_counter()
    km, kc = await started(target)
    reply = await kc.execute_interactive("1+1", timeout=60, output_hook=lambda msg: None)
    elapsed = time.perf_counter() - t0
    assert reply["content"]["status"] == "ok"
    await stop(km, kc)
    return elapsed


async def time_execute(kc: Any, code: str, output: Callable[[dict[str, Any]], None] | None = None) -> float:
    t0 = time.perf_counter()
    reply = await kc.execute_interactive(code, timeout=300, output_hook=output or (lambda msg: None))
    elapsed = time.perf_counter() - t0
    assert reply["content"]["status"] == "ok", reply["content"]
    return elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def interleave(
    targets: list[Target], rounds: int, measure: Callable[[Target], Awaitable[float]]
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {t.label: [] for t in targets}
    for _ in range(rounds):
        for target in targets:
            samples[target.label].append(await measure(target))
    return samples


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="tai-kernel-bench-"))
    prefix = tmp / "prefix"
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    kernelspecs.install("bench-sbx-none", prefix=str(prefix), network="auto")
    kernelspecs.install("bench-sbx-egress", prefix=str(prefix), network="egress")
    local = LocalSandbox(root=str(tmp / "local"))
    targets = [
        Target("plain ipykernel", "python3"),
        Target("sandbox local", "bench-sbx-none", local, SandboxPolicy(isolation="none")),
    ]
    docker_providers = []
    if not args.no_docker:
        from jupyter_tai_sandbox.providers.docker import DockerSandbox

        cold = DockerSandbox(image=PYTHON_IMAGE, extra_labels=BENCH_LABEL, pool_size=0)
        warm = DockerSandbox(image=PYTHON_IMAGE, extra_labels=BENCH_LABEL, pool_size=2)
        docker_providers = [cold, warm]
        targets.append(
            Target(
                "sandbox docker (network none)", "bench-sbx-none", cold, SandboxPolicy(isolation="container")
            )
        )
        targets.append(
            Target(
                "sandbox docker, warm pool (egress)",
                "bench-sbx-egress",
                warm,
                SandboxPolicy(isolation="container"),
            )
        )
    results: dict[str, Any] = {}
    try:
        if docker_providers:  # let the pool fill before it is measured
            targets[-1].install()
            await asyncio.sleep(5)
        starts = await interleave(targets, 3 if args.quick else 7, time_start)
        results["start"] = starts
        # execute round trips and printed output, on one kernel of each kind, interleaved
        kernels = []
        for target in targets:
            kernels.append((target, *await started(target)))
        try:
            n = 30 if args.quick else 200
            trips: dict[str, list[float]] = {t.label: [] for t in targets}
            for _ in range(n):
                for target, _, kc in kernels:
                    target.install()
                    trips[target.label].append(await time_execute(kc, "1+1"))
            results["1+1"] = trips
            prints: dict[str, list[float]] = {t.label: [] for t in targets}
            for _ in range(2 if args.quick else 4):
                for target, _, kc in kernels:
                    got = [0]

                    def count(msg: dict[str, Any], got: list[int] = got) -> None:
                        if msg["msg_type"] == "stream":
                            got[0] += len(msg["content"]["text"])

                    seconds = await time_execute(kc, PRINT_CELL, count)
                    assert got[0] == PRINT_BYTES, (target.label, got[0])
                    prints[target.label].append(PRINT_BYTES / seconds / (1 << 20))  # MiB/s
            results["print 64 MiB (MiB/s)"] = prints
        finally:
            for target, km, kc in kernels:
                target.install()
                await stop(km, kc)
    finally:
        for provider in docker_providers:
            with contextlib.suppress(Exception):
                await provider.close()
    return results


def report(results: dict[str, Any]) -> None:
    base = "plain ipykernel"
    targets = {"start": "", "1+1": "<= 1.5x", "print 64 MiB (MiB/s)": ">= 0.5x"}
    print(f"\n{'row':<24} {'kernel':<36} {'p50':>10} {'p95':>10} {'ratio p50':>10}  target")
    for row, samples in results.items():
        unit = "MiB/s" if "MiB/s" in row else "ms"
        scale = 1.0 if unit == "MiB/s" else 1000.0
        base_p50 = statistics.median(samples[base])
        for label, values in samples.items():
            p50 = statistics.median(values)
            ratio = p50 / base_p50
            verdict = ""
            if label != base and targets[row]:
                limit = float(targets[row].split()[1].rstrip("x"))
                ok = ratio <= limit if targets[row].startswith("<=") else ratio >= limit
                verdict = f"{targets[row]} {'PASS' if ok else 'MISS'}"
            print(
                f"{row:<24} {label:<36} {p50 * scale:>8.1f}{'' if unit == 'MiB/s' else 'ms':<2}"
                f" {pct(values, 0.95) * scale:>8.1f}   {ratio:>8.2f}x  {verdict}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--no-docker", action="store_true", help="local rows only")
    parser.add_argument("--json", default=None, help="also write the samples to this JSON file")
    args = parser.parse_args()
    results = asyncio.run(main(args))
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(0)
