"""The tamper-evident audit log (issue 55): one hash-chained JSON line per session event.

:class:`~.settings.AuditSettings` configures it, :class:`~.log.AuditLog` writes it (a thread of its own),
:func:`~.verify.verify` checks it, :mod:`.show` reads it; ``jupyter tai-sandbox audit verify|show`` and
``GET /api/sandbox/audit`` are its doors. docs/operators/audit-log.md describes it.
"""

from __future__ import annotations

import os
from typing import Any

from .log import AuditLog
from .settings import AuditSettings

__all__ = ["AuditLog", "AuditSettings", "install"]


def install(app: Any) -> AuditLog | None:
    """The audit log of a SandboxApp (None when AuditSettings.enabled is off): its listener added to the app's
    event listeners, and the egress gateways' lines fed to it."""
    settings = AuditSettings(parent=app)
    if not settings.enabled:
        return None
    policy = app.policy

    def deployment() -> str | None:
        if settings.deployment:
            return settings.deployment
        provider = getattr(getattr(app, "sandbox", None), "provider", None)
        found = getattr(provider, "deployment", None)
        if isinstance(found, str) and found:
            return found
        access = getattr(app, "access", None)
        starting = access is not None and access.gate is None and access.failure is None
        if starting and getattr(app, "provider", "off") != "off":
            return None  # the provider is not made yet: asked again at the next line
        from ..providers.docker_engine.names import DEPLOYMENT_ENV, default_deployment

        return os.environ.get(DEPLOYMENT_ENV, "").strip() or default_deployment()

    log = AuditLog(
        settings.path,
        deployment=deployment,
        server=settings.server_name,
        max_bytes=settings.max_bytes,
        backups=settings.backups,
        fsync=settings.fsync,
        scrub_values=policy.injected_values,
        log=app.log,
    )
    app.event_listeners.append((log.listener, False))
    policy.egress_audit.listeners.append(log.egress)
    return log
