"""The audit log's writer: one hash-chained JSON line per session event, appended by a thread of its own.

Each line is a JSON object: ``seq`` (1, 2, 3... across rotated files), ``time`` (RFC 3339, UTC), ``deployment``,
``server``, ``kind`` (an :mod:`~jupyter_tai_sandbox.events` kind), ``owner``, ``consumer``, ``session``,
``actor``, ``provider``, ``data`` (the kind's own keys) and last ``prev``: the sha256 (hex) of the previous
line's bytes (without its newline; 64 zeros before the first line). The chain goes on across a rotation: the
first line of a new file chains to the last line of the one rotated away.

Why a thread: a listener runs on the event loop and must never block it. :meth:`AuditLog.listener` only puts
the event on a queue (a ``SimpleQueue.put``, well under a microsecond); the writer thread takes what has
queued, serializes and scrubs it, hashes the chain and appends the batch with one ``write`` under an
``flock`` of ``PATH.lock`` (so several servers may share one file: each reads the tail again when the file
changed under it, and chains to the last line on disk). Small appends from the loop would block it on a slow
disk, a full one, or another server holding the lock.

A server killed mid-write leaves a torn last line (no newline): the next writer ends it with a newline and
chains its next line to the last whole line before it, so ``verify`` tells a torn line from an edited one.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import fcntl
import hashlib
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import events as ev
from ..events import SandboxEvent
from ..policy import SCRUBBED

#: the ``prev`` of the first line ever written
GENESIS = "0" * 64
#: most lines one batch writes (the rest wait for the next round)
_BATCH = 1000
#: how long the writer gathers events after the first of a batch: one write (one flock, one hash pass) per
#: burst instead of one per event, which left the writer competing with the server's loop at every exec
_GATHER_SECONDS = 0.05
#: how far from the end a writer looks for the last whole line (more is read when it is longer)
_TAIL_BYTES = 64 << 10
_PLAIN = frozenset({type(None), bool, int, float, str})
_KEYS = ("seq", "time", "deployment", "server", "kind", "owner", "consumer", "session", "actor", "provider")


def line_hash(line: bytes) -> str:
    """The chain's hash of one line (its bytes without the newline)."""
    return hashlib.sha256(line).hexdigest()


def log_files(path: str) -> list[str]:
    """The files of the log at ``path`` that exist, oldest first: PATH.N ... PATH.1, PATH."""
    folder = os.path.dirname(path) or "."
    base = os.path.basename(path)
    numbered: list[tuple[int, str]] = []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith(base + ".") and name[len(base) + 1 :].isdigit():
                numbered.append((int(name[len(base) + 1 :]), os.path.join(folder, name)))
    files = [name for _, name in sorted(numbered, reverse=True)]
    if os.path.exists(path):
        files.append(path)
    return files


def format_time(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iter_records(path: str) -> Iterator[dict[str, Any]]:
    """Every whole, parseable line of the log (its rotated files first), oldest first; torn or foreign lines
    are skipped (``verify`` reports them)."""
    for name in log_files(path):
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError:
            continue
        for raw in data.split(b"\n"):
            record = parse_line(raw)
            if record is not None:
                yield record


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """An audit line's record, or None for an empty, torn or foreign line (no object with an int ``seq``)."""
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("seq"), int) else None


@dataclass
class _Tail:
    """What the writer knows of the file on disk: where the chain stands, and the file it read that from."""

    seq: int = 0
    hash: str = GENESIS
    inode: int = -1
    size: int = -1


class AuditLog:
    """The hash-chained audit log at ``path``: :meth:`listener` is the events' listener (output-free),
    :meth:`egress` takes the egress gateways' lines; a thread writes them.

    ``scrub_values``: every secret value to replace (the policy's ``injected_values``), asked once per batch.
    ``deployment`` and ``server``: the names every line carries (a callable is asked at each batch until it
    answers, for a provider made after the log).
    """

    def __init__(
        self,
        path: str,
        *,
        deployment: str | Callable[[], str | None] = "",
        server: str = "",
        max_bytes: int = 64 << 20,
        backups: int = 10,
        fsync: bool = False,
        scrub_values: Callable[[], list[str]] | None = None,
        log: logging.Logger | Any = None,
    ) -> None:
        self.path = os.path.abspath(path)
        self.server = server
        self.max_bytes = max_bytes
        self.backups = backups
        self.fsync = fsync
        self.log = log or logging.getLogger(__name__)
        self._deployment = deployment
        self._scrub_values = scrub_values
        self._values: list[str] = []
        self._escaped: list[str] = []  # the values as a line spells them (JSON, ASCII)
        self._tail = _Tail()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failed = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tai-sandbox-audit", daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        # a process that exits without the server's stop (a daemon thread would lose the queue)
        self._atexit = lambda: (lambda me: me.close() if me is not None else None)(ref())
        atexit.register(self._atexit)

    # ------------------------------------------------------------ on the loop

    def listener(self, event: SandboxEvent) -> None:
        """The events' listener: queued, never written here."""
        if event.kind != ev.EXEC_OUTPUT and not self._closed:
            self._queue.put(event)

    def egress(self, record: Mapping[str, Any]) -> None:
        """An egress gateway's line (EgressAudit's listener), as an ``egress`` event; any thread."""
        if self._closed:
            return
        record = dict(record)
        owner, session = record.get("owner"), record.get("session")
        self._queue.put(
            SandboxEvent(
                ev.EGRESS,
                session=session if isinstance(session, str) else None,
                owner=owner if isinstance(owner, str) else None,
                data={"record": record},
            )
        )

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is on disk (at most ``timeout`` s); whether it is."""
        if self._closed or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued and stop the thread."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            # a flush or the stop is answered at once; events are gathered for a moment
            deadline = time.monotonic() + (_GATHER_SECONDS if isinstance(item, SandboxEvent) else 0.0)
            while len(batch) < _BATCH and isinstance(batch[-1], SandboxEvent):
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            events = [each for each in batch if isinstance(each, SandboxEvent)]
            if events:
                try:
                    self._refresh_values()
                    self._write([self._record(each) for each in events])
                except Exception:  # never let the thread die: the next batch tries again
                    self.log.exception(
                        "audit log: %d line(s) could not be written to %s", len(events), self.path
                    )
            for each in batch:
                if isinstance(each, threading.Event):
                    each.set()
            if any(each is None for each in batch):
                return

    def _refresh_values(self) -> None:
        """The secret values to replace, read again for each batch (a rotated secret file, a new user's)."""
        if self._scrub_values is not None:
            for _ in range(3):  # read from this thread while the loop may change what it reads
                try:
                    self._values = [v for v in self._scrub_values() if v]
                    self._escaped = [json.dumps(v, ensure_ascii=True)[1:-1] for v in self._values]
                    break
                except RuntimeError:
                    continue

    def _names(self) -> str:
        deployment = self._deployment
        if callable(deployment):
            try:
                found = deployment()
            except Exception:
                found = None
            if found:
                self._deployment = found
            return found or ""
        return deployment

    def _record(self, event: SandboxEvent) -> dict[str, Any]:
        record = {
            "time": format_time(event.time),
            "deployment": self._names(),
            "server": self.server,
            "kind": event.kind,
            "owner": event.owner,
            "consumer": event.consumer,
            "session": event.session,
            "actor": event.actor,
            "provider": event.provider,
            "data": _jsonable(event.data),
        }
        return record

    def _write(self, records: list[dict[str, Any]]) -> None:
        lock = -1
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            lock = os.open(self.path + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            fd = self._open()
            try:
                size = os.fstat(fd).st_size
                buffer = bytearray()
                for record in records:
                    line = self._line(record)
                    if (
                        self.max_bytes
                        and size + len(buffer) > 0
                        and size + len(buffer) + len(line) + 1 > self.max_bytes
                    ):
                        _write_all(fd, buffer)
                        buffer.clear()
                        self._sync(fd)
                        os.close(fd)
                        fd = -1
                        self._rotate()
                        fd = self._open(fresh=True)
                        size = 0
                    buffer += line + b"\n"
                    self._tail.seq += 1
                    self._tail.hash = line_hash(line)
                _write_all(fd, buffer)
                self._sync(fd)
                st = os.fstat(fd)
                self._tail.inode, self._tail.size = st.st_ino, st.st_size
            finally:
                if fd >= 0:
                    os.close(fd)
            self._failed = False
        except OSError as e:
            if not self._failed:
                self.log.warning("audit log: cannot append to %s: %s (lines lost until it can)", self.path, e)
            self._failed = True
        finally:
            if lock >= 0:
                os.close(lock)

    def _line(self, record: dict[str, Any]) -> bytes:
        whole = {"seq": self._tail.seq + 1, **record, "prev": self._tail.hash}
        text = json.dumps(whole, separators=(",", ":"), ensure_ascii=True, default=str)
        if any(escaped in text for escaped in self._escaped):
            # a secret value is there (as the line spells it): replaced in every string, keys too
            whole = _replaced(whole, self._values)
            text = json.dumps(whole, separators=(",", ":"), ensure_ascii=True, default=str)
        return text.encode("ascii")

    def _sync(self, fd: int) -> None:
        if self.fsync:
            os.fsync(fd)

    def _open(self, fresh: bool = False) -> int:
        """The file, opened to append, with the chain read from disk when the file is not as last left (another
        server wrote, a rotation, a restart); a torn last line is ended with a newline first."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if fresh:
            return fd
        st = os.fstat(fd)
        if (st.st_ino, st.st_size) == (self._tail.inode, self._tail.size):
            return fd
        seq, digest, torn = last_line(self.path)
        if seq is None:  # an empty file: the chain goes on from the newest rotated one, if any
            rotated = log_files(self.path)
            rotated = [name for name in rotated if name != self.path]
            seq, digest, _ = last_line(rotated[-1]) if rotated else (None, None, False)
        if torn:
            _write_all(fd, b"\n")
        self._tail.seq, self._tail.hash = (seq, digest) if seq is not None and digest else (0, GENESIS)
        return fd

    def _rotate(self) -> None:
        """PATH -> PATH.1 -> PATH.2 ..., the oldest past ``backups`` deleted (under the lock)."""
        if self.backups <= 0:
            with contextlib.suppress(OSError):
                os.remove(self.path)
            return
        with contextlib.suppress(OSError):
            os.remove(f"{self.path}.{self.backups}")
        for index in range(self.backups - 1, 0, -1):
            with contextlib.suppress(OSError):
                os.replace(f"{self.path}.{index}", f"{self.path}.{index + 1}")
        os.replace(self.path, f"{self.path}.1")


def last_line(path: str) -> tuple[int | None, str | None, bool]:
    """The seq and hash of the last whole audit line of ``path`` (None, None: none), and whether the file
    ends in a torn line (no newline)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            span = _TAIL_BYTES
            while True:
                start = max(0, size - span)
                f.seek(start)
                data = f.read(size - start)
                torn = bool(data) and not data.endswith(b"\n")
                lines = data.split(b"\n")
                if start > 0:
                    lines = lines[1:]  # the first may be cut
                if torn:
                    lines = lines[:-1]
                for raw in reversed(lines):
                    record = parse_line(raw)
                    if record is not None:
                        return record["seq"], line_hash(raw), torn
                if start == 0:
                    return None, None, torn
                span *= 4
    except OSError:
        return None, None, False


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON: a spec as its public form (env names, never values; secrets by name), bytes
    dropped (their size kept), anything else unknown as its string."""
    if type(value) in _PLAIN:
        return value
    if type(value) is list and all(type(v) is str for v in value):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": len(value)}
    public = getattr(value, "to_public_json", None)
    if callable(public):
        data = public()
        egress = data.get("egress") if isinstance(data, dict) else None
        if isinstance(egress, dict) and isinstance(egress.get("secrets"), list):
            # a grant's placeholder stands for the value in the session: its name and hosts say enough
            egress["secrets"] = [
                {k: g.get(k) for k in ("name", "env", "hosts")}
                for g in egress["secrets"]
                if isinstance(g, dict)
            ]
        return _jsonable(data)
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return _jsonable(to_json())
    return str(value)


def _replaced(value: Any, secrets: list[str]) -> Any:
    """``value`` with every secret value replaced by [scrubbed] in every string (keys too)."""
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, SCRUBBED)
        return value
    if isinstance(value, dict):
        return {_replaced(k, secrets): _replaced(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, secrets) for v in value]
    return value


def record_keys() -> tuple[str, ...]:
    """The keys of a line, in order (``data`` and ``prev`` last)."""
    return (*_KEYS, "data", "prev")
