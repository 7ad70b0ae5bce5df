"""The policy gate: a provider, and its sessions, as every door gets them.

:func:`~jupyter_tai_sandbox.sandboxes.require_sandbox` hands out :class:`GatedSandbox`. Its
``create`` applies the operator's :class:`~jupyter_tai_sandbox.policy.SandboxPolicy` to the spec;
its ``create`` and ``get`` return a :class:`GatedSession`, whose ``run`` and ``start`` (so
``exec`` and ``exec_start`` too) apply the exec-time policy, once, for every door (REST, the
websocket, MCP, code tools, kernels, the magics through REST):

* **the timeout ceiling** (``SandboxPolicy.max_timeout_seconds``): a request over it is refused with
  :class:`~jupyter_tai_sandbox.contract.SandboxRequestError` naming ``timeout_seconds``, never clamped;
* **the output limit** of a one-shot run (``SandboxApp.max_output_bytes``, given to the gate at
  registration): past it the command is stopped and the run raises ``OutputTooLargeError`` with the
  byte counts;
* **the transcript scrub** (``SandboxPolicy.scrub_transcript``): a one-shot's output is scrubbed
  whole (its result keeps the byte counts the command wrote); an interactive command's output goes
  through one :class:`~jupyter_tai_sandbox.policy.StreamScrubber` per stream, so a value split across
  chunks is still replaced; each holds back less than the longest value, released before the exit
  item (or the error).

The gate also holds the egress policy of a running session: :meth:`GatedSession.set_egress` (and
:meth:`GatedSandbox.set_egress`) narrow a live change within the operator's rule
(``SandboxPolicy.effective_egress``) before the provider applies it, and the gate gives its provider the
:class:`~jupyter_tai_sandbox.contract.EgressHooks` its egress gateway needs (a secret's real value, the
audit sink).

A byte transport that is no transcript (the kernel tunnel's relay, whose frames a replacement
would corrupt) starts through :func:`start_transport`: the ceiling holds, the scrub does not.
Everything else on a session (files, info, TTL, destroy) goes to the provider's session as is.

What passes through the gate is told to the gate's :attr:`GatedSandbox.events` (:mod:`~.events`): the
audit log, the metrics and the transcripts listen there.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import Any

from . import events as ev
from .contract import (
    EgressPolicy,
    ExecHandle,
    ExecRequest,
    ExecResult,
    HeldCommand,
    OutputChunk,
    OutputItem,
    OutputStream,
    PortConnection,
    Sandbox,
    SandboxIsolation,
    SandboxRequestError,
    SandboxSession,
    SessionInfo,
    SessionLimits,
    SessionSpec,
)
from .contract.egress import EgressHooks
from .egress_audit import EgressAudit
from .events import SandboxEvent, SandboxEvents
from .policy import UNSET_CONSUMER, Principal, SandboxPolicy, StreamScrubber
from .spool import spilling_at_most

#: The output limit of a gate registered without one: SandboxApp.max_output_bytes's default.
DEFAULT_OUTPUT_LIMIT = 64 << 20
#: Output scrubbed in one piece past this size is scrubbed off the event loop.
_SCRUB_INLINE_BYTES = 1 << 16
_STREAMS: tuple[OutputStream, ...] = ("stdout", "stderr")


class GatedSandbox(Sandbox):
    """A provider behind the policy: ``create`` applies the policy to the spec, and the sessions it
    hands out (``create``, ``get``) apply it to every command; ``list`` and ``reap`` delegate.

    ``output_limit``: most output bytes a one-shot run keeps (0: no limit). ``spill_limit``: most unread
    output bytes a command keeps on the server's disk (0: no limit; None: the spool's default); the
    server's own (SandboxApp.max_spill_bytes) reaches the spools its commands make through this gate.
    """

    def __init__(
        self,
        provider: Sandbox,
        policy: SandboxPolicy,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        spill_limit: int | None = None,
    ) -> None:
        self.provider = provider
        self.policy = policy
        self.output_limit = output_limit
        self.spill_limit = spill_limit
        #: what passes through this gate, told to its listeners (audit, metrics, transcripts)
        self.events = SandboxEvents()
        # what the provider's egress gateway asks of the server: this policy's secrets and audit sink
        if not isinstance(provider, GatedSandbox):
            provider.egress_hooks = PolicyEgressHooks(policy)

    # read from the provider each time: a remote provider learns them from its server
    @property
    def kind(self) -> str:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return self.provider.kind

    @property
    def max_isolation(self) -> SandboxIsolation:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return self.provider.max_isolation

    @property
    def networks(self) -> frozenset[str]:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return self.provider.networks

    @property
    def supports_limits(self) -> bool:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return self.provider.supports_limits

    @property
    def isolation_note(self) -> str | None:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return getattr(self.provider, "isolation_note", None)

    @property
    def pausable(self) -> bool:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return bool(getattr(self.provider, "pausable", False))

    @property
    def forkable(self) -> bool:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return bool(getattr(self.provider, "forkable", False))

    @property
    def egress_policy(self) -> bool:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return bool(getattr(self.provider, "egress_policy", False))

    @property
    def egress_refusal(self) -> str:  # type: ignore[override]  # the provider's, read each time; Sandbox has a plain attribute
        return str(getattr(self.provider, "egress_refusal", ""))

    @property
    def egress_hooks(self) -> EgressHooks | None:  # type: ignore[override]  # the provider's; Sandbox has a plain attribute
        return getattr(self.provider, "egress_hooks", None)

    @property
    def egress_audit(self) -> EgressAudit:
        """The audit sink of this gate's policy (what GET /api/sandbox/egress/audit reads)."""
        return self.policy.egress_audit

    async def set_egress(
        self, session_id: str, *, allow: Iterable[str] | None = None, deny: Iterable[str] = ()
    ) -> SessionInfo:
        """Change a running session's egress policy to ``allow`` (None: the operator's rule's, or any name on
        ports 80 and 443) and ``deny``, within the operator's rule; the session's secrets are kept. Applies
        to its new connections within a second. The session's info, with the policy in force."""
        return await (await self.get(session_id)).change_egress(allow=allow, deny=deny)

    def admit(self, request: ExecRequest, *, one_shot: bool) -> ExecRequest:
        """``request`` as the provider runs it: over the timeout ceiling is refused (never clamped); a
        one-shot gets the output limit (the lower of its own and the gate's)."""
        ceiling = self.policy.max_timeout_seconds
        if ceiling and request.timeout_seconds > ceiling:
            raise SandboxRequestError(
                f"timeout_seconds: {request.timeout_seconds:g} s is over the operator's maximum of {ceiling:g} s "
                "(SandboxPolicy.max_timeout_seconds)",
                field="timeout_seconds",
            )
        limit = self.output_limit
        if one_shot and limit and (request.output_limit is None or request.output_limit > limit):
            request = dataclasses.replace(request, output_limit=limit)
        return request

    def effective_spec(self, spec: SessionSpec, caller: Principal | None = None) -> SessionSpec:
        """``spec`` as the provider must honour it, for ``caller`` (see SandboxPolicy.effective_spec)."""
        return self.policy.effective_spec(spec, self.provider.session_limits(), caller)

    async def prepare(self, spec: SessionSpec, caller: Principal | None = None) -> None:
        """What deciding ``spec`` for ``caller`` needs read first, awaited before :meth:`effective_spec`: the
        owner's values of the secrets from JupyterHub's auth_state granted to its consumer
        (SandboxPolicy.prepare_secrets)."""
        owner = spec.owner or (caller.name if caller is not None else None)
        consumer = spec.consumer
        if consumer == UNSET_CONSUMER and caller is not None:
            consumer = caller.consumer
        await self.policy.prepare_secrets(owner, consumer)

    async def create(self, spec: SessionSpec, caller: Principal | None = None) -> GatedSession:
        if not self.events.active:
            await self.prepare(spec, caller)
            return GatedSession(await self.provider.create(self.effective_spec(spec, caller)), self)
        started = time.monotonic()
        effective = spec
        try:
            await self.prepare(spec, caller)
            effective = self.effective_spec(spec, caller)
            session = GatedSession(await self.provider.create(effective), self)
        except Exception as e:
            owner = effective.owner or (caller.name if caller is not None else None)
            self.tell(
                ev.SESSION_CREATE_FAILED,
                owner=owner,
                consumer=effective.consumer,
                error=type(e).__name__,
                message=str(e),
                seconds=time.monotonic() - started,
            )
            raise
        session.tell(
            ev.SESSION_CREATE, spec=session.spec_known() or effective, seconds=time.monotonic() - started
        )
        return session

    def tell(
        self,
        kind: str,
        *,
        session: str | None = None,
        owner: str | None = None,
        consumer: str | None = None,
        actor: str | None = None,
        **data: Any,
    ) -> None:
        """Emit one event of this gate's provider (a no-op with no listener)."""
        if self.events.active:
            self.events.emit(SandboxEvent(kind, session, owner, consumer, self.kind, actor, data))

    def session_limits(self) -> SessionLimits:
        return self.provider.session_limits()

    def image_allowed(self, image: str | None) -> bool:
        return self.provider.image_allowed(image)

    async def get(self, session_id: str) -> GatedSession:
        return GatedSession(await self.provider.get(session_id), self)

    async def list(self) -> list[SessionInfo]:
        return await self.provider.list()

    async def reap(self) -> builtins.list[str]:
        reaped = await self.provider.reap()
        for session_id in reaped:
            self.tell(ev.SESSION_REAP, session=session_id)
        return reaped

    async def check_available(self) -> None:
        await self.provider.check_available()

    async def close(self) -> None:
        await self.provider.close()


@dataclasses.dataclass(frozen=True)
class GatedExecResult(ExecResult):
    """A one-shot's result through the gate: the output scrubbed, the counts what the command wrote."""

    stdout_bytes: int = 0
    stderr_bytes: int = 0


class GatedSession(SandboxSession):
    """A provider's session behind the gate: ``run``/``start`` apply the exec-time policy; the rest
    (and any attribute of the provider's own) is the provider session's."""

    session: SandboxSession
    gate: GatedSandbox

    def __init__(self, session: SandboxSession, gate: GatedSandbox) -> None:
        if isinstance(session, GatedSession):
            session = session.session
        self.session = session
        self.gate = gate

    def __getattr__(self, name: str) -> Any:
        if name in ("session", "gate"):
            raise AttributeError(name)
        return getattr(self.session, name)

    def __repr__(self) -> str:
        return f"<GatedSession {self.session!r}>"

    @property
    def id(self) -> str:
        return self.session.id

    async def info(self) -> SessionInfo:
        return await self.session.info()

    def known_info(self) -> SessionInfo | None:
        return self.session.known_info()

    # ------------------------------------------------------- exec, gated

    async def run(self, request: ExecRequest) -> GatedExecResult:
        events = self.gate.events
        number = self._tell_start(request, one_shot=True) if events.active else 0
        started = time.monotonic()
        try:
            with spilling_at_most(self.gate.spill_limit):
                result = await self.session.run(self.gate.admit(request, one_shot=True))
            policy = self.gate.policy
            placeholders = self._placeholders()
            gated = GatedExecResult(
                result.exit_code,
                await _scrubbed(policy, result.stdout, placeholders),
                await _scrubbed(policy, result.stderr, placeholders),
                result.reason,
                stdout_bytes=len(result.stdout),
                stderr_bytes=len(result.stderr),
            )
        except Exception as e:
            if number:
                self.tell_end(number, one_shot=True, started=started, error=type(e).__name__)
            raise
        if number:
            self.tell_end(
                number,
                one_shot=True,
                started=started,
                exit_code=gated.exit_code,
                reason=gated.reason,
                stdout_bytes=gated.stdout_bytes,
                stderr_bytes=gated.stderr_bytes,
                stdout=gated.stdout,
                stderr=gated.stderr,
            )
        return gated

    async def start(self, request: ExecRequest) -> ExecHandle:
        number = self._tell_start(request, one_shot=False) if self.gate.events.active else 0
        started = time.monotonic()
        try:
            with spilling_at_most(self.gate.spill_limit):
                handle = await self.session.start(self.gate.admit(request, one_shot=False))
        except Exception as e:
            if number:
                self.tell_end(number, one_shot=False, started=started, error=type(e).__name__)
            raise
        return self._scrubbed(handle, number)

    # ----------------------------------------------------------- events

    def spec_known(self) -> SessionSpec | None:
        """The session's spec as far as it is known without asking the provider."""
        info = self.session.known_info()
        return info.spec if info is not None else getattr(self.session, "spec", None)

    def tell(self, kind: str, *, actor: str | None = None, **data: Any) -> None:
        """Emit one event of this session (a no-op with no listener)."""
        if not self.gate.events.active:
            return
        spec = self.spec_known()
        self.gate.tell(
            kind,
            session=self.session.id,
            owner=getattr(spec, "owner", None),
            consumer=getattr(spec, "consumer", None),
            actor=actor,
            **data,
        )

    def tell_end(
        self,
        number: int,
        *,
        one_shot: bool,
        started: float,
        exit_code: int | None = None,
        reason: str | None = None,
        stdout_bytes: int = 0,
        stderr_bytes: int = 0,
        error: str | None = None,
        **output: Any,
    ) -> None:
        """Emit exec ``number``'s end (``started``: its time.monotonic(); ``output``: a one-shot's bytes)."""
        self.tell(
            ev.EXEC_END,
            exec=number,
            one_shot=one_shot,
            exit_code=exit_code,
            reason=reason,
            stdout_bytes=stdout_bytes,
            stderr_bytes=stderr_bytes,
            seconds=time.monotonic() - started,
            **({"error": error} if error is not None else {}),
            **output,
        )

    def _tell_start(self, request: ExecRequest, *, one_shot: bool) -> int:
        number = ev.next_exec_number()
        self.tell(
            ev.EXEC_START,
            exec=number,
            argv=list(request.argv),
            one_shot=one_shot,
            timeout_seconds=request.timeout_seconds,
            cwd=request.cwd,
            pty=request.pty,
            label=request.label,
        )
        return number

    def _placeholders(self) -> tuple[str, ...]:
        """The placeholders of the session's secrets (the transcript scrub replaces them too)."""
        egress = getattr(self.spec_known(), "egress", None)
        return tuple(g.placeholder for g in egress.secrets) if egress is not None else ()

    def _scrubbed(self, handle: ExecHandle, number: int = 0) -> ExecHandle:
        scrubbers: dict[OutputStream, StreamScrubber] = {}
        placeholders = self._placeholders()
        for stream in _STREAMS:
            scrubber = self.gate.policy.stream_scrubber(placeholders)
            if scrubber is not None:
                scrubbers[stream] = scrubber
        # nothing to scrub nor tell: the provider's handle as it is (no layer on the output's hot path)
        if not scrubbers and not number:
            return handle
        return ScrubbedHandle(handle, scrubbers, self if number else None, number)

    # ------------------------------ commands the session holds, scrubbed alike

    @property
    def holds_commands(self) -> bool:  # type: ignore[override]  # the session's, read each time; SandboxSession has a plain attribute
        return self.session.holds_commands

    async def held_commands(self) -> list[HeldCommand]:
        return await self.session.held_commands()

    async def attach_command(self, command_id: str, offsets: Mapping[str, int] | None = None) -> ExecHandle:
        """A held command's output goes through fresh scrubbers: started at the stream's start (nothing was
        lost), they give the very bytes the first server's did."""
        with spilling_at_most(self.gate.spill_limit):
            handle = await self.session.attach_command(command_id, offsets)
        return self._scrubbed(handle)

    # --------------------------------------------------- the rest, as is

    @property
    def opens_ports(self) -> bool:  # type: ignore[override]  # the session's, read each time; SandboxSession has a plain attribute
        return self.session.opens_ports

    async def open_port(self, port: int, host: str = "127.0.0.1") -> PortConnection:
        """A byte transport, like :func:`start_transport`'s: never scrubbed (a replacement would corrupt it)."""
        return await self.session.open_port(port, host)

    async def put_file(self, path: str, data: bytes | AsyncIterable[bytes]) -> None:
        await self.session.put_file(path, data)
        self.tell(ev.FILE_PUT, path=path, size=len(data) if isinstance(data, (bytes, bytearray)) else None)

    async def get_file(self, path: str) -> bytes:
        data = await self.session.get_file(path)
        self.tell(ev.FILE_GET, path=path, size=len(data))
        return data

    def iter_file(self, path: str, chunk_size: int = 1 << 20) -> AsyncIterator[bytes]:
        if not self.gate.events.active:
            return self.session.iter_file(path, chunk_size)
        return self._told_iter_file(path, chunk_size)

    async def _told_iter_file(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self.session.iter_file(path, chunk_size):
            size += len(chunk)
            yield chunk
        self.tell(ev.FILE_GET, path=path, size=size)

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        return await self.session.list_files(path)

    async def remove_path(self, path: str) -> None:
        await self.session.remove_path(path)
        self.tell(ev.FILE_CHANGE, op="remove", path=path, to=None)

    async def move_path(self, path: str, new_path: str) -> None:
        await self.session.move_path(path, new_path)
        self.tell(ev.FILE_CHANGE, op="move", path=path, to=new_path)

    async def make_folder(self, path: str) -> None:
        await self.session.make_folder(path)
        self.tell(ev.FILE_CHANGE, op="mkdir", path=path, to=None)

    def resolve(self, path: str) -> str:
        return self.session.resolve(path)

    async def resolve_path(self, path: str) -> str:
        return await self.session.resolve_path(path)

    async def destroy(self, remove_workspace: bool = False) -> None:
        await self.session.destroy(remove_workspace=remove_workspace)
        self.tell(ev.SESSION_DESTROY, remove_workspace=remove_workspace)

    async def set_expiry(self, expires_at: float) -> SessionInfo:
        return await self.session.set_expiry(expires_at)

    @property
    def pausable(self) -> bool:  # type: ignore[override]  # the session's, read each time; SandboxSession has a plain attribute
        return self.session.pausable

    async def pause(self) -> SessionInfo:
        info = await self.session.pause()
        self.tell(ev.SESSION_PAUSE)
        return info

    async def resume(self) -> SessionInfo:
        info = await self.session.resume()
        self.tell(ev.SESSION_RESUME)
        return info

    @property
    def forkable(self) -> bool:  # type: ignore[override]  # the session's, read each time; SandboxSession has a plain attribute
        return self.session.forkable

    async def fork(self) -> GatedSession:
        """The copy, behind the gate; the policy in force now must still admit the source's spec."""
        spec = (await self.session.info()).spec
        await self.gate.prepare(spec)
        self.gate.effective_spec(spec)
        copy = GatedSession(await self.session.fork(), self.gate)
        copy.tell(ev.SESSION_FORK, source=self.session.id)
        return copy

    async def usage(self) -> dict[str, Any]:
        return await self.session.usage()

    async def set_egress(self, policy: EgressPolicy) -> None:
        """``policy``'s allow and deny lists within the operator's rule (its secrets are the session's own,
        whatever ``policy`` says), then put in force by the provider."""
        await self.change_egress(allow=policy.allow, deny=policy.deny)

    async def change_egress(
        self, *, allow: Iterable[str] | None = None, deny: Iterable[str] = ()
    ) -> SessionInfo:
        """See :meth:`GatedSandbox.set_egress`."""
        info = await self.session.info()
        await self.gate.prepare(info.spec)  # the gateway writes the secrets' values again
        policy = self.gate.policy.effective_egress(info.spec, allow, deny)
        await self.session.set_egress(policy)
        self.tell(
            ev.EGRESS_CHANGE,
            allow=None if policy.allow is None else list(policy.allow),
            deny=list(policy.deny),
        )
        info = await self.session.info()
        return dataclasses.replace(info, spec=info.spec.replace(egress=policy))


class PolicyEgressHooks:
    """The :class:`~jupyter_tai_sandbox.contract.EgressHooks` a gate gives its provider: the real values of
    its policy's secrets, and its audit sink."""

    def __init__(self, policy: SandboxPolicy) -> None:
        self.policy = policy

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        return self.policy.secret_value(name, owner)

    def audit(self, record: Mapping[str, Any]) -> None:
        self.policy.egress_audit.audit(record)


class ScrubbedHandle(ExecHandle):
    """An interactive command's handle whose output is scrubbed, one scrubber per stream, and told to the
    gate's listeners (``told``: the session whose events they are, with the exec's ``number``).

    ``byte_counts`` are the bytes the command wrote on each stream so far, before the scrub.
    """

    def __init__(
        self,
        handle: ExecHandle,
        scrubbers: dict[OutputStream, StreamScrubber],
        told: GatedSession | None = None,
        number: int = 0,
    ) -> None:
        self.handle = handle
        self.byte_counts: dict[str, int] = dict.fromkeys(_STREAMS, 0)
        self._scrubbers = scrubbers
        self._told = told
        self._number = number
        self._started = time.monotonic()
        self._output = self._scrubbed() if not told else self._telling(self._scrubbed())

    async def _telling(self, items: AsyncIterator[OutputItem]) -> AsyncIterator[OutputItem]:
        """``items`` as they are, each chunk told to output listeners, the exit (or the error) as the end."""
        told = self._told
        assert told is not None
        events = told.gate.events
        try:
            async for item in items:
                if isinstance(item, OutputChunk):
                    if events.wants_output:
                        told.tell(ev.EXEC_OUTPUT, exec=self._number, stream=item.stream, bytes=item.data)
                else:
                    self._tell_end(exit_code=item.exit_code, reason=item.reason)
                yield item
        except Exception as e:
            self._tell_end(error=type(e).__name__)
            raise

    def _tell_end(self, **end: Any) -> None:
        assert self._told is not None
        self._told.tell_end(
            self._number,
            one_shot=False,
            started=self._started,
            stdout_bytes=self.byte_counts.get("stdout", 0),
            stderr_bytes=self.byte_counts.get("stderr", 0),
            **end,
        )

    @property
    def output(self) -> AsyncIterator[OutputItem]:
        return self._output

    async def _scrubbed(self) -> AsyncIterator[OutputItem]:
        try:
            async for item in self.handle.output:
                if not isinstance(item, OutputChunk):  # the exit: what the scrubbers held back goes first
                    for tail in self._tails():
                        yield tail
                    yield item
                    continue
                self.byte_counts[item.stream] = self.byte_counts.get(item.stream, 0) + len(item.data)
                scrubber = self._scrubbers.get(item.stream)
                if scrubber is None:
                    yield item
                    continue
                data = scrubber.feed(item.data)
                if data:
                    yield OutputChunk(item.stream, data)
        except Exception:  # a timeout, a failure: the held-back tails, then the error
            for tail in self._tails():
                yield tail
            raise

    def _tails(self) -> list[OutputChunk]:
        tails = []
        for stream, scrubber in self._scrubbers.items():
            tail = scrubber.flush()
            if tail:
                tails.append(OutputChunk(stream, tail))
        return tails

    async def write(self, data: bytes) -> None:
        await self.handle.write(data)

    async def close_stdin(self) -> None:
        await self.handle.close_stdin()

    async def detach(self) -> None:
        await self.handle.detach()

    async def kill(self) -> None:
        await self.handle.kill()

    async def resize(self, rows: int, cols: int) -> None:
        await self.handle.resize(rows, cols)


async def start_transport(session: SandboxSession, request: ExecRequest) -> ExecHandle:
    """Start a byte transport (no transcript: the kernel tunnel's relay). Through the gate the
    timeout ceiling holds but the output is not scrubbed: a replacement would corrupt its frames."""
    if isinstance(session, GatedSession):
        with spilling_at_most(session.gate.spill_limit):
            return await session.session.start(session.gate.admit(request, one_shot=False))
    return await session.start(request)


async def _scrubbed(policy: SandboxPolicy, data: bytes, also: tuple[str, ...] = ()) -> bytes:
    """``data`` with the transcript scrub applied (off the loop when large); itself when it is off.
    ``also``: the session's placeholders."""
    if not data or policy.stream_scrubber(also) is None:
        return data
    if len(data) > _SCRUB_INLINE_BYTES:
        return await asyncio.to_thread(policy.scrub_bytes, data, also)
    return policy.scrub_bytes(data, also)
