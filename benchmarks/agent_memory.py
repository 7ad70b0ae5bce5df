"""An idle docker session's memory and the session agent's threads, before and after 400 one-shots.

``python benchmarks/agent_memory.py [--shots 400] [--image IMAGE] [--json FILE]``: one session of the docker
provider (its default transport, the minimal session image); its memory as ``docker stats`` shows it (the
container's cgroup: usage less inactive file pages, cgroup v1 or v2, read from the engine's host) and the
agent's OS threads (``/proc/<pid>/status``) when the session is new, then after ``--shots`` one-shot
``sh -c :`` (each start -> exit -> release), after the agent's idle settle. Also the agent's RSS, and the
one-shot's latency during the run (information; the latency targets are the docker group's).

Targets (issue 56, target 3): <= 6 MiB after 400 one-shots and <= 8 threads, printed PASS/FAIL.
``run.py --only agent`` runs it too (its targets in the agent group).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MEMORY_TARGET_MIB = 6.0
THREADS_TARGET = 8
SHOTS = 400
TRUE = ["sh", "-c", ":"]  # a busybox image has no /bin/true
#: how long the session idles after the one-shots before it is measured (the agent gives memory back when idle)
SETTLE_SECONDS = 3.0


def _cgroup_dir(container_id: str) -> tuple[Path, int]:
    """The container's memory cgroup folder on this host, and the cgroup version (1 or 2)."""
    v1 = Path("/sys/fs/cgroup/memory")
    for base, version in ((v1, 1), (Path("/sys/fs/cgroup"), 2)):
        for sub in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
            if (base / sub).is_dir():
                return base / sub, version
    raise RuntimeError(f"no memory cgroup for container {container_id[:12]} on this host")


def _stat(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = int(value)
    return out


def cgroup_memory(container_id: str) -> int:
    """Bytes, as ``docker stats`` computes it: the cgroup's usage less its inactive file pages."""
    folder, version = _cgroup_dir(container_id)
    if version == 1:
        usage = int((folder / "memory.usage_in_bytes").read_text())
        stat = _stat(folder / "memory.stat")
        return usage - stat.get("total_inactive_file", 0)
    usage = int((folder / "memory.current").read_text())
    return usage - _stat(folder / "memory.stat").get("inactive_file", 0)


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def snapshot(container_id: str, pid: int) -> dict[str, float]:
    status = proc_status(pid)
    return {
        "memory_mib": cgroup_memory(container_id) / 2**20,
        "threads": int(status["Threads"]),
        "agent_rss_mib": int(status["VmRSS"].split()[0]) / 1024,
    }


async def measure(image: str | None, shots: int) -> dict[str, Any]:
    import docker

    from jupyter_tai_sandbox.contract import SessionSpec
    from jupyter_tai_sandbox.providers.docker import DockerSandbox
    from jupyter_tai_sandbox.providers.docker.images.build import DEFAULT_IMAGE

    image = image or DEFAULT_IMAGE
    engine = docker.from_env(version="auto", timeout=60)
    sandbox = DockerSandbox(image=image, extra_labels={"jupyter-tai-sandbox.bench": "1"}, pool_size=0)
    session: Any = await sandbox.create(SessionSpec(image=image))  # a DockerSession: its container_id
    try:
        cid = session.container_id
        pid = engine.api.inspect_container(cid)["State"]["Pid"]
        assert (await session.exec(TRUE, timeout_seconds=30)).exit_code == 0  # the channel is open
        await asyncio.sleep(SETTLE_SECONDS)
        before = snapshot(cid, pid)
        times = []
        for _ in range(shots):
            t0 = time.perf_counter()
            result = await session.exec(TRUE, timeout_seconds=30)
            times.append((time.perf_counter() - t0) * 1e3)
            assert result.exit_code == 0, result
        peak_threads = int(proc_status(pid)["Threads"])
        await asyncio.sleep(SETTLE_SECONDS)
        after = snapshot(cid, pid)
        after["threads"] = max(after["threads"], peak_threads)
    finally:
        await session.destroy()
        await sandbox.close()
        engine.close()
    return {
        "image": image,
        "shots": shots,
        "before": before,
        "after": after,
        "exec_ms_p50": statistics.median(times),
        "exec_ms_p95": sorted(times)[int(0.95 * (len(times) - 1))],
    }


def verdicts(result: dict[str, Any]) -> list[tuple[str, bool, str]]:
    after = result["after"]
    return [
        (
            f"agent: an idle docker session's memory <= {MEMORY_TARGET_MIB:g} MiB after {result['shots']} one-shots",
            after["memory_mib"] <= MEMORY_TARGET_MIB,
            f"{after['memory_mib']:.2f} MiB (new: {result['before']['memory_mib']:.2f} MiB)",
        ),
        (
            f"agent: <= {THREADS_TARGET} threads per session",
            after["threads"] <= THREADS_TARGET,
            f"{after['threads']} threads (new: {result['before']['threads']})",
        ),
    ]


def summarize(result: dict[str, Any]) -> None:
    print(
        f"an idle docker session's memory and agent threads, {result['image']}, {result['shots']} one-shots"
    )
    for when in ("before", "after"):
        s = result[when]
        print(
            f"  {when:6s}  memory (docker stats) {s['memory_mib']:6.2f} MiB   agent RSS {s['agent_rss_mib']:6.2f} "
            f"MiB   threads {s['threads']}"
        )
    print(f"  one-shot exec p50 {result['exec_ms_p50']:.2f} ms, p95 {result['exec_ms_p95']:.2f} ms")
    for name, ok, detail in verdicts(result):
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shots", type=int, default=SHOTS)
    parser.add_argument("--image", default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(measure(args.image, args.shots))
    summarize(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    sys.exit(0 if all(ok for _, ok, _ in verdicts(result)) else 1)


if __name__ == "__main__":
    main()
