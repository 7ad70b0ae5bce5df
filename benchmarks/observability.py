"""Auditing and metrics on vs off (issue 55): a one-shot exec through the policy gate with the audit log and
the Prometheus metrics listening, against the same session through a gate nothing listens to.

    python benchmarks/observability.py [--quick] [--only local|docker] [--json FILE]

Every gate wraps one provider and reaches one session (made once): the "off" gate has no listener, so its
exec takes the gate's event-free path; the "on" gate has the server's metrics listener
(``jupyter_tai_sandbox.metrics``: counters and a histogram per exec) and the audit log's listener (the
hash-chained log of ``jupyter_tai_sandbox.audit``, written by its own thread to a file in a temporary folder;
where that package is absent, a stand-in that queues each event to a thread writing one JSON line per event);
two more gates have each listener alone (rows for information). The variants run in one run, each round in a
random order (``true``; ``sh -c :`` on docker, whose image has no /bin/true), and the medians are compared;
the median of the same round's differences is printed beside. Also ``run.py --only observability``.

Target (issue 55): the overhead (median on - median off) <= 5% of the median off, or <= 0.2 ms, whichever is
larger; printed PASS/FAIL per provider.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import Report, Row

from jupyter_tai_sandbox.contract import ExecRequest, SessionSpec
from jupyter_tai_sandbox.events import SandboxEvent
from jupyter_tai_sandbox.gate import GatedSandbox
from jupyter_tai_sandbox.metrics.listener import ServerMetrics
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox

ROUNDS = {"local": 400, "docker": 100}
ARGV = {"local": ["true"], "docker": ["sh", "-c", ":"]}


class JsonLines:
    """The audit log's stand-in: events queued on the loop, one JSON line each written by a thread."""

    def __init__(self, path: Path) -> None:
        self._queue: queue.SimpleQueue[SandboxEvent | None] = queue.SimpleQueue()
        self._file = path.open("a", encoding="utf-8")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def listener(self, event: SandboxEvent) -> None:
        self._queue.put(event)

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            record = {"time": event.time, "kind": event.kind, "session": event.session, "owner": event.owner}
            record["data"] = {
                k: v for k, v in event.data.items() if isinstance(v, (str, int, float, type(None)))
            }
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)
        self._file.close()


def audit_listener(folder: Path) -> tuple[Callable[[SandboxEvent], None], Callable[[], None], str]:
    """(the listener, its close, which one): the real audit log when the package is there."""
    try:
        from jupyter_tai_sandbox.audit import AuditLog
    except ImportError:
        stand_in = JsonLines(folder / "audit.jsonl")
        return stand_in.listener, stand_in.close, "a JSON-lines stand-in (jupyter_tai_sandbox.audit absent)"
    log = AuditLog(str(folder / "audit.jsonl"), deployment="bench", server="bench")
    return log.listener, log.close, "jupyter_tai_sandbox.audit.AuditLog"


class _App:
    """What the metrics listener holds (weakly) of a server: nothing is scraped here."""

    sandbox = None
    execs = None


async def shuffled_rounds(
    rounds: int, variants: dict[str, Callable[[], Awaitable[Any]]]
) -> dict[str, list[float]]:
    """Milliseconds per call of each variant, each round in a random order: the audit writer's work left
    behind by one call lands as often after each variant (a fixed order would always charge it to the same
    next one). Sample i of every variant is from round i."""
    order = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in order}
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            started = time.perf_counter()
            await variants[name]()
            samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def provider_for(kind: str, folder: Path) -> Any:
    if kind == "local":
        return LocalSandbox(root=str(folder / "sandboxes"))
    from _bench import _docker_sandbox, _image

    return _docker_sandbox(_image(Report()))


async def rows(report: Report, kinds: tuple[str, ...] = ("local", "docker")) -> None:
    """Each provider's rows (nothing listening: the baseline; audit + metrics: the target's; each alone) and
    its target."""
    for kind in kinds:
        folder = Path(tempfile.mkdtemp(prefix="tai-bench-observability-"))
        provider = provider_for(kind, folder)
        policy = SandboxPolicy(isolation="none")
        app = _App()
        listener, close, which = audit_listener(folder)
        base = f"{kind} one-shot exec: nothing listening"
        name = f"{kind} one-shot exec: audit + metrics"
        # the target's gate (both listening), and each alone for information
        listening: dict[str, list[Callable[[SandboxEvent], None]]] = {
            base: [],
            name: [ServerMetrics(app, refresh_seconds=0), listener],
            f"{kind} one-shot exec: metrics only": [ServerMetrics(app, refresh_seconds=0)],
            f"{kind} one-shot exec: audit only": [listener],
        }
        gates = {}
        for variant, listeners in listening.items():
            gates[variant] = GatedSandbox(provider, policy, 64 << 20, 1 << 30)
            for each in listeners:
                gates[variant].events.subscribe(each)
        session = await gates[base].create(SessionSpec(ttl_seconds=600))
        try:
            request = ExecRequest(ARGV[kind], 30)
            variants = {}
            for variant, gate in gates.items():
                gated = await gate.get(session.id)

                async def run(gated: Any = gated, request: ExecRequest = request) -> None:
                    assert (await gated.run(request)).exit_code == 0

                for _ in range(5):  # warm each path (imports, the agent's connection)
                    await run()
                variants[variant] = run
            samples = await shuffled_rounds(report.rounds(ROUNDS[kind]), variants)
        finally:
            await session.destroy()
            await provider.close()
            close()
            shutil.rmtree(folder, ignore_errors=True)
        # the same round's two calls, paired: drift on the machine cancels (information, beside the target)
        paired = statistics.median(on - off for on, off in zip(samples[name], samples[base], strict=True))
        report.add(Row("observability", base, "ms", samples.pop(base)))
        row = report.add(
            Row("observability", name, "ms", samples.pop(name), baseline=base, extra={"audit": which})
        )
        for variant, values in samples.items():
            report.add(Row("observability", variant, "ms", values, baseline=base))
        off_ms = report.rows[base].median
        overhead = row.median - off_ms
        allowed = max(0.05 * off_ms, 0.2)
        report.target(
            f"{kind} one-shot exec overhead of audit + metrics <= 5% or <= 0.2 ms, whichever is larger",
            overhead <= allowed,
            f"{overhead:+.3f} ms on {off_ms:.3f} ms ({row.median / off_ms:.3f}x; allowed {allowed:.3f} ms; "
            f"paired by round {paired:+.3f} ms)",
        )
        report.note(f"observability ({kind}): the audit listener was {which}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the rounds")
    parser.add_argument("--only", action="append", choices=["local", "docker"], help="only these providers")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    report = Report(quick=args.quick)
    report.meta["cpus"] = os.cpu_count()
    asyncio.run(rows(report, tuple(args.only or ("local", "docker"))))
    print(report.table())
    for target in report.targets:
        print(f"{'PASS' if target.passed else 'FAIL'}: {target.name}: {target.seen}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
    return 0 if all(t.passed for t in report.targets) else 1


if __name__ == "__main__":
    sys.exit(main())
