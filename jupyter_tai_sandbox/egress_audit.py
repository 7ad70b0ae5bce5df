"""The egress audit: where the egress gateways' decisions end up.

Each gateway writes one JSON line per decision (a DNS answer, a connection allowed or refused, a secret
substituted: by name, never its value); its provider's pump hands each record to
:meth:`EgressAudit.audit` (through the gate's :class:`~jupyter_tai_sandbox.contract.EgressHooks`). The sink
appends it to the operator's file (``SandboxPolicy.egress_audit_path``) and keeps the last
:data:`MEMORY_LINES` in memory for ``GET /api/sandbox/egress/audit`` (:meth:`EgressAudit.query`).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

#: the most audit lines kept in memory (the file keeps them all)
MEMORY_LINES = 10_000
#: how much of an existing file is read back at start (its last lines fill the memory)
_TAIL_BYTES = 8 << 20
#: how often the file's name is checked for a rotation (moved away by logrotate: a new file is opened)
_REOPEN_CHECK_SECONDS = 1.0
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
        self._file: Any = None
        self._checked = 0.0
        self._failed = False
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

    def _write(self, text: str) -> None:
        try:
            now = time.monotonic()
            if self._file is not None and now - self._checked > _REOPEN_CHECK_SECONDS:
                self._checked = now
                try:
                    rotated = os.stat(self.path).st_ino != os.fstat(self._file.fileno()).st_ino  # type: ignore[arg-type]
                except OSError:
                    rotated = True
                if rotated:
                    self._file.close()
                    self._file = None
            if self._file is None:
                folder = os.path.dirname(self.path or "")
                if folder:
                    os.makedirs(folder, exist_ok=True)
                fd = os.open(self.path or "", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                self._file = os.fdopen(fd, "a", encoding="utf-8")
                self._checked = now
            self._file.write(text)
            self._file.flush()
            self._failed = False
        except OSError as e:
            if not self._failed:
                self.log.warning("egress audit: cannot append to %s: %s (kept in memory only)", self.path, e)
            self._failed = True
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None

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

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
