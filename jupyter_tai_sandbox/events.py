"""What happens to sessions, told once: the events every observer of a server reads (issue 55).

The policy gate (:mod:`~jupyter_tai_sandbox.gate`) emits a :class:`SandboxEvent` for what passes through it
(a create, a destroy, an exec's start and end, a file moved in or out...), and the doors emit the few that only
they see (a terminal opened, a refusal, an admin's action). Listeners subscribe to the gate's
:class:`SandboxEvents`: the audit log, the Prometheus metrics and the transcripts each take what they need.

A listener is called on the event loop, synchronously, in the order of subscription: it must be cheap and
never block (hand slow work, a file's ``fsync`` say, to a thread). One that raises is logged and the others
still run; an emitter never fails because of a listener. With no listener subscribed an emit costs one
attribute read.

Output bytes reach only listeners subscribed with ``output=True`` (the transcripts): an interactive command's
chunks are ``exec.output`` events then, and a one-shot's ``exec.end`` carries its output. The bytes are the
transcript's, scrubbed as the caller got them.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# The kinds (``SandboxEvent.kind``). ``data`` holds, besides what every event has:
#: a session made: ``spec`` (the SessionSpec as the provider got it), ``seconds`` (how long the create took)
SESSION_CREATE = "session.create"
#: a create that failed: ``error`` (the error's class name), ``message``, ``seconds``
SESSION_CREATE_FAILED = "session.create_failed"
#: a session destroyed on request: ``remove_workspace``
SESSION_DESTROY = "session.destroy"
#: a session the reaper removed (its TTL passed)
SESSION_REAP = "session.reap"
#: a session forked: ``source`` (the source session's id); ``session`` is the copy's
SESSION_FORK = "session.fork"
SESSION_PAUSE = "session.pause"
SESSION_RESUME = "session.resume"
#: an exec started: ``exec`` (a number, unique in this server), ``argv``, ``one_shot``, ``timeout_seconds``,
#: ``cwd``, ``pty``, ``label``
EXEC_START = "exec.start"
#: an interactive exec's output chunk (to ``output=True`` listeners only): ``exec``, ``stream``, ``bytes``
EXEC_OUTPUT = "exec.output"
#: an exec ended: ``exec``, ``one_shot``, ``exit_code`` (None when it did not end with one), ``reason``, ``stdout_bytes``,
#: ``stderr_bytes`` (what the command wrote), ``seconds``, ``error`` (its class name, when it raised);
#: a one-shot's also ``stdout`` and ``stderr`` (scrubbed bytes) to ``output=True`` listeners
EXEC_END = "exec.end"
#: a file written into the session: ``path``, ``size`` (None when streamed and unknown)
FILE_PUT = "file.put"
#: a file read out of the session: ``path``, ``size``
FILE_GET = "file.get"
#: a file or folder removed, moved or made: ``op`` (``remove``, ``move``, ``mkdir``), ``path``, ``to``
FILE_CHANGE = "file.change"
#: a terminal (the websocket door) opened or closed: ``exec``
TERMINAL_OPEN = "terminal.open"
TERMINAL_CLOSE = "terminal.close"
#: a request the policy (or the contract) refused: ``door``, ``error`` (the class name), ``message``, ``status``
REFUSAL = "refusal"
#: an egress gateway's decision (its audit line as ``record``)
EGRESS = "egress"
#: an admin acting on another user's session or the deployment: ``action``
ADMIN = "admin"
#: a session's egress policy changed live: ``allow``, ``deny``
EGRESS_CHANGE = "egress.change"

_numbers = itertools.count(1)


def next_exec_number() -> int:
    """A number for an exec, unique in this process (correlates its start, output and end)."""
    return next(_numbers)


@dataclass(frozen=True, slots=True)
class SandboxEvent:
    """One thing that happened. ``session``, ``owner`` and ``consumer`` name the session (None where there
    is none: a refused create before a spec had an owner, an egress line of a gone session); ``actor`` who
    asked when a door knows it and it is not the owner; ``provider`` the provider's kind."""

    kind: str
    session: str | None = None
    owner: str | None = None
    consumer: str | None = None
    provider: str | None = None
    actor: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


Listener = Callable[[SandboxEvent], None]


class SandboxEvents:
    """The listeners of one gate, and the emit they all hear."""

    def __init__(self) -> None:
        self._listeners: list[tuple[Listener, bool]] = []
        #: whether any listener is subscribed (emitters skip building an event when not)
        self.active = False
        #: whether any listener takes output bytes (``subscribe(..., output=True)``)
        self.wants_output = False

    def subscribe(self, listener: Listener, *, output: bool = False) -> None:
        """Call ``listener`` with every event from now on; ``output``: with output bytes too."""
        self._listeners.append((listener, output))
        self._changed()

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners = [(each, output) for each, output in self._listeners if each is not listener]
        self._changed()

    def _changed(self) -> None:
        self.active = bool(self._listeners)
        self.wants_output = any(output for _, output in self._listeners)

    def emit(self, event: SandboxEvent) -> None:
        """Hand ``event`` to every listener (output events and output bytes to ``output=True`` ones only)."""
        output_only = event.kind == EXEC_OUTPUT
        for listener, output in self._listeners:
            if output_only and not output:
                continue
            told = event
            if not output and ("stdout" in event.data or "stderr" in event.data):
                told = _without_output(event)
            try:
                listener(told)
            except Exception:
                log.exception("sandbox events: listener %r failed on %s", listener, event.kind)


def _without_output(event: SandboxEvent) -> SandboxEvent:
    data = {k: v for k, v in event.data.items() if k not in ("stdout", "stderr")}
    return SandboxEvent(
        event.kind, event.session, event.owner, event.consumer, event.provider, event.actor, data, event.time
    )
