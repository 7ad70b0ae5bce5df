"""Chromium in a network namespace of its own, so Docker's network churn cannot abort its requests.

Chromium watches the host's interfaces and, on any address change (every container start brings up a
veth with an IPv6 link-local address; every Docker network a bridge with an address), fails the requests
it has queued for a connection with ``net::ERR_NETWORK_CHANGED``. Beside parallel Docker tests, a
JupyterLab page load lost 70% of its requests that way (its theme among them). In a namespace with only
``lo``, chromium sees no change; each port it needs on the host's loopback (a lab's, a hub's) is carried
there by a small TCP forwarder whose listening socket lives in the namespace and whose upstream
connections live on the host.

Needs root and iproute2 (CI has both); elsewhere chromium runs on the host's network as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import socket
import subprocess
import threading
from pathlib import Path

from tests.support import PART, RUN_ID

CLONE_NEWNET = 0x40000000
#: every namespace this run makes starts with it (the whole-run check looks for leftovers)
NAME_PREFIX = f"tai-ui-{RUN_ID}"

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        source.close()  # each socket is closed by the one thread that reads it (it was left to the collector)


class BrowserNetwork:
    """One namespace (``lo`` only) for this process's chromium, with a forwarder per host port."""

    def __init__(self, root: Path, chromium: str) -> None:
        self.name = f"{NAME_PREFIX}-{PART}"[:40]
        self.listeners: dict[int, socket.socket] = {}
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        try:
            subprocess.run(
                ["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
                check=True,
                capture_output=True,
            )
            self.chromium = root / "chromium-in-netns"
            self.chromium.write_text(
                f'#!/bin/sh\nexec ip netns exec {self.name} {shlex.quote(chromium)} "$@"\n'
            )
            self.chromium.chmod(0o755)
        except BaseException:
            self.close()
            raise

    def forward(self, port: int) -> None:
        """Make ``127.0.0.1:port`` in the namespace reach ``127.0.0.1:port`` on the host (once per port)."""
        if port in self.listeners:
            return
        listener = self._listen_inside(port)
        self.listeners[port] = listener
        threading.Thread(target=self._accept, args=(listener, port), daemon=True).start()

    def _listen_inside(self, port: int) -> socket.socket:
        # setns moves only the calling thread: a short-lived thread enters, binds and leaves
        made: dict[str, object] = {}

        def bind() -> None:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            inside = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
            try:
                _setns(inside)
                listener = socket.socket()
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(("127.0.0.1", port))
                listener.listen(128)
                made["listener"] = listener
            except OSError as e:
                made["error"] = e
            finally:
                _setns(home)
                os.close(home)
                os.close(inside)

        thread = threading.Thread(target=bind)
        thread.start()
        thread.join()
        if "error" in made:
            raise made["error"]  # type: ignore[misc]
        return made["listener"]  # type: ignore[return-value]

    @staticmethod
    def _accept(listener: socket.socket, port: int) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", port))
            except OSError:
                client.close()  # nothing listens on the host (yet): the browser sees a refused connection
                continue
            threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()

    def close(self) -> None:
        for listener in self.listeners.values():
            with contextlib.suppress(OSError):
                listener.close()
        self.listeners.clear()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def available() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("ip") is not None


def leftover_namespaces() -> list[str]:
    """This run's browser namespaces that still exist (each is removed with its browser)."""
    listed = (
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout if available() else ""
    )
    return [f"netns {line.split()[0]}" for line in listed.splitlines() if line.startswith(NAME_PREFIX)]


#: the namespace of this process's current browser (None: chromium is on the host's network)
current: BrowserNetwork | None = None


def forward(port: int) -> None:
    """Let this process's browser reach ``port`` on the host's loopback (nothing to do without a namespace)."""
    if current is not None:
        current.forward(port)
