"""Sandboxed kernels for every jupyter_client user: a loop of their own, and a watchdog for their client.

A sandboxed kernel's ZMQ ports reach the host through a tunnel that is pumped by an asyncio
loop. jupyter_server and nbclient run theirs all the time, but a blocking ``KernelManager``
(``jupyter console``, ``jupyter run``, ``start_new_kernel`` in a script) runs one only inside
each of its calls, so between calls nothing would move. Its provisioner therefore does all of
its work on :func:`kernel_loop`, one daemon thread per process running a loop forever.

A plain kernel ends when the process that started it dies (it watches its parent). A sandboxed
kernel runs elsewhere, so outside a server :func:`watch_client` starts a small process that
waits for the client to die and then destroys the kernel's session; a clean shutdown stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def kernel_loop() -> asyncio.AbstractEventLoop:
    """The process's kernel loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="tai-sandbox-kernels", daemon=True).start()
            _loop = loop
        return _loop


async def on_kernel_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the kernel loop and wait for it from the caller's loop (cancelling it too)."""
    loop = kernel_loop()
    with contextlib.suppress(RuntimeError):
        if asyncio.get_running_loop() is loop:
            return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def provider_config(sandbox: Any) -> dict[str, Any]:
    """The configurable traits of ``sandbox`` as traitlets config, so another process can make the same provider."""
    traits: dict[str, Any] = {}
    for name, trait in getattr(sandbox, "traits", lambda **_: {})(config=True).items():
        value = getattr(sandbox, name)
        if value != trait.default_value:
            with contextlib.suppress(TypeError, ValueError):
                json.dumps(value)
                traits[name] = value
    return {type(sandbox).__name__: traits}


def watch_client(sandbox: Any, session_id: str) -> subprocess.Popen[bytes]:
    """Start the watchdog: when this process dies, it destroys ``session_id`` of a provider like ``sandbox``."""
    from ..sandboxes import GatedSandbox

    if isinstance(sandbox, GatedSandbox):
        sandbox = sandbox.provider  # the provider behind the policy
    cls = type(sandbox)
    order = {"pid": os.getpid(), "session": session_id, "provider": f"{cls.__module__}:{cls.__qualname__}",
             "config": provider_config(sandbox)}  # fmt: skip
    # the order goes on stdin, never argv: the provider's config may hold a token, and argv is public
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "jupyter_tai_sandbox.kernels.watchdog"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the client's terminal does not reach it
        close_fds=True,
    )
    assert watchdog.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        watchdog.stdin.write(json.dumps(order).encode())
    watchdog.stdin.close()
    return watchdog


async def stop_watching(watchdog: subprocess.Popen[bytes] | None) -> None:
    """A clean shutdown: the watchdog has nothing left to do."""
    if watchdog is not None and watchdog.poll() is None:
        watchdog.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(watchdog.wait, 5)
