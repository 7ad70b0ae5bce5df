"""``GET /api/sandbox/usage``: the recent CPU, memory and disk samples of every session the caller may see, in
one request (the panel's sparklines).

Thin: it tells the server's :class:`~jupyter_tai_sandbox.usage_history.UsageHistory` that the caller looks
(which keeps its sampler running, or starts it and waits for its first round), and answers from the history.
A request measures nothing itself. A user gets their own sessions; an admin too, unless they ask for every
user's with ``all=1`` (read on ``jupyter_tai_sandbox:admin``; anyone else asking is 403).
"""

from __future__ import annotations

from typing import Any, cast

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..contract import SandboxForbiddenError, SandboxRequestError
from ..usage_history import UsageHistory
from .handlers import SandboxAPIHandler

_YES, _NO = ("1", "true", "yes"), ("0", "false", "no", "")


class UsageHandler(SandboxAPIHandler):
    """``{"interval_seconds": 5, "samples_kept": 60, "sampling": true, "sessions": [{"id", "owner", "consumer",
    "serves": {"kind", "name"}, "paused", "samples": [{"time", "cpu", "cpu_seconds", "memory_bytes",
    "memory_limit_bytes", "disk_bytes", "disk_partial"}], "last": <the last usage record> | null}]}``."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        caller = await self.caller()
        flag = self.get_argument("all", "0").lower()
        if flag not in _YES + _NO:
            raise SandboxRequestError("all: 1 (every user's sessions, for an admin) or 0", field="all")
        everyone = flag in _YES
        if everyone and not caller.sees_all:
            raise SandboxForbiddenError(
                "every user's usage needs read on jupyter_tai_sandbox:admin; leave all unset for your own"
            )
        self.sandbox_app.access.require()  # off, or a provider that could not start: 503 saying why
        history = self.usage_history
        await history.ask(caller.name, everyone=everyone)
        self.write_json(history.answer(None if everyone else caller.name))

    @property
    def usage_history(self) -> UsageHistory:
        return cast("UsageHistory", cast("Any", self.sandbox_app).usage_history)


usage_handlers = [
    (r"/api/sandbox/usage", UsageHandler),
]
