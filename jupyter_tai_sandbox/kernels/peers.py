"""Who dialled a kernel's forwarded port: only the server's own user may.

A kernel's ports are forwarded on 127.0.0.1, where any local account can connect; TCP has no peer
credentials (``SO_PEERCRED`` is for unix sockets), but Linux lists every TCP socket with its owner's uid in
``/proc/net/tcp`` and ``tcp6``. The client side of an accepted loopback connection is the socket whose local
address is the accepted one's peer and whose remote address is our listener: its uid says who dialled. The
server's kernel clients run in the server's process, so a connection of another uid is refused at once
(issue 50, finding 2: 80 held connections of another account locked the owner out of her kernel).

The same table names the client socket's inode, so :func:`dialled_from_here` also tells whether the dialler is
this very process (the server's own kernel clients: jupyter_server's, or the manager's in nbclient and
``jupyter console``), by finding ``socket:[inode]`` among its own descriptors. Another process of the same
user (``jupyter console --existing``, or a flood) is admitted but not one of the server's own: the
forwarders keep connection slots for the server's own and close the others' connections when idle. That is
all TCP tells: which process of the same user dialled cannot be told apart further (no peer pid on TCP).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys

#: the kernel's socket tables, by address family
_TABLES = {socket.AF_INET: "/proc/net/tcp", socket.AF_INET6: "/proc/net/tcp6"}


def _proc_address(host: str, port: int) -> str:
    """``host:port`` as /proc/net/tcp writes it: each 32-bit word of the address as the host's integer, hex."""
    packed = ipaddress.ip_address(host.split("%", 1)[0]).packed
    words = "".join(
        f"{int.from_bytes(packed[i : i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4)
    )
    return f"{words}:{port:04X}"


def peer_uid(connection: socket.socket) -> int | None:
    """The uid owning the other end of an accepted loopback TCP ``connection``; None when it cannot be told
    (not loopback, not Linux, the client already gone)."""
    found = _peer(connection)
    return None if found is None else found[0]


def _peer(connection: socket.socket) -> tuple[int, int] | None:
    """The other end's socket of an accepted loopback TCP ``connection``: (its owner's uid, its inode)."""
    family = connection.family
    table = _TABLES.get(family)
    if table is None:
        return None
    try:
        peer_host, peer_port = connection.getpeername()[:2]
        here_host, here_port = connection.getsockname()[:2]
    except OSError:
        return None
    if not ipaddress.ip_address(peer_host.split("%", 1)[0]).is_loopback:
        return None
    local = _proc_address(peer_host, peer_port)
    remote = _proc_address(here_host, here_port)
    try:
        with open(table) as lines:
            next(lines, None)
            for line in lines:
                fields = line.split()
                if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                    return int(fields[7]), int(fields[9])
    except OSError:
        return None
    return None


def admitted(connection: socket.socket) -> bool:
    """Whether the server's own user dialled ``connection`` (an unknown dialler is refused)."""
    return peer_uid(connection) == os.getuid()


def dialled_from_here(connection: socket.socket) -> bool:
    """Whether the other end of an accepted loopback TCP ``connection`` is a socket of this process (False when
    it cannot be told)."""
    found = _peer(connection)
    if found is None or found[1] == 0:
        return False
    wanted = f"socket:[{found[1]}]"
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return False
    for fd in descriptors:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == wanted:
                return True
        except OSError:
            continue
    return False
