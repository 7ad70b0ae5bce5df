"""A session's commands and their output, kept by the server and given back as a notebook (issue 55).

:class:`TranscriptSettings` is a listener of the gate's events (:mod:`~jupyter_tai_sandbox.events`, subscribed
with ``output=True``): per session it keeps each command that went through the gate (its argv, cwd, whether
one-shot, interactive or a terminal's pty, when it started and ended, its exit code and reason) and its stdout
and stderr as they came, interleaved by stream. :meth:`TranscriptSettings.to_notebook` turns that into an
nbformat v4 notebook (a dict): a markdown header naming the session, then one code cell per command whose
outputs are ``stream`` outputs and a plain-text exit note.

What is kept, and for how long:

* in the server's memory only, for the sessions whose commands went through this server: a restart forgets
  everything, and a session another server of the deployment ran commands in has only this server's part;
* at most ``max_bytes_per_session`` bytes per session (output, plus a little per command): past it the oldest
  output goes first (then the oldest ended commands), and the notebook says what was dropped;
* at most ``max_sessions`` sessions: past it the session that ended first goes (else the least recently used);
* ``keep_after_end_seconds`` after the session was destroyed or reaped, so a transcript can still be saved
  right after a destroy; then it is forgotten.

Output is recorded as the caller got it: the gate has scrubbed it already (``SandboxPolicy.scrub_transcript``);
the notebook is scrubbed once more with the policy when it is built (the output, the command lines, the spec),
never signed, so Jupyter opens it untrusted. Standard input (what was typed into a terminal, what was fed to a
command) is not recorded.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from traitlets import Bool, Float, Integer
from traitlets.config import LoggingConfigurable

from . import events as ev
from .contract import SandboxError, SandboxNotFoundError, SessionInfo, SessionSpec
from .events import SandboxEvent
from .policy import SandboxPolicy

__all__ = ["TranscriptSettings", "build_notebook", "command_source", "notebook_filename", "session_notebook"]

#: bytes a command counts against its session's limit besides its output (its record, argv apart)
_COMMAND_OVERHEAD = 256
#: the shells whose ``SHELL -c SCRIPT`` a cell shows as SCRIPT
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh", "/bin/sh", "/bin/bash", "/usr/bin/bash"})
#: the notebook metadata key of this package
METADATA_KEY = "jupyter_tai_sandbox"
#: the version of the notebook's ``metadata.jupyter_tai_sandbox`` layout
FORMAT_VERSION = 1


@dataclasses.dataclass(eq=False)
class CommandRecord:
    """One command as the gate saw it."""

    number: int
    argv: list[str]
    cwd: str | None
    one_shot: bool
    pty: bool
    label: str | None
    started: float
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    error: str | None = None
    stdout_bytes: int | None = None
    stderr_bytes: int | None = None
    #: the output kept, in the order it came: [stream, bytes] runs (one run per change of stream)
    output: list[list[Any]] = dataclasses.field(default_factory=list)
    #: output bytes of this command dropped by the session's limit
    dropped_bytes: int = 0

    @property
    def running(self) -> bool:
        return self.ended is None

    def cost(self) -> int:
        return _COMMAND_OVERHEAD + sum(len(word) for word in self.argv)


@dataclasses.dataclass(eq=False)
class SessionRecord:
    """What this server keeps of one session."""

    session: str
    owner: str | None
    consumer: str | None
    provider: str | None
    spec: SessionSpec | None = None
    created: float | None = None
    forked_from: str | None = None
    #: the end: time, and how (``destroyed``, ``reaped``)
    ended: float | None = None
    ended_how: str | None = None
    commands: collections.deque[CommandRecord] = dataclasses.field(default_factory=collections.deque)
    by_number: dict[int, CommandRecord] = dataclasses.field(default_factory=dict)
    #: output bytes and command overhead kept
    size: int = 0
    dropped_bytes: int = 0
    dropped_commands: int = 0
    terminals: int = 0


class TranscriptSettings(LoggingConfigurable):
    """Sessions' transcripts (their commands and output) kept in the server's memory, and the notebooks
    ``GET /api/sandbox/sessions/{id}/transcript.ipynb`` gives of them."""

    enabled = Bool(
        True,
        help="""Keep each session's commands and their output (scrubbed) in the server's memory, for
        GET /api/sandbox/sessions/{id}/transcript.ipynb, %sandbox transcript, the MCP tool session_transcript and
        the panel's Save transcript. Off: nothing is kept (the gate then hands no output chunk to any listener)
        and a transcript has its header only.""",
    ).tag(config=True)

    max_bytes_per_session = Integer(
        1 << 20,
        help="""Most bytes of one session's transcript kept (its commands' output, and about 256 bytes per
        command): past it the oldest output is dropped first, then the oldest ended commands, and the notebook
        says how much. 0 means no limit (the memory a session's output takes is then unbounded).""",
    ).tag(config=True)

    max_sessions = Integer(
        100,
        help="""Most sessions whose transcript is kept at once (so the memory the transcripts take is at most
        about max_sessions x max_bytes_per_session). One more forgets the session that ended first, else the one
        used least recently. 0 means no limit.""",
    ).tag(config=True)

    keep_after_end_seconds = Float(
        600.0,
        help="""Seconds a session's transcript is kept after it was destroyed or reaped (so it can still be
        saved right after a destroy); then it is forgotten. 0 forgets it at once.""",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records: collections.OrderedDict[str, SessionRecord] = collections.OrderedDict()
        #: sessions in the order they ended (for the forgetting after keep_after_end_seconds)
        self._ended: collections.OrderedDict[str, float] = collections.OrderedDict()

    # ------------------------------------------------------------ the listener

    def __call__(self, event: SandboxEvent) -> None:
        """The gate's listener (subscribe with ``output=True``): cheap, never blocking."""
        session = event.session
        if session is None:
            return
        kind = event.kind
        if kind == ev.EXEC_OUTPUT:
            self._output(session, event.data)
            return
        now = time.monotonic()
        if self._ended:
            self._forget_ended(now)
        if kind == ev.EXEC_START:
            self._start(event)
        elif kind == ev.EXEC_END:
            self._end(event)
        elif kind in (ev.SESSION_CREATE, ev.SESSION_FORK):
            self._made(event)
        elif kind in (ev.SESSION_DESTROY, ev.SESSION_REAP):
            self._gone(session, event, now)
        elif kind == ev.TERMINAL_OPEN:
            known = self._records.get(session)
            if known is not None:
                known.terminals += 1

    def _made(self, event: SandboxEvent) -> None:
        record = self._record(event)
        spec = event.data.get("spec")
        if isinstance(spec, SessionSpec):
            record.spec = spec
        record.created = event.time
        if event.kind == ev.SESSION_FORK:
            record.forked_from = event.data.get("source")

    def _gone(self, session: str, event: SandboxEvent, now: float) -> None:
        record = self._records.get(session)
        if record is None or record.ended is not None:
            return
        record.ended = event.time
        record.ended_how = "destroyed" if event.kind == ev.SESSION_DESTROY else "reaped (its TTL passed)"
        self._ended[session] = now
        if not self.keep_after_end_seconds:
            self._forget_ended(now)

    def _record(self, event: SandboxEvent) -> SessionRecord:
        session = event.session
        assert session is not None
        record = self._records.get(session)
        if record is not None:
            self._records.move_to_end(session)
            record.owner = record.owner or event.owner
            record.consumer = record.consumer or event.consumer
            record.provider = record.provider or event.provider
            return record
        limit = self.max_sessions
        while limit and len(self._records) >= limit:
            victim = next(iter(self._ended), None) or next(iter(self._records))
            self._forget(victim)
        record = SessionRecord(session, event.owner, event.consumer, event.provider)
        self._records[session] = record
        return record

    def _forget(self, session: str) -> None:
        self._records.pop(session, None)
        self._ended.pop(session, None)

    def _forget_ended(self, now: float) -> None:
        keep = self.keep_after_end_seconds
        while self._ended:
            session, ended = next(iter(self._ended.items()))
            if keep and now - ended < keep:
                return
            self._forget(session)

    def _start(self, event: SandboxEvent) -> None:
        data = event.data
        record = self._record(event)
        command = CommandRecord(
            number=int(data.get("exec") or 0),
            argv=[str(word) for word in data.get("argv") or ()],
            cwd=data.get("cwd"),
            one_shot=bool(data.get("one_shot")),
            pty=bool(data.get("pty")),
            label=data.get("label"),
            started=event.time,
        )
        record.commands.append(command)
        record.by_number[command.number] = command
        record.size += command.cost()
        self._bound(record)

    def _output(self, session: str, data: Mapping[str, Any]) -> None:
        record = self._records.get(session)
        if record is None:
            return
        command = record.by_number.get(data.get("exec") or 0)
        chunk = data.get("bytes")
        if command is None or not chunk:
            return
        _append(command, data.get("stream") or "stdout", chunk)
        record.size += len(chunk)
        self._bound(record)

    def _end(self, event: SandboxEvent) -> None:
        record = self._records.get(event.session or "")
        if record is None:
            return
        data = event.data
        command = record.by_number.get(data.get("exec") or 0)
        if command is None:
            return
        command.ended = event.time
        command.exit_code = data.get("exit_code")
        command.reason = data.get("reason")
        command.error = data.get("error")
        command.stdout_bytes = data.get("stdout_bytes")
        command.stderr_bytes = data.get("stderr_bytes")
        added = 0
        for stream in ("stdout", "stderr"):  # a one-shot's output comes whole with its end
            chunk = data.get(stream)
            if chunk:
                _append(command, stream, chunk)
                added += len(chunk)
        if added:
            record.size += added
            self._bound(record)

    def _bound(self, record: SessionRecord) -> None:
        """Past the limit, drop the oldest output (down to 7/8 of the limit, so dropping is not redone for each
        small chunk), then the oldest ended commands."""
        limit = self.max_bytes_per_session
        if not limit or record.size <= limit:
            return
        excess = record.size - (limit - limit // 8)
        for command in record.commands:
            while command.output and excess > 0:
                run = command.output[0]
                data = run[1]
                if len(data) <= excess:
                    command.output.pop(0)
                    cut = len(data)
                else:
                    cut = excess
                    del data[:cut]
                command.dropped_bytes += cut
                record.dropped_bytes += cut
                record.size -= cut
                excess -= cut
            if excess <= 0:
                return
        while excess > 0 and record.commands and not record.commands[0].running:
            command = record.commands.popleft()
            record.by_number.pop(command.number, None)
            record.size -= command.cost()
            record.dropped_commands += 1
            excess -= command.cost()

    # ------------------------------------------------------------- reading

    def record(self, session_id: str) -> SessionRecord | None:
        """What is kept of the session (None: nothing, or forgotten)."""
        if self._ended:
            self._forget_ended(time.monotonic())
        return self._records.get(session_id)

    def readable_by(self, session_id: str, name: str, *, sees_all: bool = False) -> bool:
        """Whether a gone session's kept transcript may be read by the user ``name`` (its owner; an admin with
        ``sees_all``). A live session's reader is decided by the session routes' rule instead."""
        record = self.record(session_id)
        return record is not None and (sees_all or (record.owner is not None and record.owner == name))

    def to_notebook(
        self,
        session_id: str,
        *,
        info: SessionInfo | None = None,
        policy: SandboxPolicy | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The session's transcript as an nbformat v4 notebook (a dict, valid for ``nbformat.validate``, not
        signed). ``info``: the live session's info (its spec and times, when the record has none); ``policy``:
        scrubs every text of the notebook once more."""
        record = self.record(session_id)
        if record is None:
            record = SessionRecord(session_id, None, None, None)
        return build_notebook(
            record,
            info=info,
            policy=policy,
            now=time.time() if now is None else now,
            enabled=self.enabled,
            max_bytes=self.max_bytes_per_session,
        )


def _append(command: CommandRecord, stream: str, chunk: bytes) -> None:
    if command.output and command.output[-1][0] == stream:
        command.output[-1][1] += chunk
    else:
        command.output.append([stream, _Run(chunk)])


#: a chunk at least this large is kept as it came (not copied); smaller ones are gathered
_KEPT_WHOLE = 4096
#: the most small chunks gathered in one buffer
_GATHERED = 64 << 10


class _Run:
    """One stream's run of a command's output, bytes-like for its readers (``len``, ``bytes()``, ``+=`` and
    ``del run[:n]``): the chunks as they came, a large one kept as it is and small ones gathered, so a long
    stream kept to the session's limit is not copied again at each chunk (a bytearray was: 256 MiB streamed
    took 0.09 s of the server's CPU per GiB)."""

    __slots__ = ("_chunks", "_size")

    def __init__(self, chunk: bytes) -> None:
        self._chunks: collections.deque[bytes | bytearray | memoryview] = collections.deque()
        self._size = 0
        self += chunk

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return b"".join(self._chunks)

    def __iadd__(self, chunk: bytes) -> _Run:
        chunks = self._chunks
        last = chunks[-1] if chunks else None
        if len(chunk) >= _KEPT_WHOLE and type(chunk) is bytes:
            chunks.append(chunk)
        elif isinstance(last, bytearray) and len(last) < _GATHERED:
            last += chunk
        else:
            chunks.append(bytearray(chunk))
        self._size += len(chunk)
        return self

    def __delitem__(self, cut: slice) -> None:
        """``del run[:n]``: drop the first n bytes."""
        assert cut.start is None and cut.step is None and cut.stop is not None
        drop = min(cut.stop, self._size)
        self._size -= drop
        chunks = self._chunks
        while drop:
            first = chunks[0]
            if len(first) <= drop:
                chunks.popleft()
                drop -= len(first)
            else:  # a view, not a copy: the chunk's head stays in memory until the rest goes
                chunks[0] = memoryview(first)[drop:] if type(first) is bytes else first[drop:]
                drop = 0


# ----------------------------------------------------------------- the notebook


def command_source(argv: Iterable[str]) -> str:
    """A command as its cell shows it: the script of ``sh -c SCRIPT`` (any usual shell, ``-c`` or ``-lc``),
    else the shell-quoted argv."""
    words = list(argv)
    if len(words) == 3 and words[0] in _SHELLS and words[1] in ("-c", "-lc", "-ec"):
        return words[2]
    return shlex.join(words)


def notebook_filename(session_id: str) -> str:
    """The file name a saved transcript gets: ``<session id>-transcript.ipynb`` (only the id's safe
    characters)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in session_id)[:128] or "session"
    return f"{safe}-transcript.ipynb"


def _utc(epoch: float | None) -> str:
    if epoch is None:
        return "unknown"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _code(text: str) -> str:
    """``text`` as a markdown code span, whatever backticks it holds."""
    text = text.replace("\n", " ")
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell_id() -> str:
    return uuid.uuid4().hex[:16]


def _stream(name: str, text: str) -> dict[str, Any]:
    return {"output_type": "stream", "name": name, "text": text}


def _note(text: str) -> dict[str, Any]:
    """A plain-text output (shown as text, neither red like stderr nor mixed into stdout)."""
    return {"output_type": "display_data", "data": {"text/plain": text}, "metadata": {}}


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


class _Scrub:
    """The policy's transcript scrub over texts and bytes (``also``: the session's own placeholders)."""

    def __init__(self, policy: SandboxPolicy | None, spec: SessionSpec | None) -> None:
        self.policy = policy
        egress = spec.egress if spec is not None else None
        self.also = tuple(grant.placeholder for grant in egress.secrets) if egress is not None else ()
        self.on = policy is not None and policy.stream_scrubber(self.also) is not None

    def data(self, data: bytes) -> bytes:
        if not self.on:
            return data
        assert self.policy is not None
        return self.policy.scrub_bytes(data, self.also)

    def text(self, text: str) -> str:
        if not self.on:
            return text
        return self.data(text.encode("utf-8", "surrogatepass")).decode("utf-8", "replace")

    def json(self, value: Any) -> Any:
        if not self.on:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.json(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json(v) for v in value]
        return value


def _exit_note(command: CommandRecord) -> str:
    if command.running:
        return "[still running when this transcript was saved]"
    parts = []
    if command.error is not None:
        parts.append(f"failed: {command.error}")
    elif command.exit_code is not None:
        parts.append(f"exit {command.exit_code}")
    else:
        parts.append("ended without an exit code")
    if command.reason:
        parts.append(command.reason)
    if command.ended is not None:
        parts.append(f"{command.ended - command.started:.2f} s")
    return "[" + ", ".join(parts) + "]"


def _command_cell(command: CommandRecord, scrub: _Scrub, max_bytes: int) -> dict[str, Any]:
    source = scrub.text(command_source(command.argv))
    if command.pty:
        source = "# a terminal (pty): what was typed is not recorded, what it showed is below\n" + source
    outputs: list[dict[str, Any]] = []
    if command.dropped_bytes:
        outputs.append(
            _note(
                f"[... the first {_size(command.dropped_bytes)} of this command's output were dropped: a "
                f"session's transcript keeps at most {_size(max_bytes)} (TranscriptSettings.max_bytes_per_session) ...]"
            )
        )
    for stream, data in command.output:
        text = scrub.data(bytes(data)).decode("utf-8", "replace")
        outputs.append(_stream("stderr" if stream == "stderr" else "stdout", text))
    outputs.append(_note(_exit_note(command)))
    meta: dict[str, Any] = {
        "exec": command.number,
        "argv": scrub.json(command.argv),
        "cwd": scrub.json(command.cwd),
        "mode": "terminal" if command.pty else ("one-shot" if command.one_shot else "interactive"),
        "started": command.started,
        "ended": command.ended,
        "exit_code": command.exit_code,
        "reason": scrub.json(command.reason),
        "error": command.error,
        "stdout_bytes": command.stdout_bytes,
        "stderr_bytes": command.stderr_bytes,
        "dropped_bytes": command.dropped_bytes,
    }
    if command.label:
        meta["label"] = scrub.json(command.label)
    return {
        "cell_type": "code",
        "id": _cell_id(),
        "execution_count": None,
        "metadata": {METADATA_KEY: meta},
        "source": source,
        "outputs": outputs,
    }


def build_notebook(
    record: SessionRecord,
    *,
    info: SessionInfo | None = None,
    policy: SandboxPolicy | None = None,
    now: float,
    enabled: bool = True,
    max_bytes: int = 0,
) -> dict[str, Any]:
    """The notebook of ``record`` (see :meth:`TranscriptSettings.to_notebook`)."""
    spec = record.spec or (info.spec if info is not None else None)
    scrub = _Scrub(policy, spec)
    owner = record.owner or (spec.owner if spec is not None else None)
    consumer = record.consumer or (spec.consumer if spec is not None else None)
    provider = record.provider or (info.kind if info is not None else None)
    created = record.created or (info.created_at if info is not None else None)
    image = spec.image if spec is not None else None

    lines = [f"# Sandbox session {_code(record.session)}", ""]
    facts = [
        f"owner {_code(owner or 'unknown')}",
        f"consumer {_code(consumer or 'unknown')}",
        f"provider {_code(provider or 'unknown')}",
        f"image {_code(image or 'the provider default')}",
    ]
    lines += ["- " + ", ".join(facts), f"- created {_utc(created)}"]
    if record.forked_from:
        lines.append(f"- forked from {_code(record.forked_from)}")
    if record.ended is not None:
        lines.append(f"- {record.ended_how or 'ended'} {_utc(record.ended)}")
    if record.terminals:
        lines.append(f"- terminals opened: {record.terminals}")
    count = len(record.commands)
    lines.append(f"- saved {_utc(now)}: {count} command{'' if count == 1 else 's'}")
    lines += [
        "",
        "Each command that ran through this Jupyter server is a cell (its output as it came, stdout and "
        "stderr interleaved; a one-shot's stdout then its stderr), with its exit after it. Commands are not "
        "re-run from here: this is a record, kept in the server's memory and scrubbed like every transcript. "
        "What was typed into a terminal or fed to a command is not recorded.",
    ]
    if not enabled:
        lines += [
            "",
            "**Transcripts are off on this server** (`TranscriptSettings.enabled`): no command was kept.",
        ]
    if record.dropped_bytes or record.dropped_commands:
        dropped = f"{_size(record.dropped_bytes)} of the oldest output"
        if record.dropped_commands:
            dropped += f" and the {record.dropped_commands} oldest command{'' if record.dropped_commands == 1 else 's'}"
        lines += [
            "",
            f"> **Truncated:** {dropped} were dropped: a session's transcript keeps at most {_size(max_bytes)} "
            "(`TranscriptSettings.max_bytes_per_session`). The cells below say where output is missing.",
        ]
    header = {
        "cell_type": "markdown",
        "id": _cell_id(),
        "metadata": {},
        "source": scrub.text("\n".join(lines)),
    }
    cells = [header] + [_command_cell(command, scrub, max_bytes) for command in record.commands]
    meta: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "session": record.session,
        "owner": owner,
        "consumer": consumer,
        "provider": provider,
        "created_at": created,
        "ended_at": record.ended,
        "ended": record.ended_how,
        "forked_from": record.forked_from,
        "saved_at": now,
        "spec": spec.to_public_json() if spec is not None else None,
        "commands": count,
        "truncated": bool(record.dropped_bytes or record.dropped_commands),
        "dropped_bytes": record.dropped_bytes,
        "dropped_commands": record.dropped_commands,
        "max_bytes_per_session": max_bytes,
    }
    return {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "language_info": {"name": "bash"},
            METADATA_KEY: scrub.json(meta),
        },
        "cells": cells,
    }


async def session_notebook(
    app: Any, caller: Any, session_id: str, lookup: Callable[[], Awaitable[Any]]
) -> dict[str, Any]:
    """The notebook of the caller's session ``session_id``, by the session routes' owner rule.

    ``lookup`` finds the live session for the caller (another user's, or an unknown id, raises
    SandboxNotFoundError: 404). A session gone from the provider (destroyed, reaped) whose transcript is
    still kept is read by its owner (and an admin who sees all); to anyone else it stays the lookup's 404.
    """
    transcripts: TranscriptSettings | None = getattr(app, "transcripts", None)
    try:
        session = await lookup()
    except SandboxNotFoundError:
        if transcripts is None or not transcripts.readable_by(
            session_id, caller.name, sees_all=caller.sees_all
        ):
            raise
        session = None
    info: SessionInfo | None = None
    if session is not None:
        session_id = session.id
        info = session.known_info()
        if info is None:
            with contextlib.suppress(SandboxError):
                info = await session.info()
    policy = getattr(app, "policy", None)
    if transcripts is None:
        record = SessionRecord(session_id, None, None, None)
        return build_notebook(record, info=info, policy=policy, now=time.time(), enabled=False)
    return transcripts.to_notebook(session_id, info=info, policy=policy)
