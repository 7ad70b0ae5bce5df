"""A container session's port connections: a socket made in its network namespace, else through its agent.

Where the server reaches the agent's socket itself (root on the engine's host), it makes a port's TCP
connection the same way, in the container's network namespace: :class:`SocketPort`, a plain socket whose
bytes never pass through the agent, which a forwarder can join to another socket with no copy through
Python (:meth:`SocketPort.take_socket`). Elsewhere the agent dials and carries the connection like a
command without a process: :class:`AgentPort`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from ...agent import AgentCommand, AgentError
from ...contract import PortConnection

#: the most bytes one read of a port's socket gives
READ_CHUNK = 256 << 10


class SocketPort(PortConnection):
    """A TCP connection made in the session's network namespace: a socket of this process."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock: socket.socket | None = sock
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._closed = False

    def take_socket(self) -> socket.socket | None:
        if self._streams is not None or self._sock is None:
            return None
        sock, self._sock = self._sock, None
        return sock

    async def _opened(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._streams is None:
            if self._sock is None:
                raise ConnectionResetError("the connection is closed")
            self._streams = await asyncio.open_connection(sock=self._sock, limit=READ_CHUNK)
        return self._streams

    async def read(self) -> bytes | None:
        reader, _ = await self._opened()
        return await reader.read(READ_CHUNK) or None

    async def write(self, data: bytes) -> None:
        _, writer = await self._opened()
        writer.write(data)
        await writer.drain()

    async def close_write(self) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            _, writer = await self._opened()
            if not writer.is_closing() and writer.can_write_eof():
                writer.write_eof()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._streams is not None:
            self._streams[1].close()
        elif self._sock is not None:
            self._sock.close()
        self._sock = None


class AgentPort(PortConnection):
    """A TCP connection the agent made inside the session, carried like a command without a process."""

    def __init__(self, command: AgentCommand) -> None:
        self._cmd = command
        self._closed = False

    async def read(self) -> bytes | None:
        try:
            item = await self._cmd.read()
        except AgentError as e:
            raise ConnectionResetError(str(e)) from None
        return None if item is None else item[1]

    async def write(self, data: bytes) -> None:
        try:
            await self._cmd.write(data)
        except AgentError as e:
            raise ConnectionResetError(str(e)) from None

    async def close_write(self) -> None:
        with contextlib.suppress(AgentError):
            await self._cmd.close_stdin()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(AgentError):
            if not self._cmd.ended:
                await self._cmd.kill()
        with contextlib.suppress(AgentError):
            await self._cmd.release()  # the agent holds at most 64 commands and connections
