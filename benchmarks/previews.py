"""Web previews (issue 54): an app in a session through the preview route against its raw port connection.

    python benchmarks/previews.py [--quick] [--json FILE]

Starts a real ``jupyter server`` with the extension and the docker provider (as the other server benchmarks
do), creates a session through its REST API (the Python image, network ``none``) holding a 256 MiB file
(32 with ``--quick``) and a small page, and runs ``python3 -m http.server`` on 127.0.0.1:8000 inside it.
Then, round-robin in one run, the same client code (a hand-written GET, h11 reading the answer) fetches:

* **raw port connection** (the baseline): this process opens the port itself with the provider's
  ``session.open_port(8000)`` (the same session, found by its id) and speaks HTTP/1.1 over that byte stream;
* **preview**: a TCP connection to the server, ``GET /api/sandbox/sessions/ID/ports/8000/...`` with the
  token in the ``Authorization`` header; the server opens the port the same way and relays the answer.

Rows: the download in MiB/s (connect to the last byte); the server process's RSS growth while a preview
download runs (its VmRSS sampled every 20 ms, over the RSS just before); a small page's first byte (connect,
GET, the answer's first byte: p50 over many fresh connections).

Targets (issue 54): the download through the preview >= 0.5x the raw port connection; the server's RSS grows
< 32 MiB during it; the preview adds <= 5 ms p50 to a small page's first byte.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h11

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import Report, Row
from _server import JupyterServer

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox

PORT = 8000
PAGE = b"<!doctype html><title>preview bench</title><p>" + b"small page " * 80 + b"</p>\n"
MIB = 1 << 20

# the next bytes of an answer; None once the peer closed
Reader = Callable[[], Awaitable[bytes | None]]


def request_head(path: str, host: str, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_answer(read: Reader, first_byte_only: bool = False) -> tuple[int, int]:
    """(status, body bytes) of one answer read with h11 (content-length, chunked or close-delimited); with
    ``first_byte_only``, return as soon as the first byte arrives (status 0, body 0)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))  # its state: awaiting an answer
    conn.send(h11.EndOfMessage())
    status, body = 0, 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await read()
            if first_byte_only and data:
                return 0, 0
            conn.receive_data(data or b"")
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += len(event.data)
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, body


class Raw:
    """The baseline: a GET over ``session.open_port`` in this process."""

    name = "raw port connection"

    def __init__(self, session: Any) -> None:
        self.session = session

    async def fetch(self, path: str, first_byte_only: bool = False) -> tuple[int, int]:
        conn = await self.session.open_port(PORT)
        try:
            await conn.write(request_head(path, f"127.0.0.1:{PORT}"))
            return await read_answer(conn.read, first_byte_only)
        finally:
            await conn.close()


class Preview:
    """The preview route: a GET to the Jupyter server, which relays it over its own port connection."""

    name = "preview"

    def __init__(self, server: JupyterServer, session_id: str) -> None:
        self.server, self.prefix = server, f"/api/sandbox/sessions/{session_id}/ports/{PORT}"

    async def fetch(self, path: str, first_byte_only: bool = False) -> tuple[int, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        try:
            auth = {"Authorization": f"token {self.server.token}"}
            writer.write(request_head(self.prefix + path, f"127.0.0.1:{self.server.port}", auth))
            await writer.drain()

            async def read() -> bytes | None:
                return await reader.read(MIB) or None

            return await read_answer(read, first_byte_only)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def call(server: JupyterServer, method: str, path: str, body: object | None = None) -> Any:
    request = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        data = response.read()
    return json.loads(data) if data else None


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssWatch:
    """The largest VmRSS of a process over a span, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, self.rss_kib())
            self._stop.wait(0.02)

    def __enter__(self) -> RssWatch:
        self.before_kib = self.rss_kib()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, self.rss_kib())


async def prepare(session: Any, mib: int) -> Any:
    """The site in the session and its server; returns the server's handle."""
    made = await session.exec(
        ["sh", "-c", f"mkdir -p site && head -c {mib * MIB} /dev/urandom > site/big.bin"], timeout_seconds=300
    )
    if made.exit_code != 0:
        raise RuntimeError(f"making the file: {made.stderr.decode()[-500:]}")
    await session.put_file("site/index.html", PAGE)
    handle = await session.exec_start(
        ["python3", "-m", "http.server", str(PORT), "--bind", "127.0.0.1", "--directory", "site"],
        timeout_seconds=3600,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            status, _ = await Raw(session).fetch("/index.html")
            if status == 200:
                return handle
        except (ConnectionRefusedError, ConnectionResetError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("http.server did not answer on port 8000 within 30 s")
        await asyncio.sleep(0.2)


async def preview_available(preview: Preview) -> str | None:
    """None when the route answers the small page, else why not."""
    try:
        status, body = await preview.fetch("/index.html")
    except OSError as e:
        return f"the preview route failed: {e}"
    if status != 200 or body != len(PAGE):
        return f"the preview route answered {status} with {body} bytes (not the page)"
    return None


async def measure(report: Report, server: JupyterServer, session_id: str, mib: int, rounds: int) -> None:
    sandbox = DockerSandbox()
    session = await sandbox.get(session_id)
    handle = await prepare(session, mib)
    try:
        raw = Raw(session)
        preview = Preview(server, session_id)
        why = await preview_available(preview)
        variants: list[Any] = [raw] if why else [raw, preview]
        if why:
            report.note(f"preview rows not measured: {why}")
            print(f"   !! {why}", flush=True)
        size = mib * MIB
        download: dict[str, list[float]] = {v.name: [] for v in variants}
        first: dict[str, list[float]] = {v.name: [] for v in variants}
        growth: list[float] = []
        server_cpu = 0.0
        assert server._process is not None
        for v in variants:  # warm-up: a small download and a page each
            await v.fetch("/index.html")
        for _ in range(rounds):
            for v in variants:
                watch = RssWatch(server._process.pid)
                cpu_before = cpu_seconds(server._process.pid)
                with watch:
                    started = time.perf_counter()
                    status, body = await v.fetch("/big.bin")
                    seconds = time.perf_counter() - started
                if v is not raw:
                    server_cpu += cpu_seconds(server._process.pid) - cpu_before
                if status != 200 or body != size:
                    raise RuntimeError(f"{v.name}: status {status}, {body} of {size} bytes")
                download[v.name].append(mib / seconds)
                if v is not raw:
                    growth.append(max(0, watch.peak_kib - watch.before_kib) / 1024)
            for _ in range(20):
                for v in variants:
                    started = time.perf_counter()
                    await v.fetch("/index.html", first_byte_only=True)
                    first[v.name].append((time.perf_counter() - started) * 1000)
        for v in variants:
            base = None if v is raw else raw.name
            report.add(
                Row(
                    "previews",
                    f"{mib} MiB download: {v.name}",
                    "MiB/s",
                    download[v.name],
                    baseline=base and f"{mib} MiB download: {base}",
                )
            )
        for v in variants:
            base = None if v is raw else raw.name
            report.add(
                Row(
                    "previews",
                    f"small page's first byte: {v.name}",
                    "ms",
                    first[v.name],
                    baseline=base and f"small page's first byte: {base}",
                )
            )
        if why:
            return
        report.add(Row("previews", "server RSS growth during a preview download", "MiB", growth))
        per_gib = server_cpu / (rounds * mib / 1024)
        report.meta["server CPU s per GiB relayed"] = per_gib
        print(f"   server CPU per GiB relayed by the preview: {per_gib:.2f} s", flush=True)
        ratio = statistics.median(download[preview.name]) / statistics.median(download[raw.name])
        report.target(
            f"{mib} MiB download through the preview >= 0.5x the raw port connection",
            ratio >= 0.5,
            f"{ratio:.2f}x",
        )
        most = max(growth)
        report.target(
            "the server's RSS grows < 32 MiB during a preview download", most < 32, f"at most {most:.1f} MiB"
        )
        added = statistics.median(first[preview.name]) - statistics.median(first[raw.name])
        report.target(
            "the preview adds <= 5 ms p50 to a small page's first byte", added <= 5, f"{added:+.2f} ms"
        )
    finally:
        with contextlib.suppress(Exception):
            await handle.kill()
        await sandbox.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, a 32 MiB download")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    mib, rounds = (32, 2) if args.quick else (256, 5)
    report = Report(quick=args.quick, image=PYTHON_IMAGE)
    report.meta["cpus"] = os.cpu_count()
    load_before = os.getloadavg()[0]
    # the server and this process name one deployment, so this process finds the server's session
    os.environ["TAI_SANDBOX_DEPLOYMENT"] = f"bench-previews-{os.getpid()}"
    with JupyterServer(provider="docker") as server:
        created = call(server, "POST", "api/sandbox/sessions", {"image": PYTHON_IMAGE, "network": "none"})
        session_id = created["id"]
        try:
            asyncio.run(measure(report, server, session_id, mib, rounds))
        finally:
            with contextlib.suppress(urllib.error.URLError):
                call(server, "DELETE", f"api/sandbox/sessions/{session_id}")
    report.meta["load average (1 min) before, after"] = [load_before, os.getloadavg()[0]]
    if load_before > 0.75 * (os.cpu_count() or 1):
        report.note(
            f"the machine was busy before the run (load {load_before:.1f}, {os.cpu_count()} CPUs): the rows "
            "shared its cores with other work"
        )
    print()
    print(report.table())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
