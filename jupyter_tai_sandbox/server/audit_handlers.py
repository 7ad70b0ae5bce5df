"""``GET /api/sandbox/audit``: the audit log's lines, paged by seq (admins all of them, a user their own)."""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..contract import SandboxForbiddenError, SandboxNotFoundError, SandboxRequestError
from .handlers import SandboxAPIHandler

#: the most lines one page holds
MAX_LIMIT = 1000


class AuditHandler(SandboxAPIHandler):
    """``GET audit?limit=&before=&after=&user=&session=&kind=&since=&until=``: matching lines in seq order,
    the newest ``limit`` (before the seq ``before``), or with ``after`` the oldest ``limit`` after that seq;
    ``more`` says whether more match beyond the page. An admin (read on jupyter_tai_sandbox:admin) reads
    every line; a user only the lines whose owner they are, and naming another user is 403."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        audit = getattr(self.extensionapp, "audit_log", None)
        if audit is None:
            raise SandboxNotFoundError("the audit log is off (AuditSettings.enabled)")
        caller = await self.caller()
        user = self.get_argument("user", None) or None
        owner = None
        if not caller.sees_all:
            if user is not None and user != caller.name:
                raise SandboxForbiddenError(
                    "another user's audit lines need read on jupyter_tai_sandbox:admin; leave user unset for your own"
                )
            owner, user = caller.name, None
        from ..audit.show import Filter, page, parse_time

        limit = self._whole("limit", 1, MAX_LIMIT, 100)
        before = self._whole("before", 1, None, None)
        after = self._whole("after", 0, None, None)
        try:
            since = parse_time(self.get_argument("since", None), "since")
            until = parse_time(self.get_argument("until", None), "until")
        except ValueError as e:
            raise SandboxRequestError(
                str(e), field="since" if str(e).startswith("since") else "until"
            ) from None
        which = Filter(
            user=user,
            owner=owner,
            session=self.get_argument("session", None) or None,
            kinds=tuple(k for k in self.get_arguments("kind") if k),
            since=since,
            until=until,
            after=after,
            before=before,
        )
        await asyncio.to_thread(audit.flush, 2.0)  # what happened before this request is on disk
        lines, more = await asyncio.to_thread(page, audit.path, which, limit)
        self.write_json({"lines": lines, "more": more})

    def _whole(self, name: str, low: int, high: int | None, fallback: Any) -> Any:
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return fallback
        if not (raw.isascii() and raw.isdigit()) or int(raw) < low or (high is not None and int(raw) > high):
            span = f"from {low} to {high}" if high is not None else f"of {low} or more"
            raise SandboxRequestError(f"{name}: a whole number {span}", field=name)
        return int(raw)


audit_handlers = [(r"/api/sandbox/audit", AuditHandler)]
