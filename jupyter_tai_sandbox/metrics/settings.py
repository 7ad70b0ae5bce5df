"""The metrics' settings (``c.MetricsSettings``), and their attachment to a server."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Float
from traitlets.config import LoggingConfigurable


class MetricsSettings(LoggingConfigurable):
    """Prometheus metrics of the sandbox sessions, served at jupyter_server's ``/metrics`` (see the operators'
    metrics page): on by default, cheap (a counter or two per event, gauges read at scrape time)."""

    enabled = Bool(
        True,
        help="""Export the sandbox metrics (series named jupyter_tai_sandbox_*) on jupyter_server's /metrics,
        which ServerApp.authenticate_prometheus guards as it guards the server's own series. False: no
        listener is subscribed to the policy gate's events and no series is registered by this server.""",
    ).tag(config=True)

    sessions_refresh_seconds = Float(
        30.0,
        help="""The jupyter_tai_sandbox_sessions gauge follows this server's own creates and destroys at once;
        what they cannot show (sessions adopted at start, made by another server of the deployment, or gone
        behind the server's back) is read from the provider's session listing in the background at most this
        often, and only while /metrics is scraped. 0: never (the events alone).""",
    ).tag(config=True)

    def attach(self, app: Any) -> Any:
        """The listener of ``app``'s gates (its gauges registered with the process's collector), or None
        when metrics are off."""
        if not self.enabled:
            return None
        from .listener import ServerMetrics
        from .series import COLLECTOR

        metrics = ServerMetrics(app, refresh_seconds=self.sessions_refresh_seconds)
        COLLECTOR.add(metrics)
        return metrics
