"""Round trip of a one-shot ``true``: through the session agent vs the Docker SDK's ``exec_run``, same run.

``python benchmarks/agent_roundtrip.py [--rounds N] [--image IMAGE]``: starts one container of IMAGE (default
the minimal session image) with the agent injected as PID 1 (put_archive into the created container, as a
provider does), then times ``true`` start -> exit through one open ``docker exec -i ... /.tai/agent connect``
stream (the CLI's, and the engine API's hijacked exec socket), and ``container.exec_run(["true"])``. Prints median and p95 of each and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import secrets
import statistics
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_tai_sandbox.agent import AgentClient, agent_binary
from jupyter_tai_sandbox.agent.client import AGENT_PATH
from jupyter_tai_sandbox.agent.transport import open_docker_api

LABEL = {"jupyter-tai-sandbox.agent-bench": secrets.token_hex(4)}


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def agent_tar() -> bytes:
    data = agent_binary().read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("agent")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def through_agent(name: str, rounds: int, api=None) -> list[float]:
    client = await (open_docker_api(api, name) if api is not None else AgentClient.docker_exec(name))
    try:
        times = []
        for _ in range(rounds + 5):
            t0 = time.perf_counter()
            cmd = await client.start(["true"])
            await cmd.collect()
            times.append(time.perf_counter() - t0)
            await cmd.release()
        return times[5:]  # warm-up dropped
    finally:
        await client.close()


def through_exec_run(container, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds + 2):
        t0 = time.perf_counter()
        result = container.exec_run(["true"])
        times.append(time.perf_counter() - t0)
        assert result.exit_code == 0
    return times[2:]


def main() -> None:
    import docker

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--image", default="jupyter-tai-sandbox/minimal:latest")
    args = parser.parse_args()
    client = docker.from_env(version="auto")
    container = client.containers.create(
        args.image,
        entrypoint=[AGENT_PATH, "serve"],
        labels=LABEL,
        name=f"tai-agent-bench-{secrets.token_hex(4)}",
        network_mode="none",
    )
    try:
        container.put_archive("/", _dir_tar())
        container.put_archive("/.tai", agent_tar())
        container.start()
        agent = asyncio.run(through_agent(container.name, args.rounds))
        agent_api = asyncio.run(through_agent(container.name, args.rounds, client.api))
        container.reload()
        rss = _rss_kib(container.attrs["State"]["Pid"])
        sdk = through_exec_run(container, max(20, args.rounds // 4))
    finally:
        container.remove(force=True)
    rows = [("agent (docker exec -i)", agent), ("agent (engine API)", agent_api), ("SDK exec_run", sdk)]
    print(f"one-shot `true` round trip, {args.image}")
    for name, values in rows:
        print(
            f"  {name:22s} median {statistics.median(values) * 1e3:7.2f} ms   p95 {p95(values) * 1e3:7.2f} ms"
            f"   (n={len(values)})"
        )
    print(f"  ratio agent/exec_run (median): {statistics.median(agent) / statistics.median(sdk):.3f}")
    print(
        f"  agent binary {agent_binary().stat().st_size / 2**20:.2f} MiB; agent RSS after the rounds "
        f"{rss / 1024:.1f} MiB"
        if rss
        else "  agent RSS: not readable from here"
    )


def _rss_kib(host_pid: int) -> int | None:
    """The agent's resident memory, from the host's /proc (the engine runs on this machine)."""
    try:
        with open(f"/proc/{host_pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return None


def _dir_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(".tai")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    return buf.getvalue()


if __name__ == "__main__":
    main()
