"""Prometheus metrics of the sandbox sessions on jupyter_server's ``/metrics`` (issue 55).

* :mod:`.series`: the series, once per process, on prometheus_client's default registry, and the collector
  of the gauges read at scrape time;
* :mod:`.listener`: a server's listener of its gates' events, and the source of its gauges;
* :mod:`.hooks`: what providers count under the gate (engine errors, agent reconnects, warm-pool takes),
  a no-op until a server turns metrics on;
* :mod:`.settings`: ``MetricsSettings`` (``enabled``, ``sessions_refresh_seconds``).

docs/operators/metrics.md lists every series.
"""

from __future__ import annotations

from .settings import MetricsSettings

__all__ = ["MetricsSettings"]
