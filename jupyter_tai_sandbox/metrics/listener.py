"""One server's metrics: the listener of its gates' events, and the source of its gauges.

The listener is cheap (called on the loop for every event): a dict look-up for the kind, the labelled
children cached, a counter or two. Sessions are kept per server as id -> (provider, paused) from its own
events (a create, fork, pause, resume, destroy, reap), so the gauge is current without asking the provider;
what the events cannot see (sessions adopted at start, made by another server of the deployment, or gone
behind the server's back) is read from the provider's ``list`` in the background, at most every
``refresh_seconds``, only while someone scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from .. import events as ev
from ..events import SandboxEvent
from . import series
from .series import bound

log = logging.getLogger(__name__)

#: the labelled children cached by their raw label values (cleared when past this)
MAX_CHILDREN = 4096
#: SIGKILL's status as the providers report it (128 + 9), and as a Python returncode
_KILLED = (137, -9)
_LIFECYCLE = {
    ev.SESSION_DESTROY: "destroy",
    ev.SESSION_REAP: "reap",
    ev.SESSION_FORK: "fork",
    ev.SESSION_PAUSE: "pause",
    ev.SESSION_RESUME: "resume",
}


class ServerMetrics:
    """A server's listener (``__call__``) and gauge source. Holds its app weakly."""

    def __init__(self, app: Any, *, refresh_seconds: float = 30.0) -> None:
        self._app = weakref.ref(app)
        self.refresh_seconds = refresh_seconds
        #: session id -> (provider, paused)
        self._sessions: dict[str, tuple[str, bool]] = {}
        self._refreshed = float("-inf")
        self._refreshing: asyncio.Task[None] | None = None
        #: sessions an event changed while a refresh was listing (the event wins)
        self._touched: set[str] | None = None
        self._children: dict[tuple[Any, ...], Any] = {}
        self._handlers: dict[str, Callable[[SandboxEvent], None]] = {
            ev.SESSION_CREATE: self._created,
            ev.SESSION_CREATE_FAILED: self._create_failed,
            ev.SESSION_FORK: self._forked,
            ev.SESSION_DESTROY: self._ended,
            ev.SESSION_REAP: self._ended,
            ev.SESSION_PAUSE: self._paused,
            ev.SESSION_RESUME: self._paused,
            ev.EXEC_END: self._exec_ended,
            ev.REFUSAL: self._refused,
        }

    # ------------------------------------------------------------ listener

    def __call__(self, event: SandboxEvent) -> None:
        handler = self._handlers.get(event.kind)
        if handler is not None:
            handler(event)

    def _child(self, metric: Any, *labels: Any) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= MAX_CHILDREN:  # raw values past the bound all map to "other"
                self._children.clear()
            values = (bound(f"{id(metric)}:{i}", value) for i, value in enumerate(labels))
            child = self._children[key] = metric.labels(*values) if labels else metric
        return child

    def _provider(self, event: SandboxEvent) -> str:
        return event.provider or "unknown"

    def _created(self, event: SandboxEvent) -> None:
        provider = self._provider(event)
        self._child(series.SESSION_CREATES, provider, "ok").inc()
        self._child(series.SESSION_CREATE_SECONDS, provider, "ok").observe(event.data.get("seconds") or 0.0)
        self._track(event.session, provider, False)

    def _create_failed(self, event: SandboxEvent) -> None:
        provider = self._provider(event)
        self._child(series.SESSION_CREATES, provider, "error").inc()
        self._child(series.SESSION_CREATE_SECONDS, provider, "error").observe(
            event.data.get("seconds") or 0.0
        )
        self._child(series.SESSION_CREATE_FAILURES, provider, event.data.get("error")).inc()

    def _forked(self, event: SandboxEvent) -> None:
        self._lifecycle(event)
        self._track(event.session, self._provider(event), False)

    def _ended(self, event: SandboxEvent) -> None:
        self._lifecycle(event)
        if event.session is not None:
            self._sessions.pop(event.session, None)
            if self._touched is not None:
                self._touched.add(event.session)

    def _paused(self, event: SandboxEvent) -> None:
        self._lifecycle(event)
        self._track(event.session, self._provider(event), event.kind == ev.SESSION_PAUSE)

    def _lifecycle(self, event: SandboxEvent) -> None:
        self._child(series.SESSION_EVENTS, self._provider(event), _LIFECYCLE[event.kind]).inc()

    def _track(self, session: str | None, provider: str, paused: bool) -> None:
        if session is not None:
            self._sessions[session] = (provider, paused)
            if self._touched is not None:
                self._touched.add(session)

    def _exec_ended(self, event: SandboxEvent) -> None:
        data = event.data
        provider = self._provider(event)
        mode = "one_shot" if data.get("one_shot") else "interactive"
        error = data.get("error")
        exit_code = data.get("exit_code")
        reason = data.get("reason") or ""
        if error == "SandboxExecTimeoutError":
            outcome = "timeout"
            self._child(series.EXEC_TIMEOUTS, provider, mode).inc()
        elif error is not None:
            outcome = "error"
            self._child(series.EXEC_ERRORS, provider, mode, error).inc()
        elif reason.startswith("killed: out of memory"):
            outcome = "killed"
            self._child(series.EXEC_KILLS, provider, mode, "out_of_memory").inc()
        elif exit_code in _KILLED:
            outcome = "killed"
            self._child(series.EXEC_KILLS, provider, mode, "signal").inc()
        else:
            outcome = "ok" if exit_code == 0 else "nonzero"
        self._child(series.EXECS, provider, mode, outcome).inc()
        self._child(series.EXEC_SECONDS, provider, mode).observe(data.get("seconds") or 0.0)
        out, err = data.get("stdout_bytes") or 0, data.get("stderr_bytes") or 0
        if out:
            self._child(series.EXEC_OUTPUT_BYTES, provider, "stdout").inc(out)
        if err:
            self._child(series.EXEC_OUTPUT_BYTES, provider, "stderr").inc(err)

    def _refused(self, event: SandboxEvent) -> None:
        self._child(series.REFUSALS, event.data.get("door"), event.data.get("error")).inc()

    # -------------------------------------------------------------- gauges

    def _live_app(self) -> Any:
        """The server, None once it is gone or stopping (a stopped server of the process adds nothing)."""
        app = self._app()
        if app is None or getattr(getattr(app, "registry", None), "stopping", False):
            return None
        return app

    def _gate(self) -> Any:
        return getattr(self._live_app(), "sandbox", None)

    def sessions(self) -> Mapping[tuple[str, str], int]:
        gate = self._gate()
        counts: dict[tuple[str, str], int] = {}
        if gate is not None:  # both states of the server's provider, 0 or not: the series stay the same
            counts[(bound("provider", gate.kind), "running")] = 0
            counts[(bound("provider", gate.kind), "paused")] = 0
            self._refresh_soon(gate)
        elif self._live_app() is None:
            return counts
        for provider, paused in self._sessions.values():
            key = (bound("provider", provider), "paused" if paused else "running")
            counts[key] = counts.get(key, 0) + 1
        return counts

    def _refresh_soon(self, gate: Any) -> None:
        """Re-read the provider's sessions in the background when the last read is older than refresh_seconds
        (on the server's loop; a scrape from another thread reads what is known)."""
        if self.refresh_seconds <= 0 or time.monotonic() - self._refreshed < self.refresh_seconds:
            return
        if self._refreshing is not None and not self._refreshing.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._refreshed = time.monotonic()
        self._refreshing = loop.create_task(self._refresh(gate))

    async def _refresh(self, gate: Any) -> None:
        self._touched = set()
        try:
            infos = await gate.list()
        except Exception as e:  # the provider cannot list now: the events' count stands
            log.debug("jupyter_tai_sandbox metrics: listing the sessions failed: %s", e)
            return
        finally:
            touched, self._touched = self._touched, None
        # the gate's kind, as its events say (a remote provider lists the far server's kind)
        listed = {info.id: (gate.kind, bool(getattr(info, "paused", False))) for info in infos}
        for session in touched or ():
            if session in self._sessions:
                listed[session] = self._sessions[session]
            else:
                listed.pop(session, None)
        self._sessions = listed

    def live_commands(self) -> Mapping[str, int]:
        execs = getattr(self._live_app(), "execs", None)
        if execs is None:
            return {}
        running = execs.running_count()
        return {"running": running, "ended": max(0, len(execs) - running)}

    def pool(self) -> tuple[str, int, int] | None:
        gate = self._gate()
        provider = getattr(gate, "provider", None)
        # the docker provider's warm pool (DockerSandbox._pool): read, never asked anything
        pool = getattr(provider, "_pool", None)
        if pool is None or not hasattr(pool, "ready_count"):
            return None
        return bound("provider", gate.kind), pool.ready_count(), int(getattr(pool, "size", 0) or 0)

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(BaseException):
                await self._refreshing
