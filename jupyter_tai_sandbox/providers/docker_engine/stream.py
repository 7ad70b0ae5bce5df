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

from ...contract import OutputStream, SandboxError, SandboxUnavailableError

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
    except BaseException:  # cancelled (a stop's limit, a cancelled start): no connection left open
        writer.close()
        raise
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
    Each read takes in what the socket holds (up to ``READ_SIZE``); the frames
    in it are yielded with adjacent pieces of one stream joined, so a piece
    taken in is a whole unit of output and a large output costs few awaits.
    """
    if tty:
        while data := await reader.read(READ_SIZE):
            yield "stdout", data
        return
    frames = _Demux()
    while data := await reader.read(READ_SIZE):
        for piece in frames.feed(data):
            yield piece
    if frames.header:
        raise SandboxError("the Docker engine cut an output frame header short")


class _Demux:
    """Splits the engine's framed stream (8-byte headers, then payloads) into stream pieces."""

    def __init__(self) -> None:
        self.header = b""  # a header split across reads
        self.stream: OutputStream | None = None
        self.remaining = 0  # payload bytes of the current frame still to come

    def feed(self, data: bytes) -> list[tuple[OutputStream, bytes]]:
        pieces: list[tuple[OutputStream, list[memoryview]]] = []
        view = memoryview(data)
        at = 0
        while at < len(view):
            if not self.remaining:
                need = _FRAME.size - len(self.header)
                self.header += bytes(view[at : at + need])
                at += need
                if len(self.header) < _FRAME.size:
                    break
                code, self.remaining = _FRAME.unpack(self.header)
                self.stream = _STREAMS.get(code)
                self.header = b""
                continue
            take = view[at : at + self.remaining]
            at += len(take)
            self.remaining -= len(take)
            if self.stream is None:
                continue
            if pieces and pieces[-1][0] == self.stream:
                pieces[-1][1].append(take)
            else:
                pieces.append((self.stream, [take]))
        return [(stream, b"".join(parts)) for stream, parts in pieces]
