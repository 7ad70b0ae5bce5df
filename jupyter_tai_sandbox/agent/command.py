"""One command in the session (or a TCP connection carried like one), over an agent connection (client.py).

Output credit is granted back only as a command's own output is consumed, so a command nobody reads
stalls itself alone, and each command buffers at most its window here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import protocol as p
from .errors import AgentError

STDIN_CHUNK = 512 << 10


@dataclass(frozen=True)
class ExitStatus:
    """A command's real end: an exit code, or the signal that killed it. ``returncode`` is 128 + signal then."""

    code: int | None
    signal: int | None
    timed_out: bool = False
    killed: bool = False
    core: bool = False
    #: the kernel's OOM killer ended it: a SIGKILL nobody sent, with the session's OOM kill count grown
    oom_killed: bool = False

    @property
    def returncode(self) -> int:
        return self.code if self.code is not None else 128 + (self.signal or 0)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ExitStatus:
        return cls(
            d.get("code"),
            d.get("signal"),
            bool(d.get("timed_out")),
            bool(d.get("killed")),
            bool(d.get("core")),
            bool(d.get("oom_killed")),
        )


def _quiet(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (a command's exit nobody awaited after the connection ended)."""
    if not fut.cancelled():
        fut.exception()


class AgentConnection(Protocol):
    """What a command uses of its connection (AgentClient), named without importing it."""

    _commands: dict[int, AgentCommand]

    async def _send(self, data: bytes) -> None: ...

    async def _answer(self, fut: asyncio.Future[Any]) -> Any: ...

    def _send_nowait(self, data: bytes) -> None: ...


class AgentCommand:
    """One command in the session: its output (in order, by stream), stdin, signals, kill and exit status."""

    def __init__(
        self,
        client: AgentConnection,
        id_: int,
        *,
        pty: bool,
        window: int,
        offsets: Sequence[int] = (0, 0),
        tcp: bool = False,
    ):
        self.client, self.id, self.pty, self.window = client, id_, pty, window
        self.pid: int | None = None
        self.offsets = {"stdout": offsets[0], "stderr": offsets[1]}  # the next byte expected of each stream
        self.tcp = tcp
        self.eof = {"stdout": False, "stderr": pty or tcp}  # a pty or a TCP connection has one stream
        self.cut = False
        self.lost: list[dict[str, Any]] = []
        self.exit: asyncio.Future[ExitStatus] = asyncio.get_running_loop().create_future()
        self.exit.add_done_callback(_quiet)
        self._chunks: deque[tuple[p.Stream, bytes]] = deque()
        self._wake = asyncio.Event()
        self._ungranted = 0
        self._stdin_credit = 0
        self._stdin_wake = asyncio.Event()
        self._waiters: dict[str, deque[asyncio.Future[Any]]] = {}
        self._failed: AgentError | None = None
        self._stdin_error: AgentError | None = None
        self._stdin_closed = False
        self._killed = False

    # -- frames from the reader task
    def _on_frame(self, f: p.Frame) -> None:
        if f.type in (p.STDOUT, p.STDERR):
            stream: p.Stream = "stdout" if f.type == p.STDOUT else "stderr"
            offset, data = f.data()
            if offset != self.offsets[stream]:
                raise p.ProtocolError(
                    f"{stream} of command {self.id} at {offset}, expected {self.offsets[stream]}"
                )
            self.offsets[stream] += len(data)
            self._chunks.append((stream, data))
        elif f.type == p.EOF:
            d = f.json()
            if d["offset"] != self.offsets[d["stream"]]:
                raise p.ProtocolError(
                    f"{d['stream']} ended at {d['offset']}, received {self.offsets[d['stream']]}"
                )
            self.eof[d["stream"]] = True
            self.cut = self.cut or bool(d.get("cut"))
        elif f.type == p.EXIT:
            if not self.exit.done():
                self.exit.set_result(ExitStatus.from_json(f.json()))
        elif f.type == p.LOST:
            d = f.json()
            self.lost.append(d)
            self.offsets[d["stream"]] = d["to"]
        elif f.type == p.STDIN_CREDIT:
            self._stdin_credit += f.u64()
            self._stdin_wake.set()
        elif f.type == p.KILLED:
            self._resolve("kill", f.json())
        elif f.type == p.RELEASED:
            self._resolve("release", None)
        elif f.type == p.ACK:
            d = f.json()
            self._resolve(d["op"], d)
        elif f.type == p.DETACHED:
            self._fail(AgentError("EBUSY", "another connection attached this command", "attach"))
        else:
            raise p.ProtocolError(f"unexpected frame 0x{f.type:02x} for command {self.id}")
        self._wake.set()

    def _on_error(self, err: AgentError) -> None:
        if err.op in ("stdin", "stdin_close"):
            # input refused (the command exited, or stdin was closed): later writes raise it, the exit stays
            self._stdin_error = self._stdin_error or err
            self._stdin_wake.set()
        elif err.op == "credit":
            pass  # a grant that reached the agent after the command was taken over or let go
        elif not self._resolve(err.op, err, error=True):
            self._fail(err)

    def _resolve(self, op: str, value: Any, *, error: bool = False) -> bool:
        queue = self._waiters.get(op)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_exception(value) if error else fut.set_result(value)
                return True
        return False

    def _fail(self, err: AgentError) -> None:
        if self._failed is None:
            self._failed = err
        for queue in self._waiters.values():
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_exception(err)
        if not self.exit.done():
            self.exit.set_exception(err)
        self._wake.set()
        self._stdin_wake.set()

    async def _request(self, op: str, type_: int, payload: bytes = b"") -> Any:
        if self._failed is not None:
            raise self._failed
        fut = asyncio.get_running_loop().create_future()
        waiting = self._waiters.setdefault(op, deque())
        waiting.append(fut)
        try:
            await self.client._send(p.encode(type_, self.id, payload))
            return await self.client._answer(fut)
        except BaseException:
            # no answer will be taken: the connection's end must not fail it unseen
            with contextlib.suppress(ValueError):
                waiting.remove(fut)
            fut.cancel()
            raise

    # -- output
    @property
    def ended(self) -> bool:
        """Every stream ended and the exit is known (or the command was killed and its exit is known)."""
        return self.exit.done() and (all(self.eof.values()) or self._killed)

    async def read(self) -> tuple[p.Stream, bytes] | None:
        """The next ``(stream, bytes)`` in arrival order, or None once the output has ended."""
        while True:
            if self._chunks:
                stream, data = self._chunks.popleft()
                self._consumed(len(data))
                return stream, data
            if self._failed is not None:
                raise self._failed
            if self.ended:
                return None
            self._wake.clear()
            await self._wake.wait()

    async def next_frame(self, within: float) -> None:
        """Wait (at most ``within`` s) for this command's next frame, whatever it is: after a kill, the rest of
        its output and each stream's end (which :meth:`read` no longer waits for) come this way."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), within)

    async def output(self) -> AsyncIterator[tuple[p.Stream, bytes]]:
        while (item := await self.read()) is not None:
            yield item

    def _consumed(self, n: int) -> None:
        self._ungranted += n
        if (
            self._ungranted >= self.window // 4
        ):  # a quarter: the agent never waits a whole round trip for credit
            self.client._send_nowait(p.encode_u64(p.CREDIT, self.id, self._ungranted))
            self._ungranted = 0

    async def wait(self) -> ExitStatus:
        return await asyncio.shield(self.exit)

    async def collect(self) -> tuple[bytes, bytes, ExitStatus]:
        """Read the whole output; returns stdout, stderr and the exit status."""
        out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        async for stream, data in self.output():
            out[stream].append(data)
        return b"".join(out["stdout"]), b"".join(out["stderr"]), await self.wait()

    # -- input and control
    async def write(self, data: bytes) -> None:
        """Send stdin, waiting for the agent's stdin credit (it bounds what the agent queues)."""
        view = memoryview(data)
        while view:
            while self._stdin_credit <= 0 and self._failed is None and self._stdin_error is None:
                self._stdin_wake.clear()
                await self._stdin_wake.wait()
            self._check_stdin()
            n = min(len(view), self._stdin_credit, STDIN_CHUNK)
            self._stdin_credit -= n
            await self.client._send(p.encode(p.STDIN, self.id, view[:n]))
            view = view[n:]

    def _check_stdin(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._stdin_error is not None:
            raise self._stdin_error
        if self._stdin_closed:
            raise AgentError("EPIPE", "stdin is closed", "stdin")
        if self.exit.done():
            raise AgentError("EPIPE", "the command has exited", "stdin")

    async def close_stdin(self) -> None:
        """Close the command's stdin (a pty gets ^D); once only."""
        self._check_stdin()
        self._stdin_closed = True
        await self.client._send(p.encode(p.STDIN_CLOSE, self.id))

    async def kill(self) -> dict[str, Any]:
        """Stop the command and its whole process group; its output then ends after what has arrived."""
        self._killed = True
        reply: dict[str, Any] = await self._request("kill", p.KILL)
        self._wake.set()
        return reply

    async def signal(self, signum: int, *, group: bool = True) -> bool:
        """Send a signal to the command's group (or only to it); False when the group is no longer held."""
        reply = await self._request(
            "signal", p.SIGNAL, p.json_payload({"signal": int(signum), "group": group})
        )
        return bool(reply["delivered"])

    async def resize(self, rows: int, cols: int) -> None:
        await self._request("resize", p.RESIZE, p.json_payload({"rows": rows, "cols": cols}))

    async def release(self) -> None:
        """Let the agent forget the finished command (its ring and record)."""
        await self._request("release", p.RELEASE)
        self.client._commands.pop(self.id, None)
