"""Sockets made inside a container's network namespace by this process (root on the engine's host).

A socket belongs for life to the network namespace its maker was in when it made it. So a thread made
for one call enters the container's namespace (``setns``; a thread's namespace is its own, and this
one ends after), makes and connects its socket there, and hands it back to the event loop: the socket
then works from any thread, as if a process of the container had opened it. No engine call, no process
in the container, no relay on the path:

* :func:`agent_socket`: the session agent's own socket (its abstract name; the listener must be the
  container's PID 1);
* :func:`tcp_socket`: a TCP connection to a port as seen from inside the container (its loopback: network
  ``none`` included), for forwarded ports (a kernel's): the host then joins two sockets, and no byte of
  the connection passes through the agent.

Before entering, the process's cgroup must name the container (``cgroup_mark``, its id), once its
namespace is held open: a pid reused by another container's process is never entered.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: the agent's abstract socket (agent/main.go's socketName)
AGENT_SOCKET = "\0tai-agent"
_CLONE_NEWNET = 0x40000000
#: how long a direct connection waits for the agent of a container just started to listen
LISTEN_WAIT_SECONDS = 3.0


class NotReachableHere(OSError):
    """This process cannot enter the process's network namespace (not root, no setns, another host's
    process): the caller goes through the engine or the agent instead."""


def _enter(pid: int, cgroup_mark: str) -> None:
    """Move the calling thread into ``pid``'s network namespace, once ``cgroup_mark`` is in its cgroup."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        ns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NotReachableHere(e.errno, f"the session's network namespace: {e.strerror}") from None
    try:
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                cgroup = f.read()
        except OSError as e:
            raise NotReachableHere(e.errno, f"the session's cgroup: {e.strerror}") from None
        if cgroup_mark not in cgroup:
            raise NotReachableHere(0, f"process {pid} is not the session's (another host's, or it ended)")
        if libc.setns(ns, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NotReachableHere(err, f"setns: {os.strerror(err)}")
    finally:
        os.close(ns)


def _connect_agent(pid: int) -> socket.socket:
    give_up = time.monotonic() + LISTEN_WAIT_SECONDS
    while True:  # a container just started: its agent binds the name within milliseconds
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(AGENT_SOCKET)
            break
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() > give_up:
                raise
            time.sleep(0.002)
        except BaseException:
            sock.close()
            raise
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        listener, _, _ = struct.unpack("3i", creds)
        if listener != pid:  # only PID 1, the agent, may hold the name: the container ends with it
            raise ConnectionRefusedError(
                f"the socket's listener is process {listener}, not the agent ({pid})"
            )
        return sock
    except BaseException:
        sock.close()
        raise


def _connect_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(LISTEN_WAIT_SECONDS)  # a connect inside a container: refused or answered at once
        sock.connect((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    except BaseException:
        sock.close()
        raise


async def _in_namespace(pid: int, cgroup_mark: str, make: Callable[[], socket.socket]) -> socket.socket:
    """``make()`` run in a thread that entered ``pid``'s network namespace; its socket, non-blocking."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[socket.socket] = loop.create_future()

    def run() -> None:
        sock: socket.socket | None = None
        error: BaseException | None = None
        try:
            _enter(pid, cgroup_mark)
            sock = make()
        except BaseException as e:
            error = e

        def hand() -> None:  # on the loop: a caller that gave up meanwhile leaves the socket to be closed
            if done.done():
                if sock is not None:
                    sock.close()
            elif error is not None:
                done.set_exception(error)
            else:
                done.set_result(sock)  # type: ignore[arg-type]  # no error: make() returned the socket

        try:
            loop.call_soon_threadsafe(hand)
        except RuntimeError:  # the loop closed meanwhile
            if sock is not None:
                sock.close()

    threading.Thread(target=run, name="tai-netns", daemon=True).start()
    sock = await done
    sock.setblocking(False)
    return sock


async def agent_socket(pid: int, cgroup_mark: str) -> socket.socket:
    """A connection to the agent running as host process ``pid`` (its container's PID 1)."""
    return await _in_namespace(pid, cgroup_mark, lambda: _connect_agent(pid))


async def tcp_socket(pid: int, cgroup_mark: str, host: str, port: int) -> socket.socket:
    """A TCP connection to ``host:port`` as seen from inside ``pid``'s network namespace.
    ConnectionRefusedError when nothing listens there; NotReachableHere when the namespace cannot be entered."""
    return await _in_namespace(pid, cgroup_mark, lambda: _connect_tcp(host, port))


__all__ = ["AGENT_SOCKET", "LISTEN_WAIT_SECONDS", "NotReachableHere", "agent_socket", "tcp_socket"]
