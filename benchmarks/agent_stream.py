"""Throughput through the session agent vs the raw Docker SDK exec stream, same container, same run.

``python benchmarks/agent_stream.py [--rounds N] [--image IMAGE] [--mib-out 256] [--mib-in 64]``: one container
of IMAGE (default the minimal session image) with the agent injected as PID 1; then, round-robin:

- stdout: ``head -c 256M /dev/zero`` read through one open agent channel (the engine API's hijacked exec
  socket, ``open_docker_api``) vs ``exec_create`` + ``exec_start(socket=True)`` demultiplexed by hand;
- stdin echo: 64 MiB written to ``cat`` and read back, the same two ways.

Prints MiB/s medians and the ratio agent/raw of the medians (and the median of per-round ratios). This is the
``agent_transport = "exec"`` path (the fallback where the server cannot reach the agent's socket): its channel
*is* one exec stream, so the raw stream bounds it and the ratio is its cost, not a target. The targets on
streamed bytes are the docker group's, through the provider on its default (direct) transport. ``run.py --only agent`` runs it as a group.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_roundtrip import _dir_tar, agent_tar

from jupyter_tai_sandbox.agent.client import AGENT_PATH
from jupyter_tai_sandbox.agent.transport import open_docker_api

LABEL = {"jupyter-tai-sandbox.agent-bench": secrets.token_hex(4)}


def raw_exec(api, container_id: str, cmd: list[str], stdin: bytes | None) -> int:
    """The raw SDK path: exec_create + exec_start(socket), demultiplexed by hand; stdin fed from a thread."""
    exec_id = api.exec_create(container_id, cmd, stdin=stdin is not None)["Id"]
    sock = api.exec_start(exec_id, socket=True)
    raw = sock._sock
    # read through the response's buffered reader: the first frames may have come in with the upgrade's
    # headers, into its buffer, and a read of the bare socket would lose them (and the demux its step)
    response = getattr(sock, "_response", None)
    reader = response.raw._fp.fp if response is not None else sock
    writer = None
    if stdin is not None:

        def feed() -> None:
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)

        writer = threading.Thread(target=feed)
        writer.start()
    total = 0
    pending = b""
    try:
        while True:
            data = reader.read1(1 << 18)
            if not data:
                break
            pending += data
            while len(pending) >= 8:
                size = struct.unpack(">L", pending[4:8])[0]
                if len(pending) < 8 + size:
                    break
                if pending[0] == 1:
                    total += size
                pending = pending[8 + size :]
    finally:
        if writer is not None:
            writer.join()
        sock.close()
    return total


async def agent_out(client, nbytes: int) -> int:
    cmd = await client.start(["head", "-c", str(nbytes), "/dev/zero"])
    total = 0
    while (item := await cmd.read()) is not None:
        total += len(item[1])
    await cmd.wait()
    await cmd.release()
    return total


async def agent_echo(client, payload: bytes) -> int:
    cmd = await client.start(["cat"])

    async def feed() -> None:
        await cmd.write(payload)
        await cmd.close_stdin()

    feeder = asyncio.create_task(feed())
    total = 0
    while (item := await cmd.read()) is not None:
        total += len(item[1])
    await feeder
    await cmd.wait()
    await cmd.release()
    return total


async def measure(
    api, container_id: str, rounds: int, out_bytes: int, payload: bytes
) -> dict[str, list[float]]:
    client = await open_docker_api(api, container_id)
    samples: dict[str, list[float]] = {k: [] for k in ("out raw", "out agent", "in raw", "in agent")}
    out_cmd = ["head", "-c", str(out_bytes), "/dev/zero"]
    try:
        await agent_out(client, 1 << 20)  # warm-up
        for _ in range(rounds):
            for key, nbytes, run in (
                ("out raw", out_bytes, lambda: asyncio.to_thread(raw_exec, api, container_id, out_cmd, None)),
                ("out agent", out_bytes, lambda: agent_out(client, out_bytes)),
                (
                    "in raw",
                    len(payload),
                    lambda: asyncio.to_thread(raw_exec, api, container_id, ["cat"], payload),
                ),
                ("in agent", len(payload), lambda: agent_echo(client, payload)),
            ):
                t0 = time.perf_counter()
                got = await run()
                elapsed = time.perf_counter() - t0
                if got != nbytes:
                    raise RuntimeError(f"{key}: {got} bytes, expected {nbytes}")
                samples[key].append(nbytes / 2**20 / elapsed)
    finally:
        await client.close()
    return samples


def summarize(samples: dict[str, list[float]], out_mib: int, in_mib: int) -> list[tuple[str, float]]:
    """Print the table; returns (name, ratio) per case."""
    results = []
    for case, label in (("out", f"stdout {out_mib} MiB"), ("in", f"stdin echo {in_mib} MiB (cat)")):
        raw, ours = samples[f"{case} raw"], samples[f"{case} agent"]
        ratio = statistics.median(ours) / statistics.median(raw)
        per_round = statistics.median(o / r for o, r in zip(ours, raw, strict=True))
        print(
            f"  {label:28s} raw SDK exec stream {statistics.median(raw):7.1f} MiB/s   agent "
            f"{statistics.median(ours):7.1f} MiB/s   ratio {ratio:.2f}x (per-round median {per_round:.2f}x)"
        )
        results.append((label, ratio))
    return results


def run(image: str, rounds: int, out_mib: int, in_mib: int) -> tuple[dict[str, list[float]], list]:
    import docker

    client = docker.from_env(version="auto", timeout=300)
    container = client.containers.create(
        image,
        entrypoint=[AGENT_PATH, "serve"],
        labels=LABEL,
        name=f"tai-agent-bench-{secrets.token_hex(4)}",
        network_mode="none",
    )
    try:
        container.put_archive("/", _dir_tar())
        container.put_archive("/.tai", agent_tar())
        container.start()
        payload = os.urandom(1 << 20) * in_mib
        samples = asyncio.run(measure(client.api, container.id, rounds, out_mib << 20, payload))
    finally:
        container.remove(force=True)
        client.close()
    print(f"agent throughput vs the raw SDK exec stream, {image}, {rounds} rounds round-robin")
    return samples, summarize(samples, out_mib, in_mib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image", default="jupyter-tai-sandbox/minimal:latest")
    parser.add_argument("--mib-out", type=int, default=256)
    parser.add_argument("--mib-in", type=int, default=64)
    args = parser.parse_args()
    run(args.image, args.rounds, args.mib_out, args.mib_in)


if __name__ == "__main__":
    main()
