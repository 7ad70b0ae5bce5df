"""Measurement helpers: rounds, medians/p95, ratios against baselines, targets, the table and chart."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import inspect
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jupyter_tai_sandbox.images import DEFAULT_IMAGE
from jupyter_tai_sandbox.providers.docker_engine import DockerEngine

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


@dataclass
class Row:
    group: str
    name: str
    unit: str  # "ms" (lower is better) or "MiB/s" (higher is better)
    samples: list[float]
    baseline: str | None = None  # the name of the row this one is compared with
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def p95(self) -> float:
        return percentile(self.samples, 0.95)


@dataclass
class Target:
    name: str
    passed: bool
    seen: str


class Report:
    def __init__(self, quick: bool = False, image: str | None = None) -> None:
        self.quick = quick
        self.image = image
        self.rows: dict[str, Row] = {}
        self.targets: list[Target] = []
        self.notes: list[str] = []
        self.meta: dict[str, Any] = {}

    def rounds(self, full: int) -> int:
        return max(2, full // 4) if self.quick else full

    @property
    def stdout_mib(self) -> int:
        """The size of a stdout stream measured (a smoke run moves an eighth of it)."""
        return 32 if self.quick else 256

    @property
    def stdin_mib(self) -> int:
        """The size of a stdin echo measured."""
        return 8 if self.quick else 64

    def add(self, row: Row) -> Row:
        self.rows[row.name] = row
        print(f"   {row.name:<48} median {row.median:9.2f} {row.unit:<5} p95 {row.p95:9.2f}", flush=True)
        return row

    def note(self, text: str) -> None:
        self.notes.append(text)

    def ratio(self, name: str) -> float | None:
        row = self.rows.get(name)
        base = self.rows.get(row.baseline) if row and row.baseline else None
        if row is None or base is None or not base.median:
            return None
        return row.median / base.median

    def target(self, name: str, passed: bool, seen: str) -> None:
        self.targets.append(Target(name, bool(passed), seen))
        print(f"   target {'PASS' if passed else 'MISS'}: {name} ({seen})", flush=True)

    # ------------------------------------------------------------- output

    def table(self) -> str:
        lines = [
            f"{'benchmark':<50} {'median':>10} {'p95':>10} {'unit':<6} {'ratio':>7}  baseline",
            "-" * 110,
        ]
        for row in self.rows.values():
            ratio = self.ratio(row.name)
            lines.append(
                f"{row.name:<50} {row.median:>10.2f} {row.p95:>10.2f} {row.unit:<6} "
                f"{'' if ratio is None else f'{ratio:.2f}x':>7}  {row.baseline or ''}"
            )
        lines += ["", "targets:"]
        lines += [f"  {'PASS' if t.passed else 'MISS'}  {t.name}: {t.seen}" for t in self.targets]
        if self.notes:
            lines += ["", "notes:"] + [f"  - {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        rows = []
        for row in self.rows.values():
            data = asdict(row)
            data.update(median=row.median, p95=row.p95, ratio=self.ratio(row.name))
            rows.append(data)
        return {
            "meta": self.meta,
            "rows": rows,
            "targets": [asdict(t) for t in self.targets],
            "notes": self.notes,
        }

    def chart(self, path: Path) -> Path | None:
        """One horizontal bar per compared row: its ratio to its baseline (1.0 = as fast as raw)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.note("matplotlib is not installed: no chart (pip install matplotlib)")
            return None
        compared = [(r.name, self.ratio(r.name), r.unit) for r in self.rows.values() if self.ratio(r.name)]
        if not compared:
            return None
        names = [n for n, _, _ in compared]
        # time ratios: lower is better; throughput ratios are inverted so that lower is better too
        values = [v if unit == "ms" else 1 / v for _, v, unit in compared]
        fig, ax = plt.subplots(figsize=(10, 0.42 * len(names) + 1.5))
        colors = ["#4c9a2a" if v <= 1.2 else "#e3a21a" if v <= 2 else "#c0392b" for v in values]
        ax.barh(names, values, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("cost relative to the baseline (time ratio; throughput inverted) - lower is better")
        ax.set_title("jupyter-tai-sandbox vs raw mechanisms (same run, same machine)")
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


async def _round_robin(
    rounds: int,
    variants: dict[str, Callable[[], Awaitable[Any]]],
    sample: Callable[[Any, float], float],
    settle: float = 0.0,
) -> dict[str, list[float]]:
    """Run the variants round-robin after one warm-up each, so drift on the machine hits each alike.
    ``settle``: an untimed pause before each call, so the work one variant leaves behind (an engine's
    cleanup after an exec) does not land in the next one's time."""
    for once in variants.values():
        await once()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, once in variants.items():
            if settle:
                await asyncio.sleep(settle)
            started = time.perf_counter()
            result = await once()
            samples[name].append(sample(result, time.perf_counter() - started))
    return samples


async def interleaved_throughput(
    rounds: int, variants: dict[str, Callable[[], Awaitable[int]]]
) -> dict[str, list[float]]:
    """MiB/s of several variants (each returns the bytes it moved)."""
    return await _round_robin(rounds, variants, lambda moved, seconds: moved / (1 << 20) / seconds)


async def interleaved(
    rounds: int, variants: dict[str, Callable[[], Awaitable[Any]]], settle: float = 0.0
) -> dict[str, list[float]]:
    """Milliseconds per call of several variants."""
    return await _round_robin(rounds, variants, lambda _result, seconds: seconds * 1000, settle)


# ------------------------------------------------ docker helpers every script shares

BENCH_LABEL = {"jupyter-tai-sandbox.bench": "1"}
TRUE_DOCKER = ["sh", "-c", ":"]  # a busybox image has no /bin/true


def _docker_client() -> Any:
    import docker

    client = docker.from_env(version="auto", timeout=120)
    client.ping()
    return client


def _image(report: Report) -> str:
    image = report.image or DEFAULT_IMAGE
    client = _docker_client()
    try:
        client.images.get(image)
    except Exception:
        from jupyter_tai_sandbox.providers.docker.images.build import build_minimal_image

        build_minimal_image(image)
    finally:
        client.close()
    return image


def _docker_sandbox(image: str, **traits: Any) -> Any:
    from jupyter_tai_sandbox.providers.docker import DockerSandbox

    return DockerSandbox(image=image, extra_labels=BENCH_LABEL, **traits)


def engine_floor(client: Any, image: str, network: str | None = None) -> float:
    """(Blocking.) The engine's own floor of a create to first command: an idle container's create + start +
    one exec through docker-py's low-level API, same image; seconds. ``network``: a user-defined bridge to
    start it on (the engine's default bridge when None)."""
    api = client.api
    started = time.perf_counter()
    container = api.create_container(
        image,
        ["sleep", "2147483647"],
        labels=BENCH_LABEL,
        host_config=api.create_host_config(init=True, network_mode=network),
        networking_config=api.create_networking_config({network: api.create_endpoint_config()})
        if network
        else None,
    )
    try:
        api.start(container)
        exec_id = api.exec_create(container, TRUE_DOCKER)
        api.exec_start(exec_id)
        assert api.exec_inspect(exec_id)["ExitCode"] == 0
        elapsed = time.perf_counter() - started
    finally:
        api.remove_container(container, force=True, v=True)
    return elapsed


#: a timed call under way in this task: a call it makes is inside its time, not counted again
_TIMED_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar("timed_call", default=False)


def time_calls(
    times: dict[str, list[float]], name: str, owner: Any, method: str, *, outermost: bool = False
) -> Any:
    """Time each call of the coroutine ``owner.method`` (ms) into ``times[name]``; the original, to put back.
    ``outermost``: not a call made by another such timed call (its time is in that one's)."""
    real = getattr(owner, method)

    @functools.wraps(real)
    async def call(*args: Any, **kwargs: Any) -> Any:
        if outermost and _TIMED_CALL.get():
            return await real(*args, **kwargs)
        token = _TIMED_CALL.set(True)
        started = time.perf_counter()
        try:
            return await real(*args, **kwargs)
        finally:
            times[name].append((time.perf_counter() - started) * 1000)
            _TIMED_CALL.reset(token)

    setattr(owner, method, call)
    return real


@contextlib.contextmanager
def timed_engine_calls() -> Iterator[dict[str, list[float]]]:
    """While inside, each public coroutine call of the provider's engine adapter (``DockerEngine``: the Docker
    API calls, the agent's connection) adds its wall time (ms) to ``calls[name]`` (a call inside another
    counts in that one's); put back on leaving."""
    calls: dict[str, list[float]] = collections.defaultdict(list)
    names = [
        name
        for name, _ in inspect.getmembers(DockerEngine, inspect.iscoroutinefunction)
        if not name.startswith("_")  # the public calls only: the private ones run inside them
    ]
    originals = [(name, time_calls(calls, name, DockerEngine, name, outermost=True)) for name in names]
    try:
        yield calls
    finally:
        for name, fn in originals:
            setattr(DockerEngine, name, fn)
