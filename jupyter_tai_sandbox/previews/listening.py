"""A session's listening TCP ports, read from inside it with one bounded one-shot exec.

``cat /proc/net/tcp /proc/net/tcp6`` works in every image (busybox included) and, run in the session, reads
the session's own network namespace: network ``none`` included. A socket in state ``0A`` (LISTEN) is a
listener; its address is decoded (IPv4, IPv6, an IPv4-mapped IPv6 address shown as IPv4) and the list is
de-duplicated by port (one entry per port: the address the preview route reaches, 127.0.0.1, preferred).

A session of the ``local`` provider runs its commands on the server's own host, so its ``/proc/net/tcp``
lists the host's ports (the Jupyter server's own among them), not the session's: listing them is refused
with :class:`~jupyter_tai_sandbox.contract.SandboxUnsupportedError` (``operation: "ports"``) saying why.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..contract import ExecRequest, SandboxSession, SandboxUnsupportedError

__all__ = ["ListeningPort", "listening_ports", "parse_proc_net_tcp"]

#: the files read: IPv4 and IPv6 sockets of the session's network namespace
PROC_NET_FILES = ("/proc/net/tcp", "/proc/net/tcp6")
#: the read's deadline: `cat` of two kernel files returns at once
LIST_TIMEOUT_SECONDS = 10.0
#: most bytes of the read (about 150 bytes a socket: some 50,000 sockets)
LIST_OUTPUT_LIMIT = 8 << 20
_LISTEN = "0A"
#: providers whose commands run on the server's host (their /proc/net is the host's)
HOST_KINDS = frozenset({"local"})


@dataclass(frozen=True)
class ListeningPort:
    """A TCP port something listens on inside the session, and the address it is bound to."""

    port: int
    address: str

    def to_json(self) -> dict[str, object]:
        return {"port": self.port, "address": self.address}


def _address(text: str) -> str:
    """An address of /proc/net/tcp{,6}: hex of 32-bit words each in the kernel's (little-endian) order."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    if len(raw) != 16:
        raise ValueError(f"an address of {len(raw)} bytes")
    ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else str(ip)


def _preference(address: str) -> int:
    """Which address to keep for a port: the one the preview route dials (127.0.0.1) reaches first."""
    return {"0.0.0.0": 0, "127.0.0.1": 0, "::": 1}.get(address, 2)


def parse_proc_net_tcp(text: str) -> list[ListeningPort]:
    """The listening sockets of ``/proc/net/tcp`` and ``/proc/net/tcp6`` text (header lines, other states
    and malformed lines skipped), one per port, sorted by port."""
    best: dict[int, ListeningPort] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3].upper() != _LISTEN or not fields[0].endswith(":"):
            continue
        host, sep, port_hex = fields[1].rpartition(":")
        if not sep:
            continue
        try:
            port = int(port_hex, 16)
            address = _address(host)
        except ValueError:
            continue
        if not 0 < port < 65536:
            continue
        seen = best.get(port)
        if seen is None or _preference(address) < _preference(seen.address):
            best[port] = ListeningPort(port, address)
    return [best[port] for port in sorted(best)]


async def listening_ports(session: SandboxSession) -> list[ListeningPort]:
    """The session's listening TCP ports, read by one bounded exec in it; refused for a session whose
    provider runs commands on the server's host (its ports are the host's)."""
    kind = (await session.info()).kind
    if kind in HOST_KINDS:
        raise SandboxUnsupportedError(
            f"session {session.id} runs on the server's own host (the {kind} provider): its listening ports "
            "would be the host's, the Jupyter server's among them, so they are not listed",
            operation="ports",
        )
    result = await session.run(
        ExecRequest(
            argv=["cat", *PROC_NET_FILES],
            timeout_seconds=LIST_TIMEOUT_SECONDS,
            output_limit=LIST_OUTPUT_LIMIT,
        )
    )
    text = result.stdout.decode("ascii", errors="replace")
    if result.exit_code != 0 and "local_address" not in text:
        # neither file could be read (no /proc in the session): say so rather than answer "nothing listens"
        detail = result.stderr.decode(errors="replace").strip()[:200]
        raise SandboxUnsupportedError(
            f"session {session.id}'s listening ports could not be read ({' '.join(PROC_NET_FILES)}: "
            f"exit {result.exit_code}{': ' + detail if detail else ''})",
            operation="ports",
        )
    return parse_proc_net_tcp(text)
