"""Workspace files in and out of a session container, through commands.

A download or an upload is one command (``GET`` / ``PUT`` of ``_docker_scripts``,
under the usual RUN/HOLD wrapper) on an attached exec stream of its own (an
asyncio connection, ``_docker_stream``). Nothing else is held: no worker thread,
and not the container's lock, which the engine's archive API keeps until an
archive is fully read or written (so one slow client would block every other
engine call on the container, its commands' deadlines included).

* **Bounded memory.** A download reads the engine's stream only as its consumer
  asks for data (the stream's buffer is ``READ_SIZE``; the engine, then the
  command, wait when it is full); an upload is kept in a spooled temporary file
  (memory, then disk: its size must be known) and written to the command's stdin
  with backpressure.
* **Idle limit.** A transfer that moves no data for ``idle_seconds`` -- a consumer
  that stops reading, a client or an engine that stops sending -- is aborted:
  its connection is closed, its command stopped in the background, and the
  transfer raises :class:`TransferIdleError`.
* **Confinement** is the scripts' own, inside the container, in the same step as
  the read or write (see ``_docker_scripts``).
* **Atomic uploads.** The body goes to a new temporary file in the target's
  folder and is renamed over the target only when every byte arrived, so a
  reader sees the old file or the new one, and concurrent uploads to one path
  never mix (the last rename wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import IO

from ..contract import SandboxError, SandboxNotFoundError, SandboxPathError
from . import _docker_scripts as scripts
from ._docker_command import stop_command
from ._docker_names import WORKSPACE
from ._docker_stream import READ_SIZE, _Demux
from .container.files import TransferIdleError
from .docker_engine import DockerEngine

#: bytes of an upload kept in memory before its spool goes to disk
UPLOAD_MEMORY = 1 << 20
_WRITE_CHUNK = 256 << 10
_MAX_HEAD = 64 << 10
#: background stops of aborted transfers (kept referenced until they end)
_STOPS: set[asyncio.Task[None]] = set()


class _Transfer:
    """One transfer command: its exec, its stream, and its stop."""

    def __init__(
        self, engine: DockerEngine, container_id: str, *, idle_seconds: float, log: logging.Logger | logging.LoggerAdapter,
        gone: Callable[[], bool],
    ) -> None:
        self.engine = engine
        self.container = container_id
        self.idle = idle_seconds
        self.log = log
        self.gone = gone
        self.token = secrets.token_hex(8)
        self.exec_id: str | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.demux = _Demux()
        self.finished = False

    async def start(self, script: str, *args: str) -> None:
        cmd = ["sh", "-c", scripts.RUN, "sh", scripts.HOLD, self.token, WORKSPACE, "sh", "-c", script, "sh", *args]
        self.exec_id = await self.engine.exec_create(self.container, cmd, env=None, stdin=True, tty=False)
        try:
            self.reader, self.writer = await self.engine.exec_start(self.exec_id, False)
        except BaseException:
            self.abort()
            raise

    async def pieces(self, what: str, *, bounded: bool = True) -> list[tuple[str, bytes]] | None:
        """The next output pieces taken in (None at the stream's end), within the idle limit."""
        assert self.reader is not None
        try:
            read = self.reader.read(READ_SIZE)
            data = await (asyncio.wait_for(read, self.idle) if bounded else read)
        except asyncio.TimeoutError:
            raise TransferIdleError(
                f"the {what} stopped: the session's engine sent no data for {self.idle:g} s "
                "(DockerSandbox.transfer_idle_seconds)"
            ) from None
        except OSError as e:
            raise EngineCutOffError(f"the {what} was cut off by the Docker engine: {e!r}") from None
        if not data:
            return None
        return self.demux.feed(data)

    def abort(self) -> None:
        """Close the stream at once and stop the command in the background (never blocks)."""
        if self.finished:
            return
        self.finished = True
        if self.writer is not None:
            self.writer.transport.abort()
        if self.exec_id is None:
            return
        task = asyncio.get_running_loop().create_task(self._stop(self.exec_id))
        _STOPS.add(task)
        task.add_done_callback(_STOPS.discard)

    async def _stop(self, exec_id: str) -> None:
        try:
            await stop_command(self.engine, self.container, exec_id, self.token, pty=False, gone=self.gone)
        except SandboxError as e:
            log = self.log.debug if self.gone() else self.log.warning
            log("sandbox-docker: an aborted file transfer could not be stopped: %s", e)

    def close(self) -> None:
        """The command has ended: close the stream."""
        self.finished = True
        if self.writer is not None:
            self.writer.transport.abort()


def _refusal(head: bytes, path: str, what: str) -> SandboxError:
    """The error a script's ``error KIND message`` line stands for."""
    _, kind, detail = [*head.decode("utf-8", "replace").split(" ", 2), "", ""][:3]
    if kind == "missing":
        return SandboxNotFoundError(f"no file {path!r} in the session workspace")
    if kind == "outside":
        return SandboxPathError(
            f"path {path!r} leads outside the session workspace through a symlink; it is not followed"
        )
    if kind == "notfolder":
        return SandboxPathError(f"cannot use {path!r}: {detail} is not a folder")
    if kind == "notfile":
        return SandboxPathError(f"cannot {what} {path!r}: it is not a regular file")
    return SandboxError(f"cannot {what} {path!r}: {detail or head.decode('utf-8', 'replace')}")


class EngineCutOffError(SandboxError):
    """The engine's stream of a transfer broke (the connection, not the session's answer)."""


async def download(
    engine: DockerEngine,
    container_id: str,
    rel: str,
    path: str,
    *,
    chunk_size: int,
    idle_seconds: float,
    log: logging.Logger | logging.LoggerAdapter,
    gone: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """Stream workspace file ``rel`` (``path`` as the caller named it, for messages).

    The engine's stream is read only as the consumer asks; a consumer that asks for
    nothing for ``idle_seconds`` has its transfer aborted (the next ask raises
    :class:`TransferIdleError`). Errors about the path come before any data. A read is
    idempotent, so a stream the engine cuts before the first byte reached the consumer
    is asked for once more (seen from swarm nodes' engines on a loaded machine); a cut
    after that is the consumer's error.
    """
    for attempt in (1, 2):
        delivered = False
        once = _download_once(
            engine, container_id, rel, path, chunk_size=chunk_size, idle_seconds=idle_seconds, log=log, gone=gone
        )
        try:
            async with contextlib.aclosing(once):
                async for chunk in once:
                    delivered = True
                    yield chunk
            return
        except EngineCutOffError as e:
            if delivered or attempt == 2:
                raise
            log.warning("sandbox-docker: %s before its first byte; asking once more", e)


async def _download_once(
    engine: DockerEngine,
    container_id: str,
    rel: str,
    path: str,
    *,
    chunk_size: int,
    idle_seconds: float,
    log: logging.Logger | logging.LoggerAdapter,
    gone: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """One try of :func:`download`."""
    transfer = _Transfer(engine, container_id, idle_seconds=idle_seconds, log=log, gone=gone)
    loop = asyncio.get_running_loop()
    stalled = False

    def on_idle() -> None:
        nonlocal stalled
        stalled = True
        transfer.abort()

    timer: asyncio.TimerHandle | None = None
    await transfer.start(scripts.GET, rel)
    try:
        head = b""
        size: int | None = None
        sent = 0
        ended = False  # the script says its content is all out
        while True:
            pieces = await transfer.pieces("download")
            if pieces is None:
                break
            out = []
            for stream, data in pieces:
                if stream == "stderr":
                    ended = ended or b"end" in data
                    continue
                if size is None:
                    head += data
                    if b"\n" not in head:
                        if len(head) > _MAX_HEAD:
                            raise SandboxError(f"cannot read {path!r}: the session answered {head[:80]!r}")
                        continue
                    line, _, data = head.partition(b"\n")
                    if not line.startswith(b"ok "):
                        transfer.close()  # the script exits on its own after its answer
                        raise _refusal(line, path, "read")
                    size = int(line[3:])
                if data and sent < size:
                    data = data[: size - sent]
                    out.append(data)
                    sent += len(data)
            writer = transfer.writer
            if size is not None and (sent >= size or ended) and writer is not None and not writer.is_closing():
                # every byte is here (or the file shrank): let the script exit
                with contextlib.suppress(OSError, RuntimeError):
                    writer.write_eof()
            for data in out:
                for i in range(0, len(data), chunk_size):
                    # the consumer has idle_seconds to ask for the next piece
                    timer = loop.call_later(idle_seconds, on_idle)
                    try:
                        yield data[i : i + chunk_size]
                    finally:
                        timer.cancel()
                    if stalled:
                        raise TransferIdleError(
                            f"the download of {path!r} was aborted: its reader took nothing for "
                            f"{idle_seconds:g} s (DockerSandbox.transfer_idle_seconds)"
                        )
        if size is None:
            raise SandboxError(f"cannot read {path!r}: the session's command ended without an answer")
        if sent < size:
            raise SandboxError(
                f"the download of {path!r} ended after {sent} of its {size} bytes (the file changed while it "
                "was read, or the engine cut the transfer)"
            )
        transfer.close()
    finally:
        if timer is not None:
            timer.cancel()
        transfer.abort()


async def spool_upload(data: bytes | AsyncIterable[bytes]) -> tuple[IO[bytes] | None, bytes | None, int]:
    """An upload body made whole: ``(spooled_file, None, size)`` or ``(None, bytes, size)``."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        body = bytes(data)
        return None, body, len(body)
    spool = tempfile.SpooledTemporaryFile(max_size=UPLOAD_MEMORY, prefix="tai-sandbox-upload-")  # noqa: SIM115
    try:
        async for chunk in data:
            if spool._rolled:  # type: ignore[attr-defined]  # on disk: keep file I/O off the loop
                await asyncio.to_thread(spool.write, chunk)
            else:
                spool.write(chunk)
        size = spool.tell()
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool, None, size


async def upload(
    engine: DockerEngine,
    container_id: str,
    parts: list[str],
    path: str,
    data: bytes | AsyncIterable[bytes],
    *,
    idle_seconds: float,
    log: logging.Logger | logging.LoggerAdapter,
    gone: Callable[[], bool],
) -> None:
    """Write workspace file ``parts`` (its path's components) from ``data``, atomically.

    The body is made whole first (memory, then a temporary file) so no engine
    resource waits on a slow client; then one command checks the path and writes
    it (``PUT``). A transfer idle for ``idle_seconds`` is aborted; a cut-off body
    never replaces the file.
    """
    spool, body, size = await spool_upload(data)
    transfer = _Transfer(engine, container_id, idle_seconds=idle_seconds, log=log, gone=gone)
    try:
        await transfer.start(scripts.PUT, transfer.token, str(size), *parts)
        answer = bytearray()

        async def collect() -> None:
            # unbounded: the script answers only once the body is all in (the sending is bounded)
            while (pieces := await transfer.pieces("upload", bounded=False)) is not None:
                for stream, piece in pieces:
                    if stream == "stdout" and len(answer) < _MAX_HEAD:
                        answer.extend(piece)

        reading = asyncio.ensure_future(collect())
        try:
            await _send(transfer, spool, body, reading, path)
            try:
                await asyncio.wait_for(asyncio.shield(reading), idle_seconds)
            except asyncio.TimeoutError:
                raise TransferIdleError(
                    f"the upload of {path!r} stopped: the session did not answer within {idle_seconds:g} s "
                    "(DockerSandbox.transfer_idle_seconds)"
                ) from None
            transfer.close()  # its output ended: the script is done
        finally:
            reading.cancel()
        line = bytes(answer).split(b"\n", 1)[0]
        if line != b"ok":
            if not line:
                raise SandboxError(f"cannot write {path!r}: the session's command ended without an answer")
            raise _refusal(line, path, "write")
        transfer.close()
    finally:
        transfer.abort()
        if spool is not None:
            spool.close()


async def _send(
    transfer: _Transfer, spool: IO[bytes] | None, body: bytes | None, reading: asyncio.Future[None], path: str
) -> None:
    """Write the body to the command's stdin, then end it; stop early when the command has answered."""
    writer = transfer.writer
    assert writer is not None
    view = memoryview(body) if body is not None else None
    at = 0
    while not reading.done():
        if view is not None:
            chunk = view[at : at + _WRITE_CHUNK]
            at += len(chunk)
        else:
            assert spool is not None
            chunk = await asyncio.to_thread(spool.read, _WRITE_CHUNK)
        if not chunk:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()
            return
        try:
            writer.write(chunk)
            drained = asyncio.ensure_future(writer.drain())
            done, _ = await asyncio.wait({drained, reading}, timeout=transfer.idle, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                drained.cancel()
                raise TransferIdleError(
                    f"the upload of {path!r} stopped: the session took no data for {transfer.idle:g} s "
                    "(DockerSandbox.transfer_idle_seconds)"
                )
            if drained.done():
                drained.result()
            else:
                drained.cancel()
        except (OSError, RuntimeError):
            return  # the command ended (it refused the path): its answer says why
