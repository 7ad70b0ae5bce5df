"""An asyncio client of the session agent over any byte stream pair (agent/PROTOCOL.md).

Nothing here blocks the event loop: one reader task takes every frame as it arrives and hands it to its
command (:class:`~.command.AgentCommand`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from . import protocol as p
from .command import STDIN_CHUNK, AgentCommand, ExitStatus, _quiet
from .errors import AgentConnectionLost, AgentError

DEFAULT_WINDOW = (
    1 << 20
)  # at most the agent's ring (clamped to it at HELLO): what is in flight when a connection drops can be resumed
READ_SIZE = 1 << 20
#: the agent's folder in a session: a read-only mount in a provider's sessions (PROTOCOL.md, Injection)
AGENT_DIR = "/.tai"
AGENT_PATH = "/.tai/agent"
#: the user a relay (``agent connect``, run by ``docker exec``) runs as: not root and no session's, so that with the
#: agent binary unreadable to it (mode 0711) the kernel makes the relay non-dumpable from its exec on, and session
#: code (root without CAP_SYS_PTRACE, even after a setuid to this user) can never open its /proc/<pid>/fd
RELAY_USER = "65533:65533"

__all__ = [
    "AGENT_DIR",
    "AGENT_PATH",
    "DEFAULT_WINDOW",
    "READ_SIZE",
    "STALL_CHECK_SECONDS",
    "STDIN_CHUNK",
    "AgentClient",
    "AgentCommand",
    "AgentConnectionLost",
    "AgentError",
    "ExitStatus",
]


#: a write that waits this long asks whether the agent is still there (AgentClient.still_there)
STALL_CHECK_SECONDS = 2.0


def _as_user(user: tuple[int, int] | None) -> dict[str, int]:
    return {} if user is None else {"uid": int(user[0]), "gid": int(user[1])}


#: the most entries a listing gives (the agent's own cap of one page, kept across pages)
MAX_LIST_ENTRIES = 10_000


class AgentClient:
    """One connection to a session agent."""

    #: the task feeding this client, when it has one (open_docker_streams sets it)
    pump: asyncio.Task[None] | None = None

    def __init__(
        self,
        reader: asyncio.StreamReader | None,
        writer: Any,
        *,
        window: int = DEFAULT_WINDOW,
        process: asyncio.subprocess.Process | None = None,
    ) -> None:
        """``reader`` is a stream to read frames from, or None when a protocol pushes the bytes it receives
        through :meth:`feed` and :meth:`feed_eof` (no copy through a StreamReader: see ``transport.py``).
        ``writer`` needs ``write``, ``drain``, ``close`` and ``is_closing`` (a StreamWriter has them)."""
        self._reader, self._writer, self.window, self.process = reader, writer, window, process
        self._decoder = p.FrameDecoder()
        self._ended: asyncio.Future[AgentError] = asyncio.get_running_loop().create_future()
        self._write_lock = asyncio.Lock()
        self._commands: dict[int, AgentCommand] = {}
        self._pending: dict[tuple[str, int], asyncio.Future[Any]] = {}
        self._ids = itertools.count(secrets.randbelow(1 << 30) + 1)
        self._lost: AgentError | None = None
        self.info: dict[str, Any] = {}
        self._abandoning: set[asyncio.Future[None]] = set()  # kills of starts cancelled midway
        #: asked when a write or an answer has waited ``answer_within`` seconds: False ends the connection (the
        #: far end is known gone: an engine may keep an exec's stream open after its process died while input
        #: keeps coming); it raises when it cannot tell (the engine carrying the stream does not answer)
        self.still_there: Callable[[], Awaitable[bool]] | None = None
        self.answer_within = STALL_CHECK_SECONDS
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @property
    def lost(self) -> bool:
        """The connection has ended: every call on it fails with :class:`AgentConnectionLost`."""
        return self._lost is not None

    # -- opening
    @classmethod
    async def open(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, **kw: Any) -> AgentClient:
        return await cls.open_client(cls(reader, writer, **kw))

    @staticmethod
    async def open_client(client: AgentClient) -> AgentClient:
        """The handshake on a client made with its byte stream (closed if it fails)."""
        try:
            client.info = await client._call(
                "hello", 0, p.encode_json(p.HELLO, 0, {"version": p.PROTOCOL_VERSION})
            )
            if isinstance(client.info.get("ring"), int) and client.info["ring"] > 0:
                client.window = min(
                    client.window, client.info["ring"]
                )  # every byte in flight stays resumable
        except BaseException:
            await client.close()
            raise
        return client

    @classmethod
    async def over_command(cls, argv: Sequence[str], **kw: Any) -> AgentClient:
        """Run ``argv`` (e.g. ``docker exec -i CTR /.tai/agent connect``) and speak over its stdin/stdout."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=2 * p.MAX_FRAME_BODY,
        )
        assert proc.stdout is not None and proc.stdin is not None
        return await cls.open(proc.stdout, proc.stdin, process=proc, **kw)

    @classmethod
    async def docker_exec(cls, container: str, *, docker: str = "docker", **kw: Any) -> AgentClient:
        return await cls.over_command(
            [docker, "exec", "-i", "-u", RELAY_USER, container, AGENT_PATH, "connect"], **kw
        )

    # -- the wire
    async def _send(self, data: bytes) -> None:
        if self._lost is not None:
            raise self._lost
        async with self._write_lock:
            try:
                self._writer.write(data)
                await self._drain()
            except (ConnectionError, RuntimeError) as e:
                raise AgentConnectionLost(f"writing to the session agent failed: {e}") from None

    async def _drain(self) -> None:
        transport = getattr(self._writer, "transport", None)
        if transport is not None and not transport.is_closing() and not transport.get_write_buffer_size():
            return  # nothing queued: the write went straight to the socket
        if self.still_there is None:
            await self._writer.drain()
            return
        drain = asyncio.ensure_future(self._writer.drain())
        try:
            await self._answer(drain)
        finally:
            if not drain.done():
                drain.cancel()

    async def _answer(self, fut: asyncio.Future[Any]) -> Any:
        """What ``fut`` (an answer, or a write's drain) comes to; while it waits ``answer_within`` seconds,
        :attr:`still_there` says whether to wait on."""
        if self.still_there is None or fut.done():
            return await fut
        while True:
            try:
                async with asyncio.timeout(self.answer_within):
                    return await asyncio.shield(fut)  # a timeout asks, and leaves fut to its owner
            except TimeoutError:
                if fut.done():
                    return fut.result()
            if not await self.still_there():
                transport = getattr(self._writer, "transport", None)
                (transport.abort if transport is not None else self._writer.close)()  # ends the read loop too
                raise AgentConnectionLost("the session agent is gone: its session has ended")

    def _send_nowait(self, data: bytes) -> None:
        if self._lost is None and not self._writer.is_closing():
            self._writer.write(data)

    async def _call(self, kind: str, id_: int, data: bytes) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self._pending[(kind, id_)] = fut
        try:
            await self._send(data)
            return await self._answer(fut)
        finally:
            self._pending.pop((kind, id_), None)
            fut.add_done_callback(_quiet)  # an answer nobody waits for any more (a cancelled call) is dropped

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes from the agent (push mode); a protocol error closes the connection."""
        if self._ended.done():
            return
        try:
            for frame in self._decoder.feed(data):
                self._dispatch(frame)
        except Exception as e:  # a ProtocolError, or a frame whose JSON lacks what it must carry
            self._writer.close()
            self._ended.set_result(AgentConnectionLost(f"the session agent broke the protocol: {e}"))

    def feed_eof(self, message: str | None = None) -> None:
        """The byte stream from the agent ended (push mode)."""
        if not self._ended.done():
            self._ended.set_result(AgentConnectionLost(message) if message else AgentConnectionLost())

    async def _read_loop(self) -> None:
        err: AgentError = AgentConnectionLost()
        try:
            if self._reader is None:
                err = await self._ended
                return
            decoder = self._decoder
            while data := await self._reader.read(READ_SIZE):  # large reads: never a byte-shuffle per frame
                for frame in decoder.feed(data):
                    self._dispatch(frame)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except p.ProtocolError as e:
            err = AgentConnectionLost(f"the session agent broke the protocol: {e}")
            self._writer.close()
        except asyncio.CancelledError:
            err = AgentConnectionLost("the connection was closed")
        finally:
            self._lost = err
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(err)
            for cmd in list(self._commands.values()):
                cmd._fail(err)

    def _resolve(self, key: tuple[str, int], value: Any, *, error: bool = False) -> bool:
        fut = self._pending.get(key)
        if fut is None or fut.done():
            return False
        fut.set_exception(value) if error else fut.set_result(value)
        return True

    def _dispatch(self, f: p.Frame) -> None:
        if f.type not in p.AGENT_TYPES:
            raise p.ProtocolError(f"unknown frame type 0x{f.type:02x}")
        if f.type == p.HELLO_REPLY:
            self._resolve(("hello", 0), f.json())
        elif f.type == p.PONG:
            self._resolve(("ping", f.id), f.payload)
        elif f.type == p.LIST_REPLY:
            self._resolve(("list", f.id), f.json())
        elif f.type in (p.FILE_REPLY, p.FILE_DATA):
            self._resolve(("file", f.id), f.json() if f.type == p.FILE_REPLY else f.payload)
        elif f.type in (p.STARTED, p.ATTACHED):
            self._resolve(("start" if f.type == p.STARTED else "attach", f.id), f.json())
        elif f.type == p.ERROR:
            d = f.json()
            err = AgentError(d.get("code", "EIO"), d.get("message", ""), d.get("op", ""))
            if err.op in ("start", "attach", "file"):
                self._resolve((err.op, f.id), err, error=True)
            elif err.op in ("hello", "read", "frame"):
                # a connection-level refusal: the agent closes the connection after it
                for fut in self._pending.values():
                    if not fut.done():
                        fut.set_exception(err)
            elif f.id in self._commands:
                self._commands[f.id]._on_error(err)
            # else: about a command this client has let go (a CREDIT racing its RELEASE): nothing waits on it
        else:
            cmd = self._commands.get(f.id)
            if cmd is not None:
                cmd._on_frame(f)

    # -- operations
    def _new_id(self) -> int:
        while True:
            id_ = next(self._ids) & 0xFFFFFFFF
            if id_ and id_ not in self._commands:
                return id_

    async def start(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        pty: bool = False,
        rows: int = 24,
        cols: int = 80,
        timeout_seconds: float | None = None,
        window: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        label: str | None = None,
        root: str | None = None,
    ) -> AgentCommand:
        """Start a command; an absent program raises AgentError with code ``ENOENT``. ``uid``/``gid`` run it as
        that user and group (``gid`` defaults to ``uid``) with no supplementary groups. ``label`` (at most
        4096 bytes) is kept with the command and listed back: how a later client knows it for its own. ``root``:
        a folder of the agent's the command is chrooted into (its program and ``cwd`` are looked up there)."""
        window = window or self.window
        req: dict[str, Any] = {"argv": list(argv), "pty": pty, "window": window}
        if label is not None:
            req["label"] = label
        if uid is not None:
            req["uid"] = uid
        if gid is not None:
            req["gid"] = gid
        if env is not None:
            req["env"] = [f"{k}={v}" for k, v in env.items()]
        if cwd is not None:
            req["cwd"] = cwd
        if root is not None:
            req["root"] = root
        if pty:
            req["rows"], req["cols"] = rows, cols
        if timeout_seconds is not None:
            req["timeout_ms"] = max(1, int(timeout_seconds * 1000))
        for _ in range(8):
            id_ = self._new_id()
            cmd = AgentCommand(self, id_, pty=pty, window=window)
            self._commands[id_] = cmd
            try:
                started = await self._call("start", id_, p.encode_json(p.START, id_, req))
            except AgentError as e:
                self._commands.pop(id_, None)
                if e.code == "EEXIST":  # another client of the agent holds this id
                    continue
                raise
            except asyncio.CancelledError:
                # the START may have reached the agent, which takes a connection's frames in order: a KILL
                # of the same id after it stops whatever it started (nobody else knows the id)
                abandon = asyncio.ensure_future(self._abandon_start(cmd))
                self._abandoning.add(abandon)
                abandon.add_done_callback(self._abandoning.discard)
                raise
            cmd.pid = started["pid"]
            cmd._stdin_credit = started["stdin_window"]
            return cmd
        raise AgentError("EEXIST", "no free command id", "start")

    async def _abandon_start(self, cmd: AgentCommand) -> None:
        with contextlib.suppress(Exception):
            await cmd.kill()
        with contextlib.suppress(Exception):
            await cmd.release()
        self._commands.pop(cmd.id, None)

    async def connect_tcp(
        self, port: int, host: str = "127.0.0.1", *, window: int | None = None
    ) -> AgentCommand:
        """A TCP connection to a port inside the session (its own network: works with network ``none``),
        carried like a command: ``read`` gives what the peer sends, ``write`` sends, ``close_stdin`` half-closes,
        ``kill`` closes; ``wait`` ends with code 0 once the peer's side has ended. Refused: ``ECONNREFUSED``."""
        window = window or self.window
        for _ in range(8):
            id_ = self._new_id()
            conn = AgentCommand(self, id_, pty=False, window=window, tcp=True)
            self._commands[id_] = conn
            try:
                started = await self._call(
                    "start",
                    id_,
                    p.encode_json(p.CONNECT, id_, {"host": host, "port": port, "window": window}),
                )
            except AgentError as e:
                self._commands.pop(id_, None)
                if e.code == "EEXIST":
                    continue
                raise
            conn._stdin_credit = started["stdin_window"]
            return conn
        raise AgentError("EEXIST", "no free command id", "start")

    async def attach(
        self, id_: int, *, stdout: int = 0, stderr: int = 0, window: int | None = None
    ) -> AgentCommand:
        """Take over a command the agent holds, resuming each stream at the given offset."""
        window = window or self.window
        info = next((c for c in await self.list() if c["id"] == id_), None)
        if info is None:
            raise AgentError("ESRCH", f"no command {id_}", "attach")
        cmd = AgentCommand(
            self,
            id_,
            pty=info["pty"],
            window=window,
            offsets=(stdout, stderr),
            tcp=info["argv"][0] == "tcp" and info["pid"] == 0,
        )
        previous = self._commands.get(id_)
        if (
            previous is not None
        ):  # this connection reads it already: that reader is told, as another connection's
            previous._fail(AgentError("EBUSY", "another attach took this command", "attach"))
        self._commands[id_] = cmd
        try:
            reply = await self._call(
                "attach",
                id_,
                p.encode_json(p.ATTACH, id_, {"stdout": stdout, "stderr": stderr, "window": window}),
            )
        except BaseException:
            self._commands.pop(id_, None)
            raise
        cmd.pid = reply["pid"]
        cmd._stdin_credit = reply["stdin_window"]
        return cmd

    async def list(self) -> list[dict[str, Any]]:
        """Every command the agent holds: running, or finished and not yet released."""
        id_ = self._new_id()
        commands: builtins.list[dict[str, Any]] = await self._call("list", id_, p.encode(p.LIST, id_))
        return commands

    async def ping(self) -> None:
        id_ = self._new_id()
        await self._call("ping", id_, p.encode(p.PING, id_, b"ping"))

    # -- files: every path is relative to ``root`` (an absolute folder in the session) and confined to it by
    # the kernel (openat2 RESOLVE_BENEATH): "..", absolute paths and symlinks out fail with ``EXDEV``. With
    # ``user`` (uid, gid) an operation runs with that user's rights (no supplementary groups): the kernel
    # checks each access as for the user, and what it creates is theirs. Without, it runs as the agent (root).
    async def _file(self, type_: int, req: dict[str, Any], user: tuple[int, int] | None = None) -> Any:
        id_ = self._new_id()
        return await self._call("file", id_, p.encode_json(type_, id_, {**req, **_as_user(user)}))

    async def stat(self, root: str, path: str, *, user: tuple[int, int] | None = None) -> dict[str, Any]:
        """``{"type": "file"|"dir"|"symlink"|"other", "size", "mode", "mtime"}`` (symlinks inside followed)."""
        found: dict[str, Any] = await self._file(p.FILE_STAT, {"root": root, "path": path}, user)
        return found

    async def listdir(
        self, root: str, path: str = ".", *, user: tuple[int, int] | None = None
    ) -> builtins.list[dict[str, Any]]:
        """The folder's entries, names sorted, at most :data:`MAX_LIST_ENTRIES` (the agent answers in pages
        that each fit a frame; the next page starts after the last name of the one before)."""
        entries: builtins.list[dict[str, Any]] = []
        request: dict[str, Any] = {"root": root, "path": path}
        while True:
            reply = await self._file(p.FILE_LIST, request, user)
            entries += reply["entries"]
            after = reply.get("next")
            if not after or len(entries) >= MAX_LIST_ENTRIES:
                return entries[:MAX_LIST_ENTRIES]
            request = {**request, "after": after}

    async def read_file(
        self,
        root: str,
        path: str,
        *,
        chunk: int = p.MAX_READ_CHUNK,
        parallel: int = 4,
        user: tuple[int, int] | None = None,
    ) -> bytes:
        """The whole file, read in chunks with a few requests in flight."""
        first = await self._file(
            p.FILE_READ, {"root": root, "path": path, "offset": 0, "length": chunk}, user
        )
        size = p.U64.unpack_from(first)[0]
        parts = [first[p.U64.size :]]
        offset = len(parts[0])
        while offset < size and len(parts[-1]) == chunk:
            offsets = range(offset, size, chunk)[:parallel]
            replies = await asyncio.gather(
                *(
                    self._file(p.FILE_READ, {"root": root, "path": path, "offset": o, "length": chunk}, user)
                    for o in offsets
                )
            )
            for reply in replies:
                parts.append(reply[p.U64.size :])
                offset += len(parts[-1])
            if any(len(r) - p.U64.size < chunk for r in replies):
                break
        return b"".join(parts)

    async def write_file(
        self,
        root: str,
        path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        parents: bool = True,
        user: tuple[int, int] | None = None,
    ) -> int:
        """Upload atomically: into a temp file beside the target, renamed over it only when whole. A failure
        or cancellation aborts it and leaves the target as it was."""

        async def chunks() -> AsyncIterator[bytes]:
            yield data

        return await self.write_stream(root, path, chunks(), mode=mode, parents=parents, user=user)

    async def read_chunk(
        self,
        root: str,
        path: str,
        offset: int,
        length: int = p.MAX_READ_CHUNK,
        *,
        user: tuple[int, int] | None = None,
    ) -> tuple[int, bytes]:
        """``(file size, bytes)``: at most ``length`` bytes of the file from ``offset``."""
        reply = await self._file(
            p.FILE_READ, {"root": root, "path": path, "offset": offset, "length": length}, user
        )
        return p.U64.unpack_from(reply)[0], reply[p.U64.size :]

    async def write_stream(
        self,
        root: str,
        path: str,
        chunks: AsyncIterator[bytes],
        *,
        mode: int = 0o644,
        parents: bool = True,
        user: tuple[int, int] | None = None,
    ) -> int:
        """:meth:`write_file` from an async iterator of chunks (never the whole file in memory)."""
        id_ = self._new_id()
        req = {"root": root, "path": path, "mode": mode, "parents": parents, **_as_user(user)}
        await self._call("file", id_, p.encode_json(p.UPLOAD_OPEN, id_, req))
        try:
            offset, step = 0, p.MAX_PAYLOAD - p.U64.size
            async for chunk in chunks:
                view = memoryview(chunk)
                for i in range(0, len(view), step):
                    part = bytes(view[i : i + step])
                    await self._send(p.encode(p.UPLOAD_DATA, id_, p.U64.pack(offset) + part))
                    offset += len(part)
            reply = await self._call("file", id_, p.encode(p.UPLOAD_COMMIT, id_))
        except BaseException:
            if self._lost is None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._call("file", id_, p.encode(p.UPLOAD_ABORT, id_)))
            raise
        size: int = reply["size"]
        return size

    async def mkdir(
        self, root: str, path: str, *, parents: bool = False, user: tuple[int, int] | None = None
    ) -> None:
        """Make a folder (and its parents)."""
        await self._file(p.FILE_MKDIR, {"root": root, "path": path, "parents": parents}, user)

    async def delete(
        self, root: str, path: str, *, recursive: bool = False, user: tuple[int, int] | None = None
    ) -> None:
        await self._file(p.FILE_DELETE, {"root": root, "path": path, "recursive": recursive}, user)

    async def rename(
        self, root: str, path: str, to: str, *, parents: bool = False, user: tuple[int, int] | None = None
    ) -> None:
        await self._file(p.FILE_RENAME, {"root": root, "path": path, "to": to, "parents": parents}, user)

    async def close(self) -> None:
        """Close this connection; the agent's commands keep running."""
        with contextlib.suppress(Exception):
            self._writer.close()
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        pump = self.pump
        if pump is not None and not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
