"""Where the machine's CPU goes during a run, beyond the test processes' own trees (which
tests/support/scheduling.py's PhaseCpu measures per test phase): a sampler thread in the process that
started the run reads, every INTERVAL seconds, the kernel's split of the busy time (/proc/stat), the CPU of
the Docker engine's containers (its cgroup), of the engine's own daemons (dockerd, containerd, their shims
and proxies, by /proc/<pid>/stat) and of the kernel's own threads, and writes one line per interval to
tests/artifacts/cpu.tsv; its totals go in the run's summary.

A process that ends between two samples loses at most its last interval's CPU (runc's and the shims' short
lives, mostly); the extra engines the swarm tests start count with the tests that started them, not here.
Linux only; elsewhere (or without a readable /proc) every figure is 0 and the file says so.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TextIO

#: seconds between two samples (a scan of /proc costs a few ms)
INTERVAL = 10.0
#: the engine's daemons, by the process name the kernel keeps (15 characters at most)
ENGINE_NAMES = ("dockerd", "containerd", "containerd-shim", "docker-proxy", "runc", "docker-init")
#: the Docker engine's containers' CPU (cgroup v1's cpuacct in ns; v2's cpu.stat in µs), the first found
CONTAINER_CGROUPS = (
    Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage"),
    Path("/sys/fs/cgroup/cpu,cpuacct/docker/cpuacct.usage"),
    Path("/sys/fs/cgroup/docker/cpu.stat"),
    Path("/sys/fs/cgroup/system.slice/docker.service/cpu.stat"),
)
COLUMNS = ("user", "nice", "system", "irq", "steal", "idle", "containers", "engine", "kernel_threads")


def _hz() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def proc_stat() -> dict[str, float]:
    """The machine's CPU seconds since boot by kind (idle includes iowait)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return {}
    ticks += [0] * (8 - len(ticks))
    hz = _hz()
    user, nice, system, idle, iowait, irq, softirq, steal = ticks[:8]
    return {
        "user": user / hz,
        "nice": nice / hz,
        "system": system / hz,
        "irq": (irq + softirq) / hz,
        "steal": steal / hz,
        "idle": (idle + iowait) / hz,
    }


def container_seconds() -> float | None:
    """The CPU seconds the engine's containers have used (None where no cgroup says)."""
    for path in CONTAINER_CGROUPS:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.name == "cpuacct.usage":
            return int(text) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    return None


class ProcessCpu:
    """CPU seconds of the engine's daemons and of the kernel's threads, summed from per-process deltas."""

    def __init__(self) -> None:
        self.hz = _hz()
        self.seen: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, start tick): (kind, cpu)

    def kind(self, pid: int, name: str, ppid: int) -> str | None:
        if pid == 2 or ppid == 2:
            return "kernel_threads"
        if name.startswith(ENGINE_NAMES):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"tai-swarm-" in f.read():  # a swarm test's own engine: counts with its test
                        return None
            except OSError:
                return None
            return "engine"
        return None

    def sample(self) -> dict[str, float]:
        """CPU seconds by kind since the previous sample (a new process counts from its start)."""
        totals = {"engine": 0.0, "kernel_threads": 0.0}
        now: dict[tuple[int, int], tuple[str, float]] = {}
        try:
            pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
        except OSError:
            return totals
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    raw = f.read()
            except OSError:
                continue
            name = raw[raw.find("(") + 1 : raw.rfind(")")]
            fields = raw[raw.rfind(")") + 2 :].split()
            try:
                ppid, start = int(fields[1]), int(fields[19])
                cpu = (int(fields[11]) + int(fields[12])) / self.hz
            except (IndexError, ValueError):
                continue
            key = (pid, start)
            before = self.seen.get(key)
            kind = before[0] if before else self.kind(pid, name, ppid)
            if not kind:
                now[key] = ("", cpu)
                continue
            now[key] = (kind, cpu)
            totals[kind] += cpu - (before[1] if before else 0.0)
        self.seen = now
        return totals


class MachineCpu:
    """The sampler thread: ``start()``, then ``stop()`` returns the run's totals by COLUMNS (CPU seconds)."""

    def __init__(self, out: Path) -> None:
        self.out_path = out
        self.stopping = threading.Event()
        self.processes = ProcessCpu()
        self.totals = dict.fromkeys(COLUMNS, 0.0)
        self.started = time.monotonic()
        self.failed = False
        self.out: TextIO | None = None
        self.thread = threading.Thread(target=self.run, name="tai-machine-cpu", daemon=True)

    def reading(self) -> dict[str, float]:
        values = proc_stat()
        containers = container_seconds()
        values["containers"] = containers if containers is not None else 0.0
        return values

    def start(self) -> None:
        self.processes.sample()  # the engine's and the kernel threads' CPU so far is not the run's
        self.last = self.reading()
        out = self.out = open(self.out_path, "w", buffering=1)  # noqa: SIM115 (closed by stop)
        out.write("seconds\tbusy\t" + "\t".join(COLUMNS) + "\n")
        if container_seconds() is None:
            out.write("# no cgroup of the engine's containers found: containers are 0\n")
        self.thread.start()

    def run(self) -> None:
        while not self.stopping.wait(INTERVAL) and not self.failed:
            self.take()

    def take(self) -> None:
        out = self.out
        if out is None or self.failed:
            return
        try:
            now = self.reading()
            delta = {key: now.get(key, 0.0) - self.last.get(key, 0.0) for key in COLUMNS[:7]}
            if delta["containers"] < 0:  # the engine's cgroup was made again (an engine restart)
                delta["containers"] = now["containers"]
            delta.update(self.processes.sample())
            self.last = now
        except Exception as e:  # (a sampler's failure must not fail a test: it says so, once)
            self.failed = True
            out.write(f"# sampler stopped: {e!r}\n")
            return
        for key in COLUMNS:
            self.totals[key] += delta.get(key, 0.0)
        busy = sum(delta[key] for key in ("user", "nice", "system", "irq", "steal"))
        values = "\t".join(f"{delta.get(key, 0.0):.1f}" for key in COLUMNS)
        out.write(f"{time.monotonic() - self.started:.0f}\t{busy:.1f}\t{values}\n")

    def stop(self) -> dict[str, float]:
        """Stops the thread (a last sample up to now) and closes the file: the run's totals."""
        if self.thread.is_alive():
            self.stopping.set()
            self.thread.join(timeout=30)
            self.take()
        if self.out is not None and not self.out.closed:
            self.out.close()
        return dict(self.totals)
