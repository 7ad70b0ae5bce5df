"""Byte streams to an agent: its ``connect`` relay, beside ``AgentClient.over_command`` (a ``docker exec -i``),
or its socket itself (:func:`open_in_netns`, for a server on the engine's host).

A non-tty Docker exec attached over the engine API multiplexes the relay's stdout and stderr in 8-byte-header
frames (stream 1 or 2, 3 zero bytes, u32 BE length). :class:`DockerExecProtocol` takes the hijacked socket's
bytes straight into its own buffer (``asyncio.BufferedProtocol``: no StreamReader copies), strips those
headers in place and pushes the relay's stdout to :meth:`AgentClient.feed`; the relay's stderr (its refusal
message, if any) is kept, bounded, for the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from .client import AGENT_PATH, RELAY_USER, AgentClient, AgentConnectionLost
from .netns import agent_socket

DOCKER_HEADER = 8
STDERR_KEPT = 4096
RECV_SIZE = 1 << 20
#: what an idle or quiet connection reads into: a thousand sessions' connections hold 64 MiB, not 1 GiB
QUIET_RECV_SIZE = 64 << 10


class DockerExecProtocol(asyncio.BufferedProtocol):
    """The relay's side of a Docker-multiplexed exec socket. Stdout goes to ``sink`` (an AgentClient's
    ``feed``/``feed_eof``, or anything with them); until a sink is set it is kept. ``stderr`` holds the relay's
    first bytes of stderr. Doubles as the writer the client needs (``write``, ``drain``, ``close``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.sink: Any = None
        self.stderr = bytearray()
        self._buf = bytearray(QUIET_RECV_SIZE + DOCKER_HEADER)
        self._keep = 0  # bytes of a split Docker header kept at the buffer's start
        self._kind, self._left = 0, 0  # the current Docker frame's stream and its bytes still to come
        self._early = bytearray()  # stdout before a sink was set
        self._eof: str | None = None
        self._closed = False
        self._paused: asyncio.Future[None] | None = None

    # -- the reading side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # typed BaseTransport: a socket's is a Transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buf)[self._keep :]

    def buffer_updated(self, nbytes: int) -> None:
        with memoryview(self._buf) as view:
            end, pos = self._keep + nbytes, 0
            while pos < end:
                if self._left == 0:
                    if end - pos < DOCKER_HEADER:
                        break
                    kind, left = view[pos], int.from_bytes(view[pos + 4 : pos + 8], "big")
                    pos += DOCKER_HEADER
                    if kind not in (1, 2):  # not a multiplexed stream: end it rather than guess
                        self._end("the exec stream is not a multiplexed Docker stream")
                        if self.transport is not None:
                            self.transport.close()
                        return
                    self._kind, self._left = kind, left
                    continue
                take = min(self._left, end - pos)
                chunk = view[pos : pos + take]
                if self._kind == 1:
                    self._stdout(chunk)
                else:
                    self.stderr += chunk[: max(0, STDERR_KEPT - len(self.stderr))]
                pos += take
                self._left -= take
            rest = bytes(view[pos:end])  # at most a split header: a few bytes
        self._fit(self._keep + nbytes)
        self._buf[: len(rest)] = rest
        self._keep = len(rest)

    def _fit(self, filled: int) -> None:
        """A read that filled the buffer is a fast stream's: the next read takes up to RECV_SIZE. A small one
        after that is a quiet connection's again: its buffer shrinks back (a buffer is held per session)."""
        if filled >= len(self._buf) and len(self._buf) < RECV_SIZE:
            self._buf = bytearray(RECV_SIZE + DOCKER_HEADER)
        elif filled < QUIET_RECV_SIZE // 4 and len(self._buf) > QUIET_RECV_SIZE + DOCKER_HEADER:
            self._buf = bytearray(QUIET_RECV_SIZE + DOCKER_HEADER)

    def _stdout(self, chunk: memoryview) -> None:
        if self.sink is not None:
            self.sink.feed(chunk)  # the sink copies what it keeps before returning
        else:
            # unbounded here, yet bounded overall: nothing is asked of the agent before a sink is set
            self._early += chunk

    def set_sink(self, sink: Any) -> None:
        self.sink = sink
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            sink.feed(early)
        if self._eof is not None:
            sink.feed_eof(self._eof or None)

    def _end(self, message: str = "") -> None:
        if self._eof is None:
            self._eof = message
            if self.sink is not None:
                self.sink.feed_eof(message or None)

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._end(f"the exec stream to the session agent ended: {exc}" if exc else "")
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    # -- the writing side (flow control from the transport)
    def pause_writing(self) -> None:
        if self._paused is None or self._paused.done():
            self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        if self._closed or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the exec stream to the session agent is closed")
        if self._paused is not None and not self._paused.done():
            await asyncio.shield(self._paused)
            if self._closed:
                raise ConnectionResetError("the exec stream to the session agent is closed")

    def is_closing(self) -> bool:
        return self._closed or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def create_relay_exec(api: Any, container: str) -> str:
    """Create (not start) the exec of a container's ``connect`` relay, as RELAY_USER, through the engine API (a
    ``docker.APIClient``); its id. Blocking: call it in a thread."""
    created = api.exec_create(
        container, [AGENT_PATH, "connect"], stdin=True, stdout=True, stderr=True, tty=False, user=RELAY_USER
    )
    return str(created["Id"])


async def open_docker_api(api: Any, container: str, **kw: Any) -> AgentClient:
    """Connect to a container's agent through the engine API (a ``docker.APIClient``): one exec of
    ``/.tai/agent connect`` whose hijacked socket is the channel. The SDK's blocking calls run in a thread."""

    def start() -> socket.socket:
        sock = api.exec_start(create_relay_exec(api, container), socket=True)
        raw: socket.socket = getattr(sock, "_sock", sock)
        # the descriptor in a socket of its own: the SDK's response keeps a file over the hijacked one,
        # which would hold the descriptor open after the transport closed it (till the collector came)
        raw = socket.socket(fileno=raw.detach())
        raw.setblocking(False)
        return raw

    sock = await asyncio.to_thread(start)
    with_buffers(sock)
    _, proto = await asyncio.get_running_loop().create_connection(DockerExecProtocol, sock=sock)
    client = AgentClient(None, proto, **kw)
    proto.set_sink(client)
    try:
        return await AgentClient.open_client(client)
    except AgentConnectionLost as e:
        if proto.stderr:
            raise AgentConnectionLost(
                f"{e.message}: {bytes(proto.stderr).decode(errors='replace').strip()}"
            ) from None
        raise


async def open_docker_streams(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, **kw: Any
) -> AgentClient:
    """Connect over an exec of ``/.tai/agent connect`` the caller started and attached as streams (the
    provider's own engine client): its bytes are read into a :class:`DockerExecProtocol`, which strips the
    Docker headers and feeds the client; the client writes to ``writer``."""
    demux = DockerExecProtocol()
    client = AgentClient(None, writer, **kw)
    demux.set_sink(client)

    async def pump() -> None:
        error: Exception | None = None
        try:
            while True:
                buffer = demux.get_buffer(-1)
                data = await reader.read(len(buffer))
                if not data:
                    demux.eof_received()
                    break
                buffer[: len(data)] = data
                demux.buffer_updated(len(data))
        except (OSError, asyncio.IncompleteReadError) as e:
            error = e
        finally:
            demux.connection_lost(error)

    client.pump = asyncio.create_task(pump())  # held by the client: it ends when the stream does
    try:
        return await AgentClient.open_client(client)
    except AgentConnectionLost as e:
        if demux.stderr:
            raise AgentConnectionLost(
                f"{e.message}: {bytes(demux.stderr).decode(errors='replace').strip()}"
            ) from None
        raise


class SocketProtocol(DockerExecProtocol):
    """A plain socket to the agent itself (no Docker frames, no relay): every byte is the agent's."""

    def buffer_updated(self, nbytes: int) -> None:
        with memoryview(self._buf) as view:
            self._stdout(view[:nbytes])
        self._fit(nbytes)


async def open_in_netns(pid: int, cgroup_mark: str, **kw: Any) -> AgentClient:
    """Connect to the agent running as host process ``pid`` straight over its socket, from a thread that
    enters its network namespace: no engine exec and no relay process on the path. Needs root on the
    engine's host (``NotReachableHere`` otherwise)."""
    sock = await agent_socket(pid, cgroup_mark)
    with_buffers(sock)
    _, proto = await asyncio.get_running_loop().create_connection(SocketProtocol, sock=sock)
    client = AgentClient(None, proto, **kw)
    proto.set_sink(client)
    return await AgentClient.open_client(client)


def with_buffers(sock: socket.socket, size: int = 4 << 20) -> None:
    """Larger kernel socket buffers (best effort, capped by the system): more bytes per wake-up each way."""
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
