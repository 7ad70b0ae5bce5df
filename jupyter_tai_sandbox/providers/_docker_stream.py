"""An exec's attached stream on the Docker engine, read and written with asyncio.

``POST /exec/{id}/start`` answers by hijacking the HTTP connection: after the
``101 UPGRADED`` head the socket carries the command's stdin one way and its
output the other (without a tty, in frames: an 8-byte header -- stream code,
three zero bytes, big-endian length -- then the payload). We open that
connection ourselves with asyncio streams instead of going through the SDK's
blocking socket, so no thread sits on an exec: the event loop reads output as
it arrives, ``StreamWriter.drain`` gives stdin backpressure, ``write_eof``
half-closes stdin, and nothing the SDK's HTTP layer might have read ahead past
the response head can be lost. Plain ``unix://`` and ``tcp://`` engines only.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from urllib.parse import urlparse

from ..contract import OutputStream, SandboxError, SandboxUnavailableError

_FRAME = struct.Struct(">BxxxL")
_STREAMS: dict[int, OutputStream] = {1: "stdout", 2: "stderr"}
_MAX_HEAD = 64 << 10
#: the largest piece of a frame taken in at once
READ_SIZE = 256 << 10


class EngineAddress:
    """Where the engine listens: a unix socket path or a TCP host and port."""

    def __init__(self, base_url: str) -> None:
        self.url = base_url
        parsed = urlparse(base_url)
        if parsed.scheme in ("unix", "http+unix"):
            self.unix_path: str | None = parsed.path or "/var/run/docker.sock"
            self.host, self.port = "localhost", 0
        elif parsed.scheme in ("tcp", "http"):
            self.unix_path = None
            self.host, self.port = parsed.hostname or "localhost", parsed.port or 2375
        else:
            raise SandboxUnavailableError(
                f"the docker provider streams exec over unix:// or tcp:// engines only, not {base_url!r}: "
                "set DockerSandbox.base_url (or DOCKER_HOST) to one of those"
            )

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self.unix_path is not None:
                return await asyncio.open_unix_connection(self.unix_path, limit=READ_SIZE)
            return await asyncio.open_connection(self.host, self.port, limit=READ_SIZE)
        except OSError as e:
            raise SandboxUnavailableError(f"cannot reach the Docker engine at {self.url}: {e}") from e


async def start_exec(
    address: EngineAddress, api_version: str, exec_id: str, tty: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Start a created exec attached; return the hijacked connection."""
    reader, writer = await address.connect()
    body = json.dumps({"Detach": False, "Tty": tty}).encode()
    head = (
        f"POST /v{api_version}/exec/{exec_id}/start HTTP/1.1\r\n"
        "Host: docker\r\nContent-Type: application/json\r\n"
        "Connection: Upgrade\r\nUpgrade: tcp\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        writer.write(head + body)
        await writer.drain()
        raw = await reader.readuntil(b"\r\n\r\n")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        writer.close()
        raise SandboxError(f"the Docker engine at {address.url} dropped an exec start: {e!r}") from e
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else 0
    if status in (101, 200):
        return reader, writer
    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    length = int({k.strip().lower(): v for k, v in headers.items()}.get("content-length", "0") or 0)
    try:
        detail = (await reader.readexactly(min(length, _MAX_HEAD))).decode("utf-8", "replace")
        detail = json.loads(detail).get("message", detail)
    except (ValueError, OSError, asyncio.IncompleteReadError):
        detail = lines[0]
    finally:
        writer.close()
    raise EngineRefusal(status, str(detail).strip())


class EngineRefusal(SandboxError):
    """The engine answered an exec start with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"the Docker engine refused to start the command ({status}): {message}")
        self.status = status
        self.detail = message


async def read_output(reader: asyncio.StreamReader, tty: bool) -> AsyncIterator[tuple[OutputStream, bytes]]:
    """The command's output as ``(stream, data)`` pieces, until the engine closes it.

    A tty stream is one unframed stdout; otherwise frames are demultiplexed.
    """
    if tty:
        while data := await reader.read(READ_SIZE):
            yield "stdout", data
        return
    while True:
        try:
            header = await reader.readexactly(_FRAME.size)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise SandboxError("the Docker engine cut an output frame header short") from None
            return
        code, size = _FRAME.unpack(header)
        stream = _STREAMS.get(code)
        while size:
            # A frame is read in pieces: a piece taken in is a whole unit of output.
            piece = await reader.read(min(size, READ_SIZE))
            if not piece:
                return
            size -= len(piece)
            if stream is not None:
                yield stream, piece
