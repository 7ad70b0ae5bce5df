"""The magics' private event loop, and a command's output streamed into the cell.

The kernel's own event loop belongs to ipykernel, so the async client runs on a
private loop in a daemon thread (``LoopThread``). A cell waits in the kernel's
main thread, where a kernel interrupt (``KeyboardInterrupt``) arrives:
``stream_command`` then asks the loop to kill the remote command, waits a
little for its exit, and drops the connection past that (the server kills a
disconnected command).
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import contextlib
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..client import SandboxClient
from ..contract import ExitItem, OutputChunk, SandboxError, SandboxExecTimeoutError
from .options import SandboxMagicError

T = TypeVar("T")

#: how long an interrupted cell waits for the killed command's exit before dropping the connection
KILL_WAIT_SECONDS = 10.0


class SandboxInterrupted(KeyboardInterrupt):
    """The kernel was interrupted; the sandboxed command was killed."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt:\x1b[0m {self}"]


class LoopThread:
    """A private asyncio loop on a daemon thread (the kernel's own loop is ipykernel's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="jupyter-tai-sandbox-magics", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Wait for ``coro`` in the calling thread, interruptibly (KeyboardInterrupt passes through)."""
        future = self.submit(coro)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return future.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if deadline is not None and time.monotonic() > deadline:
                    future.cancel()
                    raise SandboxMagicError(f"no answer from the sandbox API within {timeout:g} s") from None


#: how much of the end of stderr an Outcome keeps
STDERR_TAIL = 2048


@dataclass
class Outcome:
    """What a streamed command left: captured text (for --out/--err), its exit, its deadline message."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    #: why it exited, where the status alone does not say ("killed: out of memory (...)")
    exit_reason: str | None = None
    timed_out: str | None = None
    #: the end of stderr, printed or captured (a shell's "not found" for a hint)
    stderr_tail: str = ""


@dataclass
class _Run:
    """One streamed command, shared between the kernel's thread and the loop thread."""

    output: queue.Queue[Any] = field(default_factory=queue.Queue)
    remote: Any = None
    kill_requested: bool = False
    tasks: set[asyncio.Future[Any]] = field(default_factory=set)

    def request_kill(self) -> None:  # on the loop thread
        self.kill_requested = True
        if self.remote is not None:
            task = asyncio.ensure_future(self.remote.kill())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def disconnect(self) -> None:  # on the loop thread: the server kills a disconnected command
        self.kill_requested = True
        if self.remote is not None:
            self.remote.disconnect()

    async def pump(
        self,
        get_client: Callable[[], Awaitable[SandboxClient]],
        session_id: str,
        argv: list[str],
        timeout: float,
        env: dict[str, str],
    ) -> None:
        """On the loop thread: start the command and queue its output items for the kernel's thread."""
        try:
            client = await get_client()
            self.remote = await client.exec_start(session_id, argv, timeout_seconds=timeout, env=env)
            if self.kill_requested:
                await self.remote.kill()
            with contextlib.suppress(SandboxError):
                await self.remote.close_stdin()
            async for item in self.remote.output:
                self.output.put(item)
        except Exception as e:
            self.output.put(e)
        finally:
            self.output.put(_DONE)


_DONE = object()


class _Sinks:
    """Decoded text to the cell's stdout/stderr as it arrives, or captured for --out/--err."""

    def __init__(self, capture_out: bool, capture_err: bool) -> None:
        self.decoders = {
            s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")
        }
        self.captured: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.sinks = {
            "stdout": None if capture_out else sys.stdout,
            "stderr": None if capture_err else sys.stderr,
        }
        self.outcome = Outcome()

    def take(self, item: Any) -> None:
        if isinstance(item, OutputChunk):
            self._write(item.stream, self.decoders[item.stream].decode(item.data))
        elif isinstance(item, ExitItem):
            self.outcome.exit_code, self.outcome.exit_reason = item.exit_code, item.reason
        elif isinstance(item, SandboxExecTimeoutError):
            self.outcome.timed_out = str(item)
        elif isinstance(item, SandboxError):
            raise SandboxMagicError(str(item))
        elif isinstance(item, BaseException):
            raise item

    def _write(self, stream: str, text: str) -> None:
        if stream == "stderr" and text:
            self.outcome.stderr_tail = (self.outcome.stderr_tail + text)[-STDERR_TAIL:]
        sink = self.sinks[stream]
        if sink is None:
            self.captured[stream].append(text)
        elif text:
            sink.write(text)
            sink.flush()

    def flush(self) -> None:
        for sink in self.sinks.values():
            if sink is not None:
                sink.flush()

    def finish(self) -> Outcome:
        for stream, decoder in self.decoders.items():
            self._write(stream, decoder.decode(b"", final=True))
        self.outcome.stdout = "".join(self.captured["stdout"])
        self.outcome.stderr = "".join(self.captured["stderr"])
        return self.outcome


def stream_command(
    loop: LoopThread,
    get_client: Callable[[], Awaitable[SandboxClient]],
    session_id: str,
    session_name: str,
    argv: list[str],
    timeout: float,
    env: dict[str, str],
    *,
    capture_out: bool,
    capture_err: bool,
) -> Outcome:
    """Run ``argv`` in the session, writing its output into the cell as it arrives.

    Runs in the kernel's main thread. A ``KeyboardInterrupt`` kills the remote command
    (a second one drops the connection at once) and raises ``SandboxInterrupted``.
    """
    run = _Run()
    future = loop.submit(run.pump(get_client, session_id, argv, timeout, env))
    sinks = _Sinks(capture_out, capture_err)
    try:
        while True:
            try:
                item = run.output.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is _DONE:
                break
            sinks.take(item)
    except KeyboardInterrupt:
        loop.call(run.request_kill)
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while not future.done() and time.monotonic() < deadline:
            try:
                future.result(timeout=0.1)
            except concurrent.futures.TimeoutError:
                continue
            except KeyboardInterrupt:
                break  # a second interrupt: drop the connection at once
        if not future.done():
            loop.call(run.disconnect)
        with contextlib.suppress(queue.Empty, SandboxMagicError):
            while (item := run.output.get_nowait()) is not _DONE:
                sinks.take(item)
        sinks.flush()
        exit_code = sinks.outcome.exit_code
        raise SandboxInterrupted(
            f"the command was killed in session {session_name!r}"
            + (f" (exit {exit_code})" if exit_code else "")
        ) from None
    return sinks.finish()
