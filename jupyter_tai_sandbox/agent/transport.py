"""Byte streams to an agent's ``connect`` relay, beside ``AgentClient.over_command`` (a ``docker exec -i``).

A non-tty Docker exec attached over the engine API multiplexes the relay's stdout and stderr in 8-byte-header
frames (stream 1 or 2, 3 zero bytes, u32 BE length). :func:`docker_demux` turns that into a plain stream of
the relay's stdout for :meth:`AgentClient.open`; the relay's stderr (its refusal message, if any) is kept,
bounded, for the error.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from .client import AGENT_PATH, AgentClient
from .protocol import MAX_FRAME_BODY

DOCKER_HEADER = 8
STDERR_KEPT = 4096


class DockerDemux:
    """The relay's stdout out of a Docker-multiplexed exec stream. ``stderr`` holds its first bytes of stderr."""

    def __init__(self, raw: asyncio.StreamReader) -> None:
        self.raw = raw
        self.stdout = asyncio.StreamReader(limit=2 * MAX_FRAME_BODY)
        self.stderr = bytearray()
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        buf = bytearray()
        kind, left = 0, 0  # the current frame's stream and its bytes still to come
        try:
            while data := await self.raw.read(1 << 20):
                buf += data
                pos = 0
                while pos < len(buf):
                    if left == 0:
                        if len(buf) - pos < DOCKER_HEADER:
                            break
                        kind, left = buf[pos], int.from_bytes(buf[pos + 4 : pos + 8], "big")
                        pos += DOCKER_HEADER
                        if kind not in (1, 2):
                            return  # not a multiplexed stream: end it rather than guess
                        continue
                    take = min(left, len(buf) - pos)
                    chunk = bytes(buf[pos : pos + take])
                    if kind == 1:
                        # unbounded here, yet bounded overall: the agent sends within the credit the client grants
                        self.stdout.feed_data(chunk)
                    else:
                        self.stderr += chunk[: max(0, STDERR_KEPT - len(self.stderr))]
                    pos += take
                    left -= take
                del buf[:pos]
        except ConnectionError:
            pass
        finally:
            self.stdout.feed_eof()


def docker_demux(raw: asyncio.StreamReader) -> DockerDemux:
    return DockerDemux(raw)


async def open_docker_api(api: Any, container: str, **kw: Any) -> AgentClient:
    """Connect to a container's agent through the engine API (a ``docker.APIClient``): one exec of
    ``/.tai/agent connect`` whose hijacked socket is the channel. The SDK's blocking calls run in a thread."""

    def start() -> socket.socket:
        exec_id = api.exec_create(container, [AGENT_PATH, "connect"], stdin=True, stdout=True, stderr=True,
                                  tty=False)["Id"]
        sock = api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.setblocking(False)
        return raw

    sock = await asyncio.to_thread(start)
    reader, writer = await asyncio.open_connection(sock=sock, limit=2 * MAX_FRAME_BODY)
    demux = docker_demux(reader)
    try:
        return await AgentClient.open(demux.stdout, writer, **kw)
    except BaseException:
        demux.task.cancel()
        writer.close()
        raise
