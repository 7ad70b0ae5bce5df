"""Reading the audit log: the lines of a user, a session, a kind or a time span (``audit show`` and
``GET /api/sandbox/audit``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..egress_audit import record_time
from .log import last_line, log_files, parse_line


def parse_time(value: str | float | None, what: str) -> float | None:
    """Epoch seconds of ``value`` (epoch seconds or RFC 3339); ValueError naming ``what`` when it is neither."""
    if value is None or value == "":
        return None
    moment = record_time(value)
    if moment is None:
        raise ValueError(f"{what}: {value!r} is neither epoch seconds nor an RFC 3339 time")
    return moment


@dataclass(frozen=True)
class Filter:
    """Which lines: ``user`` (the line's owner, or its actor), ``session``, ``kinds`` (exact kinds, or a
    prefix ending in a dot: ``exec.``), ``since``/``until`` (epoch seconds, inclusive), and a seq window
    (``after`` < seq < ``before``)."""

    user: str | None = None
    session: str | None = None
    kinds: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    after: int | None = None
    before: int | None = None
    #: only lines whose owner is this (a user reading their own: the actor does not count)
    owner: str | None = None

    def matches(self, record: dict[str, Any]) -> bool:
        seq = record.get("seq")
        if not isinstance(seq, int):
            return False
        if self.after is not None and seq <= self.after:
            return False
        if self.before is not None and seq >= self.before:
            return False
        if self.owner is not None and record.get("owner") != self.owner:
            return False
        if self.user is not None and self.user not in (record.get("owner"), record.get("actor")):
            return False
        if self.session is not None and record.get("session") != self.session:
            return False
        if self.kinds:
            kind = str(record.get("kind"))
            if not any(kind == k or (k.endswith(".") and kind.startswith(k)) for k in self.kinds):
                return False
        if self.since is not None or self.until is not None:
            moment = record_time(record.get("time"))
            if moment is None:
                return False
            if self.since is not None and moment < self.since:
                return False
            if self.until is not None and moment > self.until:
                return False
        return True


def select(records: Iterable[dict[str, Any]], which: Filter) -> Iterator[dict[str, Any]]:
    return (record for record in records if which.matches(record))


def _records_of(name: str, newest_first: bool) -> Iterator[dict[str, Any]]:
    try:
        with open(name, "rb") as f:
            data = f.read()
    except OSError:
        return
    lines = data.split(b"\n")
    for raw in reversed(lines) if newest_first else lines:
        record = parse_line(raw)
        if record is not None:
            yield record


def page(path: str, which: Filter, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """At most ``limit`` matching lines, in seq order, and whether more match beyond them: the oldest after
    ``which.after`` when it is set, else the newest (before ``which.before``). Files are read one at a time,
    from the end the page starts at, until the page is full."""
    files = log_files(path)
    found: list[dict[str, Any]] = []
    if which.after is not None:
        for name in files:
            last, _, _ = last_line(name)
            if last is not None and last <= which.after:
                continue  # wholly before the page
            for record in _records_of(name, newest_first=False):
                if which.matches(record):
                    found.append(record)
                    if len(found) > limit:
                        return found[:limit], True
        return found, False
    for name in reversed(files):
        for record in _records_of(name, newest_first=True):
            if which.matches(record):
                found.append(record)
                if len(found) > limit:
                    return found[:limit][::-1], True
    return found[::-1], False
