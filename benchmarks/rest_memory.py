"""Server memory of a REST one-shot exec with a large output (issue 14, point 4).

Starts a real ``jupyter server`` with the extension (docker provider by default),
then in the same run:

* baseline: one session, a one-shot exec answering a tiny output; the server's
  peak RSS (``VmHWM``) afterwards;
* the row: a one-shot exec answering ``--mib`` MiB (default 100) of output, read
  by the client as it streams and dropped; the server's peak RSS afterwards.

Prints the peak growth over the baseline as a ratio to the output size (target:
under 2x) and PASS or MISS. Not a test: nothing is asserted.

    python benchmarks/rest_memory.py [--provider docker|local] [--mib 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _server import JupyterServer

TARGET_RATIO = 2.0


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def call(
    server: JupyterServer, method: str, path: str, body: object | None = None, timeout: float = 300
) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def streamed_exec(server: JupyterServer, session_id: str, argv: list[str]) -> tuple[int, float]:
    """Run a one-shot exec, reading its answer in pieces and dropping them: (answer bytes, seconds)."""
    request = urllib.request.Request(
        server.url + f"api/sandbox/sessions/{session_id}/exec",
        data=json.dumps({"argv": argv, "timeout_seconds": 300}).encode(),
        method="POST",
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    started = time.monotonic()
    size = 0
    head = b""
    with urllib.request.urlopen(request, timeout=300) as response:
        while chunk := response.read(1 << 20):
            size += len(chunk)
            head = head or chunk[:200]
    if not head.replace(b" ", b"").startswith(b'{"exit_code":0'):
        raise RuntimeError(f"unexpected answer: {head.decode(errors='replace')!r}")
    return size, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--provider", default="docker", choices=["docker", "local"])
    parser.add_argument("--mib", type=int, default=100, help="MiB of output of the large exec")
    args = parser.parse_args()
    size = args.mib << 20
    server = JupyterServer(provider=args.provider)
    config_dir = os.path.join(server._home, "config")  # the server's JUPYTER_CONFIG_DIR
    os.makedirs(config_dir, exist_ok=True)
    with open(os.path.join(config_dir, "jupyter_server_config.json"), "w") as f:
        json.dump({"SandboxApp": {"max_output_bytes": size + (1 << 20)}}, f)
    with server:
        assert server._process is not None
        pid = server._process.pid
        session = json.loads(call(server, "POST", "api/sandbox/sessions", {}))
        sid = session["id"]
        try:
            streamed_exec(server, sid, ["echo", "tiny"])
            streamed_exec(server, sid, ["echo", "tiny"])
            base_rss = status_kib(pid, "VmRSS")
            base_peak = status_kib(pid, "VmHWM")
            answer, seconds = streamed_exec(
                server, sid, ["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' a"]
            )
            peak = status_kib(pid, "VmHWM")
        finally:
            call(server, "DELETE", f"api/sandbox/sessions/{sid}")
    growth = max(0, peak - base_peak) * 1024
    ratio = growth / size
    print(f"provider                 {args.provider}")
    print(f"output                   {args.mib} MiB (answer {answer / 2**20:.1f} MiB in {seconds:.1f} s)")
    print(f"baseline (tiny output)   RSS {base_rss / 1024:.1f} MiB, peak {base_peak / 1024:.1f} MiB")
    print(f"large output             peak {peak / 1024:.1f} MiB")
    print(
        f"peak growth / output     {ratio:.2f}x  (target < {TARGET_RATIO:g}x)  "
        f"{'PASS' if ratio < TARGET_RATIO else 'MISS'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
