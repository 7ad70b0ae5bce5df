"""The Prometheus series, once per process, on prometheus_client's default registry (the one jupyter_server
serves at ``/metrics``).

Counters and histograms are module-level: every server of the process adds to them (two servers in one
process share them, as they share ``/metrics``). The gauges (sessions, live commands, the warm pool) are
read at scrape time by one :class:`SandboxCollector`, from the sources the servers registered, held weakly
(a server that is gone drops out). Labels are bounded: a provider's kind, a mode, a stream, an error's class
name, a door; never a session, user or command id. A label that takes more than :data:`MAX_VALUES` values
(a provider raising ever new exception classes, say) gets ``other`` for the rest.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import hooks

PREFIX = "jupyter_tai_sandbox_"
#: the most distinct values one label of one series takes; more are counted as ``other``
MAX_VALUES = 64
_VALUE = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")

#: create latency (seconds): a local session's few milliseconds up to a cold container's image pull
CREATE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
#: exec latency (seconds): a one-shot ``true`` up to a long interactive command
EXEC_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class _Bound:
    """Each label's values seen so far (at most MAX_VALUES of them, then ``other``)."""

    def __init__(self) -> None:
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str, value: object) -> str:
        text = value if isinstance(value, str) else ("unknown" if value is None else str(value))
        seen = self._seen.get(label)
        if seen is not None and text in seen:
            return text
        if not _VALUE.fullmatch(text):
            return "other"
        with self._lock:
            seen = self._seen.setdefault(label, set())
            if text in seen:
                return text
            if len(seen) >= MAX_VALUES:
                return "other"
            seen.add(text)
        return text


bound = _Bound()

SESSION_CREATES = Counter(
    PREFIX + "session_creates",
    "Sessions created through the policy gate, by provider and outcome (ok, error).",
    ["provider", "outcome"],
)
SESSION_CREATE_SECONDS = Histogram(
    PREFIX + "session_create_seconds",
    "Time a session create took (the policy's checks and the provider's create), by provider and outcome.",
    ["provider", "outcome"],
    buckets=CREATE_BUCKETS,
)
SESSION_CREATE_FAILURES = Counter(
    PREFIX + "session_create_failures",
    "Session creates that failed, by provider and the error's class name.",
    ["provider", "error"],
)
SESSION_EVENTS = Counter(
    PREFIX + "session_events",
    "Other session lifecycle events, by provider and event (destroy, reap, fork, pause, resume).",
    ["provider", "event"],
)
EXECS = Counter(
    PREFIX + "execs",
    "Commands ended, by provider, mode (one_shot, interactive) and outcome (ok: exit 0, nonzero, timeout, "
    "killed, error).",
    ["provider", "mode", "outcome"],
)
EXEC_SECONDS = Histogram(
    PREFIX + "exec_seconds",
    "Time from a command's start to its end (its exit, deadline or error), by provider and mode.",
    ["provider", "mode"],
    buckets=EXEC_BUCKETS,
)
EXEC_TIMEOUTS = Counter(
    PREFIX + "exec_timeouts",
    "Commands killed at their deadline (SandboxExecTimeoutError), by provider and mode.",
    ["provider", "mode"],
)
EXEC_KILLS = Counter(
    PREFIX + "exec_kills",
    "Commands that ended killed, by provider, mode and cause (signal: SIGKILL's status, a kill asked for or "
    "a lost watcher's; out_of_memory: the kernel's OOM killer at the session's limit).",
    ["provider", "mode", "cause"],
)
EXEC_ERRORS = Counter(
    PREFIX + "exec_errors",
    "Commands that ended with an error other than their deadline, by provider, mode and the error's class name.",
    ["provider", "mode", "error"],
)
EXEC_OUTPUT_BYTES = Counter(
    PREFIX + "exec_output_bytes",
    "Bytes commands wrote (before the scrub), by provider and stream (stdout, stderr).",
    ["provider", "stream"],
)
REFUSALS = Counter(
    PREFIX + "refusals",
    "Requests refused by the policy or the contract, by door (rest, ws, mcp...) and the error's class name.",
    ["door", "error"],
)
ENGINE_ERRORS = Counter(
    PREFIX + "engine_errors",
    "Docker engine calls that failed, by the error they were translated to (SandboxUnavailableError: not "
    "reached or no answer in time; EngineRefusedError: the engine answered an error; SandboxNotFoundError).",
    ["error"],
)
AGENT_RECONNECTS = Counter(
    PREFIX + "agent_reconnects",
    "Session agent connections opened again after the previous one was lost (container providers).",
)
POOL_TAKES = Counter(
    PREFIX + "pool_takes",
    "Creates that asked the docker provider's warm pool for a container, by outcome (hit, miss).",
    ["outcome"],
)


class _Hooks:
    """The providers' counts (:mod:`.hooks`) into the series."""

    def engine_error(self, error: str) -> None:
        ENGINE_ERRORS.labels(bound("engine_error", error)).inc()

    def agent_reconnect(self) -> None:
        AGENT_RECONNECTS.inc()

    def pool_take(self, hit: bool) -> None:
        POOL_TAKES.labels("hit" if hit else "miss").inc()


class Source(Protocol):
    """A server's gauges, read at scrape time (cheap: no provider call)."""

    def sessions(self) -> Mapping[tuple[str, str], int]:
        """(provider, state) -> sessions."""
        ...

    def live_commands(self) -> Mapping[str, int]:
        """state (running, ended) -> live commands held."""
        ...

    def pool(self) -> tuple[str, int, int] | None:
        """(provider, containers ready now, the pool's configured size), or None: no pool."""
        ...


class SandboxCollector(Collector):
    """The gauges of every registered source, summed (two servers in one process add up)."""

    def __init__(self) -> None:
        self._sources: weakref.WeakSet[Any] = weakref.WeakSet()

    def add(self, source: Source) -> None:
        self._sources.add(source)

    def discard(self, source: Source) -> None:
        self._sources.discard(source)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                PREFIX + "sessions",
                "Live sessions, by provider and state (running, paused): this server's, kept current by its own "
                "creates and destroys and re-read from the provider at most every "
                "MetricsSettings.sessions_refresh_seconds while scraped.",
                labels=["provider", "state"],
            ),
            GaugeMetricFamily(
                PREFIX + "live_commands",
                "Live commands held (exec websocket and MCP), by state (running, ended: kept for a reader).",
                labels=["state"],
            ),
            GaugeMetricFamily(
                PREFIX + "pool_ready",
                "Containers waiting in the warm pool now, by provider.",
                labels=["provider"],
            ),
            GaugeMetricFamily(
                PREFIX + "pool_size",
                "The warm pool's configured size (DockerSandbox.pool_size), by provider.",
                labels=["provider"],
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterator[Metric]:
        sessions, live, ready, size = self._families()
        session_counts: dict[tuple[str, str], int] = {}
        live_counts: dict[str, int] = {"running": 0, "ended": 0}
        pools: dict[str, tuple[int, int]] = {}
        for source in list(self._sources):
            for key, count in source.sessions().items():
                session_counts[key] = session_counts.get(key, 0) + count
            for state, count in source.live_commands().items():
                live_counts[state] = live_counts.get(state, 0) + count
            pool = source.pool()
            if pool is not None:
                provider, now, configured = pool
                was = pools.get(provider, (0, 0))
                pools[provider] = (was[0] + now, was[1] + configured)
        for (provider, state), count in sorted(session_counts.items()):
            sessions.add_metric([provider, state], count)
        for state, count in sorted(live_counts.items()):
            live.add_metric([state], count)
        for provider, (now, configured) in sorted(pools.items()):
            ready.add_metric([provider], now)
            size.add_metric([provider], configured)
        yield from (sessions, live, ready, size)


COLLECTOR = SandboxCollector()
REGISTRY.register(COLLECTOR)
hooks.install(_Hooks())
