"""The egress audit: where the egress gateways' decisions end up.

Each gateway writes one JSON line per decision (a DNS answer, a connection allowed or refused, a secret
substituted: by name, never its value); its provider's pump hands each record to
:meth:`EgressAudit.audit` (through the gate's :class:`~jupyter_tai_sandbox.contract.EgressHooks`). The sink
appends it to the operator's file (``SandboxPolicy.egress_audit_path``) and keeps the last
:data:`MEMORY_LINES` in memory for ``GET /api/sandbox/egress/audit`` (:meth:`EgressAudit.query`).
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

#: the most audit lines kept in memory (the file keeps them all)
MEMORY_LINES = 10_000
#: how much of an existing file is read back at start (its last lines fill the memory)
_TAIL_BYTES = 8 << 20
_FRACTION = re.compile(r"\.(\d+)")


def record_time(value: Any) -> float | None:
    """Epoch seconds of an audit line's ``time`` (RFC 3339, nanoseconds allowed) or of a number; None when
    it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    text = text.replace("Z", "+00:00").replace("z", "+00:00")
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text, count=1)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


class EgressAudit:
    """Appends audit records to ``path`` (None: no file) and keeps the last ``keep`` in memory.

    Safe to call from any thread. A write error is logged once and the memory still keeps the line.
    """

    def __init__(
        self, path: str | None, *, keep: int = MEMORY_LINES, log: logging.Logger | Any = None
    ) -> None:
        self.path = path or None
        self.log = log or logging.getLogger(__name__)
        self._lines: collections.deque[tuple[float, dict[str, Any]]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._made_folder = False
        self._failed = False
        #: called with each record after it is kept (the audit log's egress feed); any thread
        self.listeners: list[Callable[[Mapping[str, Any]], None]] = []
        if self.path is not None:
            self._read_tail()

    def _read_tail(self) -> None:
        assert self.path is not None
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - _TAIL_BYTES))
                data = f.read()
        except OSError:
            return
        lines = data.split(b"\n")
        if size > _TAIL_BYTES:
            lines = lines[1:]  # the first may be cut
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self._lines.append((record_time(record.get("time")) or 0.0, record))

    def audit(self, record: Mapping[str, Any]) -> None:
        """Keep one audit record: appended to the file, and to the lines in memory."""
        line = dict(record)
        with self._lock:
            self._lines.append((record_time(line.get("time")) or time.time(), line))
            if self.path is not None:
                self._write(json.dumps(line, separators=(",", ":"), default=str) + "\n")
        for listener in self.listeners:
            try:
                listener(line)
            except Exception:
                self.log.exception("egress audit: listener %r failed", listener)

    def _write(self, text: str) -> None:
        """Append one line: the file is opened for each (a rotation, logrotate moving it away, is followed at
        once, and no handle outlives the call)."""
        assert self.path is not None
        try:
            folder = os.path.dirname(self.path)
            if folder and not self._made_folder:
                os.makedirs(folder, exist_ok=True)
                self._made_folder = True
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, text.encode("utf-8", "surrogatepass"))
            finally:
                os.close(fd)
            self._failed = False
        except OSError as e:
            if not self._failed:
                self.log.warning("egress audit: cannot append to %s: %s (kept in memory only)", self.path, e)
            self._failed = True

    def query(
        self,
        owner: str | None = None,
        session: str | None = None,
        since: float | str | None = None,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """The newest ``limit`` lines in memory (oldest first) of ``owner`` and ``session`` (None: any), at
        or after ``since`` (epoch seconds or RFC 3339)."""
        after = record_time(since) if since is not None else None
        if since is not None and after is None:
            raise ValueError(f"since: {since!r} is neither epoch seconds nor an RFC 3339 time")
        with self._lock:
            lines = list(self._lines)
        out: list[dict[str, Any]] = []
        for moment, record in reversed(lines):
            if len(out) >= limit:
                break
            if after is not None and moment < after:
                continue
            if owner is not None and record.get("owner") != owner:
                continue
            if session is not None and record.get("session") != session:
                continue
            out.append(record)
        out.reverse()
        return out
