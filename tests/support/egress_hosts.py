"""The egress gateway's red-team hosts (issue 52 point 5): an offline internet of the tests' own, in network
namespaces this module makes, with its own names, subnets and certificate authority.

Four namespaces, one per role, each reached from the host through a veth pair with a /30 of
198.18.0.0/15 (the benchmarking range: never a real host's) and a host route (the veth's connected route);
Docker's containers reach them as any routed address (a session on plain egress directly, the gateway
container through its egress bridge):

* **dns**: the resolver the gateway is configured with (``DockerSandbox.egress_resolver``): authoritative
  for the test zones (``allowed.test``, ``other.test``) and recursive for ``attacker.test``, which it
  delegates to the attacker's name server (every query for a name under it is asked there); it logs every
  query it gets;
* **attacker**: the attacker's name server, authoritative for ``attacker.test``: it LOGS every query that
  reaches it (the DNS exfiltration check counts them) and answers every A query with the web address;
* **web**: one address for several virtual hosts (``www.allowed.test``, ``api.allowed.test`` and the
  unlisted ``other.test`` all resolve to it): HTTPS on 443 with a leaf of the tests' CA for every test
  name, picked by SNI, echoing the request (SNI, Host, path, query, headers, body) as JSON and logging it
  (``/digest``: the same with each value replaced by its SHA-256, so a session can check a secret arrived
  without receiving it); plain HTTP on 80 alike; ``/bytes/N`` streams N bytes (the benchmark's download);
  a UDP listener on 443 and a raw ICMP socket that log every datagram / echo request; a TCP echo on
  :data:`TCP_ECHO_PORT`;
* **model**: the tests' model endpoint (``tests/support/fake_model.py``: an Anthropic-compatible Messages
  API the test scripts) on HTTPS 443 at :data:`MODEL_HOST` (its own address), with the same leaf; a coding
  agent in a session reaches it by name through the gateway, its key a secret of the gateway
  (:attr:`EgressHosts.model`: the test's handle, which writes the script and reads the requests).

The servers are this file run as a script inside each namespace (``ip netns exec NAME python3
egress_hosts.py serve ROLE CONFIG``, standard library only, threads); the fixture :func:`egress_hosts`
starts them, checks from the host that each answers (a name resolved, a query of the attacker's zone
logged by the attacker, an HTTPS request verified with the tests' CA, an ICMP echo and a datagram
logged), and
removes everything (processes, namespaces, veths and their routes) when the tests end, failed or not.
It needs root and iproute2: outside CI it skips saying so; under ``CI=true`` it fails without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

try:
    from tests.support import fake_model
except ImportError:  # run as a script (a namespace's server) or loaded from its file (the benchmark)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fake_model  # type: ignore[no-redef]

#: the names of the tests' zones (every one resolves to the web address unless said otherwise)
ALLOWED = "www.allowed.test"  # a listed host: pass-through TLS, never a secret's host
SECRET_HOST = "api.allowed.test"  # a secret's host: the gateway terminates TLS toward it
PLAIN = "plain.allowed.test"  # plain HTTP on 80
ECHO = "echo.allowed.test"  # the raw TCP echo on TCP_ECHO_PORT
UNLISTED = "other.test"  # never listed: shares the web address with the allowed names
UNLISTED_WWW = "www.other.test"
CNAME_TO_ALLOWED = "cname.other.test"  # an unlisted name whose CNAME is ALLOWED
ATTACKER_ZONE = "attacker.test"  # delegated to the attacker's name server, which logs every query
MODEL_HOST = "api.model.test"  # the model endpoint (its own namespace and address)
#: every name in the tests' leaf certificate
CERT_NAMES = (
    "allowed.test",
    "*.allowed.test",
    UNLISTED,
    "*.other.test",
    ATTACKER_ZONE,
    f"*.{ATTACKER_ZONE}",
    "model.test",
    "*.model.test",
)
TCP_ECHO_PORT = 7000
ROLES = ("dns", "attacker", "web", "model")
#: where the namespaces' /30s come from
TEST_RANGE = ipaddress.ip_network("198.18.0.0/15")

# ---------------------------------------------------------------------------------------------- DNS codec

QTYPES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 15: "MX", 16: "TXT", 28: "AAAA", 255: "ANY"}
TYPE_CODES = {name: code for code, name in QTYPES.items()}
NOERROR, NXDOMAIN, REFUSED = 0, 3, 5


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        if label:
            raw = label.encode("ascii")
            out += bytes([len(raw)]) + raw
    return out + b"\x00"


def decode_name(message: bytes, offset: int) -> tuple[str, int]:
    """The name at ``offset`` (compression pointers followed) and the offset after it."""
    labels: list[str] = []
    end = None
    for _ in range(128):  # a loop of pointers ends here
        length = message[offset]
        if length & 0xC0 == 0xC0:
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | message[offset + 1]
            continue
        if length == 0:
            return ".".join(labels), (end if end is not None else offset + 1)
        labels.append(message[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    raise ValueError("a DNS name with too many labels or a pointer loop")


@dataclass
class Record:
    name: str
    type: str
    value: str  # A/AAAA: the address; NS/CNAME: a name; TXT: the text
    ttl: int = 5

    def encode(self) -> bytes:
        if self.type == "A":
            data = socket.inet_aton(self.value)
        elif self.type == "AAAA":
            data = socket.inet_pton(socket.AF_INET6, self.value)
        elif self.type in ("NS", "CNAME"):
            data = encode_name(self.value)
        elif self.type == "TXT":
            raw = self.value.encode()[:255]
            data = bytes([len(raw)]) + raw
        else:
            raise ValueError(f"no encoding for {self.type}")
        return (
            encode_name(self.name)
            + struct.pack("!HHIH", TYPE_CODES[self.type], 1, self.ttl, len(data))
            + data
        )


@dataclass
class Message:
    id: int
    flags: int
    questions: list[tuple[str, int]] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)  # Record (built) or parsed dicts
    authority: list[Any] = field(default_factory=list)
    additional: list[Any] = field(default_factory=list)

    @property
    def rcode(self) -> int:
        return self.flags & 0x000F

    @classmethod
    def parse(cls, data: bytes) -> Message:
        ident, flags, qd, an, ns, ar = struct.unpack("!6H", data[:12])
        message = cls(ident, flags)
        offset = 12
        for _ in range(qd):
            name, offset = decode_name(data, offset)
            qtype, _qclass = struct.unpack("!HH", data[offset : offset + 4])
            offset += 4
            message.questions.append((name, qtype))
        for section, count in ((message.answers, an), (message.authority, ns), (message.additional, ar)):
            for _ in range(count):
                name, offset = decode_name(data, offset)
                rtype, _rclass, ttl, length = struct.unpack("!HHIH", data[offset : offset + 10])
                offset += 10
                rdata = data[offset : offset + length]
                value: str = rdata.hex()
                if rtype == 1 and length == 4:
                    value = socket.inet_ntoa(rdata)
                elif rtype == 28 and length == 16:
                    value = socket.inet_ntop(socket.AF_INET6, rdata)
                elif rtype in (2, 5):
                    value = decode_name(data, offset)[0]
                elif rtype == 16 and length:
                    value = rdata[1 : 1 + rdata[0]].decode(errors="replace")
                section.append(
                    {"name": name, "type": QTYPES.get(rtype, str(rtype)), "ttl": ttl, "value": value}
                )
                offset += length
        return message

    def encode(self) -> bytes:
        head = struct.pack(
            "!6H",
            self.id,
            self.flags,
            len(self.questions),
            len(self.answers),
            len(self.authority),
            len(self.additional),
        )
        body = b"".join(encode_name(n) + struct.pack("!HH", t, 1) for n, t in self.questions)
        for section in (self.answers, self.authority, self.additional):
            body += b"".join(r.encode() for r in section)
        return head + body


def query(name: str, qtype: str = "A", ident: int | None = None, recurse: bool = True) -> bytes:
    """A query for ``name`` (RD set unless ``recurse`` is False)."""
    ident = random.randrange(1 << 16) if ident is None else ident
    return Message(ident, 0x0100 if recurse else 0, [(name, TYPE_CODES[qtype])]).encode()


def ask(server: str, name: str, qtype: str = "A", timeout: float = 2.0, port: int = 53) -> Message:
    """``name``'s answer from ``server`` over UDP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(query(name, qtype), (server, port))
        return Message.parse(sock.recv(4096))


# ----------------------------------------------------------------------------- the servers (in a namespace)


class JsonLog:
    """Lines of JSON appended to a file, one writer lock per process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def write(self, **record: Any) -> None:
        record.setdefault("time", time.time())
        with self.lock, open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def read_log(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class DnsServer:
    """UDP and TCP 53 on ``address``; ``answer(message, client) -> Message``; every query logged."""

    def __init__(self, address: str, log: JsonLog, answer) -> None:
        self.address, self.log, self.answer = address, log, answer

    def handle(self, data: bytes, client: str, proto: str) -> bytes | None:
        try:
            message = Message.parse(data)
        except Exception:
            self.log.write(client=client, proto=proto, malformed=data.hex())
            return None
        for name, qtype in message.questions:
            self.log.write(client=client, proto=proto, name=name.lower(), type=QTYPES.get(qtype, str(qtype)))
        return self.answer(message, client).encode()

    def serve(self) -> None:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((self.address, 53))
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((self.address, 53))
        tcp.listen(64)

        def udp_loop() -> None:
            while True:
                data, peer = udp.recvfrom(4096)
                threading.Thread(target=udp_one, args=(data, peer), daemon=True).start()

        def udp_one(data: bytes, peer: tuple[str, int]) -> None:
            reply = self.handle(data, peer[0], "udp")
            if reply is not None:
                udp.sendto(reply[:512] if len(reply) > 512 else reply, peer)

        def tcp_loop() -> None:
            while True:
                conn, peer = tcp.accept()
                threading.Thread(target=tcp_one, args=(conn, peer), daemon=True).start()

        def tcp_one(conn: socket.socket, peer: tuple[str, int]) -> None:
            with conn:
                conn.settimeout(10)
                with contextlib.suppress(OSError, struct.error):
                    while head := recv_exact(conn, 2):
                        (length,) = struct.unpack("!H", head)
                        reply = self.handle(recv_exact(conn, length), peer[0], "tcp")
                        if reply is None:
                            return
                        conn.sendall(struct.pack("!H", len(reply)) + reply)

        threading.Thread(target=udp_loop, daemon=True).start()
        threading.Thread(target=tcp_loop, daemon=True).start()


def recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def zone_records(config: dict[str, Any]) -> dict[str, list[Record]]:
    """The resolver's own zones: every test name, the CNAME, and the attacker zone's delegation."""
    web, attacker = config["addresses"]["web"], config["addresses"]["attacker_link"]
    records: dict[str, list[Record]] = {}
    for name in ("allowed.test", ALLOWED, SECRET_HOST, PLAIN, ECHO, UNLISTED, UNLISTED_WWW):
        records[name] = [Record(name, "A", web)]
    records[CNAME_TO_ALLOWED] = [Record(CNAME_TO_ALLOWED, "CNAME", ALLOWED)]
    records[MODEL_HOST] = [Record(MODEL_HOST, "A", config["addresses"]["model"])]
    records[f"ns.{ATTACKER_ZONE}"] = [Record(f"ns.{ATTACKER_ZONE}", "A", attacker)]  # the glue
    return records


def serve_dns(config: dict[str, Any]) -> None:
    """The tests' resolver: authoritative for the test zones, recursive (through the delegation to the
    attacker's name server) for ``attacker.test``, NXDOMAIN for every other name."""
    records = zone_records(config)
    attacker = config["addresses"]["attacker_link"]

    def answer(message: Message, client: str) -> Message:
        reply = Message(message.id, 0x8000 | (message.flags & 0x0100) | 0x0080, list(message.questions))
        if not message.questions:
            reply.flags |= 1  # FORMERR
            return reply
        name, qtype = message.questions[0]
        name = name.lower().rstrip(".")
        if (name == ATTACKER_ZONE or name.endswith(f".{ATTACKER_ZONE}")) and name != f"ns.{ATTACKER_ZONE}":
            # the delegation, followed: the attacker's server is asked (and logs it)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
                upstream.settimeout(2)
                upstream.sendto(query(name, QTYPES.get(qtype, "A"), recurse=False), (attacker, 53))
                got = Message.parse(upstream.recv(4096))
            reply.flags |= got.rcode
            reply.answers = [Record(a["name"], a["type"], a["value"], a["ttl"]) for a in got.answers]
            return reply
        reply.flags |= 0x0400  # authoritative
        chain: list[Record] = []
        current = name
        for _ in range(8):
            found = records.get(current)
            if not found:
                break
            cname = [r for r in found if r.type == "CNAME"]
            if cname and qtype != TYPE_CODES["CNAME"]:
                chain += cname
                current = cname[0].value
                continue
            chain += [r for r in found if r.type == QTYPES.get(qtype) or qtype == 255]
            break
        if name not in records:
            reply.flags |= NXDOMAIN
        reply.answers = chain
        return reply

    DnsServer(config["addresses"]["dns"], JsonLog(config["logs"]["dns"]), answer).serve()


def serve_attacker(config: dict[str, Any]) -> None:
    """The attacker's name server: logs every query (the resolver's log has them too) and answers A with
    the web address, TXT with a word."""
    web = config["addresses"]["web"]

    def answer(message: Message, client: str) -> Message:
        reply = Message(message.id, 0x8000 | 0x0400, list(message.questions))
        for name, qtype in message.questions[:1]:
            if qtype == 1:
                reply.answers = [Record(name, "A", web)]
            elif qtype == 16:
                reply.answers = [Record(name, "TXT", "attacker-was-asked")]
        return reply

    DnsServer("0.0.0.0", JsonLog(config["logs"]["attacker"]), answer).serve()  # both of its links


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


PATTERN = bytes(range(256)) * 4096  # 1 MiB a /bytes response is cut from


class EchoHandler(BaseHTTPRequestHandler):
    """Answers every request with JSON naming what arrived (``/bytes/N``: N bytes)."""

    protocol_version = "HTTP/1.1"
    #: TCP_NODELAY: the head and the body go out at once (with Nagle, the body's small second write waits
    #: for the head's ACK, which a client's delayed ACK holds for 40 ms: a proxy that waits for the body
    #: before it answers its own client would look 40 ms slower than it is)
    disable_nagle_algorithm = True
    server: EchoServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self) -> None:
        body = self.read_body()
        sni = getattr(self.request, "tai_sni", None)
        parts = urlsplit(self.path)
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0] if self.headers.get("Host") else ""
        seen = {
            "scheme": self.server.scheme,
            "client": self.client_address[0],
            "sni": sni,
            "host": host,
            "vhost": (sni or host or "").lower(),
            "method": self.command,
            "path": parts.path,
            "query": parts.query,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body": body.decode(errors="replace"),
        }
        self.server.log.write(**{**seen, "body": seen["body"][:4096]}, body_size=len(body))
        if parts.path == "/digest":
            # what arrived, each value as its SHA-256: a client learns whether a secret arrived, never the
            # secret (the red-team's scan of the session finds no copy the answer brought back)
            seen = {
                **seen,
                "headers": [[k, sha256(v)] for k, v in self.headers.items()],
                "query": sha256(parts.query),
                "body": sha256(seen["body"]),
            }
        elif parts.path.startswith("/bytes/"):
            size = int(parts.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            view = memoryview(PATTERN)
            left = size
            while left > 0:
                chunk = view[: min(left, len(PATTERN))]
                self.wfile.write(chunk)
                left -= len(chunk)
            return
        payload = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer


class EchoServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], scheme: str, log: JsonLog, tls: ssl.SSLContext | None):
        self.scheme, self.log, self.tls = scheme, log, tls
        super().__init__(address, EchoHandler)

    def finish_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if self.tls is not None:
            request.settimeout(15)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError) as e:
                self.log.write(client=client_address[0], scheme="https", handshake_failed=str(e)[:200])
                return
            request.settimeout(None)
        super().finish_request(request, client_address)


def serve_web(config: dict[str, Any]) -> None:
    """HTTPS (443) and HTTP (80) echo servers, the UDP 443 and ICMP loggers, the TCP echo."""
    address = config["addresses"]["web"]
    logs = config["logs"]
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(config["leaf"], config["leaf_key"])
    tls.set_alpn_protocols(["http/1.1"])

    def sni(sock: Any, name: str | None, _context: Any) -> None:
        sock.tai_sni = name

    tls.sni_callback = sni
    for port, scheme, context in ((443, "https", tls), (80, "http", None)):
        server = EchoServer((address, port), scheme, JsonLog(logs["http"]), context)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    udp_log = JsonLog(logs["udp"])
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, 443))

    def udp_loop() -> None:
        while True:
            data, peer = udp.recvfrom(65535)
            udp_log.write(client=peer[0], size=len(data), head=data[:64].hex())

    icmp_log = JsonLog(logs["icmp"])
    icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)

    def icmp_loop() -> None:
        while True:
            packet, peer = icmp.recvfrom(65535)
            header = (packet[0] & 0x0F) * 4
            if packet[header] == 8:  # echo request
                icmp_log.write(client=peer[0], size=len(packet))

    tcp_log = JsonLog(logs["tcp"])
    echo = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    echo.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    echo.bind((address, TCP_ECHO_PORT))
    echo.listen(64)

    def echo_loop() -> None:
        while True:
            conn, peer = echo.accept()
            tcp_log.write(client=peer[0], port=TCP_ECHO_PORT)
            threading.Thread(target=echo_one, args=(conn,), daemon=True).start()

    def echo_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            while data := conn.recv(65536):
                conn.sendall(data)

    for loop in (udp_loop, icmp_loop, echo_loop):
        threading.Thread(target=loop, daemon=True).start()


def serve_model(config: dict[str, Any]) -> None:
    """The model endpoint (fake_model.py, this file's neighbour) on HTTPS 443 of the model's address."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(config["leaf"], config["leaf_key"])
    tls.set_alpn_protocols(["http/1.1"])
    fake_model.serve(config["addresses"]["model"], 443, config["model_script"], config["logs"]["model"], tls)


def serve(role: str, config_path: str) -> None:
    parent = os.getppid()  # `ip netns exec` execs this script: the parent is the process that started it
    config = json.loads(Path(config_path).read_text())
    {"dns": serve_dns, "attacker": serve_attacker, "web": serve_web, "model": serve_model}[role](config)
    print("ready", flush=True)
    while os.getppid() == parent:  # the parent gone (killed before its cleanup): end with it
        time.sleep(1)


# --------------------------------------------------------------------------------------- the tests' CA


def make_certificates(root: Path, names: tuple[str, ...], ip: str) -> dict[str, Path]:
    """A CA of the tests' own and a leaf for ``names`` (and ``ip``) signed by it, as PEM files in ``root``:
    with the ``cryptography`` package when it is installed, else with the openssl CLI."""
    paths = {k: root / f"{k}.pem" for k in ("ca", "ca_key", "leaf", "leaf_key")}
    try:
        _certificates_cryptography(paths, names, ip)
    except ImportError:
        _certificates_openssl(root, paths, names, ip)
    for key in ("ca_key", "leaf_key"):
        paths[key].chmod(0o600)
    return paths


def _certificates_cryptography(paths: dict[str, Path], names: tuple[str, ...], ip: str) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jupyter-tai-sandbox red-team test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(ip))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    plain = serialization.NoEncryption()
    pkcs8 = serialization.PrivateFormat.PKCS8
    paths["ca"].write_bytes(ca.public_bytes(pem))
    paths["ca_key"].write_bytes(ca_key.private_bytes(pem, pkcs8, plain))
    paths["leaf"].write_bytes(leaf.public_bytes(pem))
    paths["leaf_key"].write_bytes(leaf_key.private_bytes(pem, pkcs8, plain))


def _certificates_openssl(root: Path, paths: dict[str, Path], names: tuple[str, ...], ip: str) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=root)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl(
        "req", "-x509", *ec, "-keyout", str(paths["ca_key"]), "-out", str(paths["ca"]), "-days", "2",
        "-subj", "/CN=jupyter-tai-sandbox red-team test CA",
        "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    csr = root / "leaf.csr"
    openssl(
        "req", "-new", *ec, "-keyout", str(paths["leaf_key"]), "-out", str(csr), "-subj", f"/CN={names[0]}"
    )
    extensions = root / "leaf.ext"
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join([f'DNS:{n}' for n in names] + [f'IP:{ip}'])}\n"
    )
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(paths["ca"]), "-CAkey", str(paths["ca_key"]),
        "-CAcreateserial", "-days", "2", "-sha256", "-extfile", str(extensions), "-out", str(paths["leaf"]),
    )  # fmt: skip


# ------------------------------------------------------------------------------ the namespaces (host side)


@dataclass
class EgressHosts:
    """The running test hosts: their addresses, the CA that signed their certificates, and their logs."""

    root: Path
    addresses: dict[str, str]  # role -> the address in its namespace
    namespaces: dict[str, str]  # role -> namespace name
    ca: Path  # the tests' CA (PEM): DockerSandbox.egress_upstream_ca
    logs: dict[str, Path]

    @property
    def web(self) -> str:
        return self.addresses["web"]

    @property
    def resolver(self) -> str:
        """``host:port`` of the tests' resolver: DockerSandbox.egress_resolver."""
        return f"{self.addresses['dns']}:53"

    def attacker_queries(self) -> list[dict[str, Any]]:
        """Every query that reached the attacker's name server, in order."""
        return read_log(self.logs["attacker"])

    def resolver_queries(self) -> list[dict[str, Any]]:
        """Every query that reached the tests' resolver (the gateway's upstream), in order."""
        return read_log(self.logs["dns"])

    def http_requests(self) -> list[dict[str, Any]]:
        """Every HTTP(S) request the web host answered (and every failed TLS handshake), in order."""
        return read_log(self.logs["http"])

    def udp_datagrams(self) -> list[dict[str, Any]]:
        return read_log(self.logs["udp"])

    def icmp_echoes(self) -> list[dict[str, Any]]:
        return read_log(self.logs["icmp"])

    def tcp_connections(self) -> list[dict[str, Any]]:
        return read_log(self.logs["tcp"])

    @property
    def model(self) -> fake_model.FakeModel:
        """The model endpoint's handle: its script (written by the test) and its requests (logged)."""
        return fake_model.FakeModel(
            self.root / "model-script.json", self.logs["model"], f"https://{MODEL_HOST}"
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting only the tests' CA."""
        context = ssl.create_default_context(cafile=str(self.ca))
        return context

    def https(self, name: str, path: str = "/echo", timeout: float = 5.0) -> dict[str, Any]:
        """GET ``https://name/path`` straight to the web address (from the host), verified with the CA."""
        request = f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode()
        with (
            socket.create_connection((self.web, 443), timeout=timeout) as raw,
            self.ssl_context().wrap_socket(raw, server_hostname=name) as tls,
        ):
            tls.sendall(request)
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise AssertionError(f"https://{name}{path}: {head[:200]!r}")
        return json.loads(body)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _free_block(tag: str) -> ipaddress.IPv4Network:
    """A /24 of the test range no route of the host's uses (picked by ``tag``, then the next free one)."""
    used = [
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines()
        if line and line.split()[0][0].isdigit()
    ]
    blocks = list(TEST_RANGE.subnets(new_prefix=24))
    start = int(hashlib.sha256(tag.encode()).hexdigest(), 16) % len(blocks)
    for i in range(len(blocks)):
        block = blocks[(start + i) % len(blocks)]
        if not any(block.overlaps(u) for u in used if u.prefixlen > 0):
            return block
    raise RuntimeError(f"no free /24 left in {TEST_RANGE} for the red-team hosts")


NAME_PREFIX = "tai-egress-"


def leftover_namespaces() -> list[str]:
    """Red-team namespaces that still exist (each is removed when its fixture ends)."""
    if shutil.which("ip") is None:
        return []
    listed = _ip("netns", "list", check=False).stdout
    return [f"netns {line.split()[0]}" for line in listed.splitlines() if line.startswith(NAME_PREFIX)]


def _remove_namespace(name: str, host_veth: str) -> None:
    _ip("link", "del", host_veth, check=False)
    _ip("netns", "del", name, check=False)


def sweep_orphans() -> list[str]:
    """Remove the namespaces (and their veths) of test hosts whose process is gone (killed before its
    cleanup ran): their names carry the pid that made them. The names removed."""
    removed = []
    for entry in leftover_namespaces():
        name = entry.split()[1]
        parts = name.removeprefix(NAME_PREFIX).split("-")  # pid, digest, role
        if len(parts) != 3 or not parts[0].isdigit() or Path(f"/proc/{parts[0]}").exists():
            continue
        _pid, digest, role = parts
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGTERM)  # a server of ours its parent's death missed
        _remove_namespace(name, f"te{digest}{role[:1]}h")
        for root in Path(tempfile.gettempdir()).glob(f"tai-egress-hosts-{digest}-*"):
            shutil.rmtree(root, ignore_errors=True)
        removed.append(name)
    return removed


@contextlib.contextmanager
def running_hosts(tag: str) -> Iterator[EgressHosts]:
    """Start the three hosts (namespaces named after ``tag``) and remove them afterwards, whatever happens.

    The host forwards nothing between the namespaces (Docker's FORWARD policy is DROP, and the tests leave
    the host's firewall alone): the resolver reaches the attacker's name server over a veth pair of their
    own, as if across the internet."""
    sweep_orphans()
    digest = hashlib.sha256(tag.encode()).hexdigest()[:7]
    block = _free_block(tag)
    subnets = list(block.subnets(new_prefix=30))
    root = Path(tempfile.mkdtemp(prefix=f"tai-egress-hosts-{digest}-"))
    processes: list[subprocess.Popen[str]] = []
    made: list[tuple[str, str]] = []
    try:
        addresses, namespaces = {}, {}
        for i, role in enumerate(ROLES):
            outside, inside = str(subnets[i][1]), str(subnets[i][2])
            name = f"{NAME_PREFIX}{os.getpid()}-{digest}-{role}"  # the pid: sweep_orphans
            host_veth, ns_veth = f"te{digest}{role[0]}h", f"te{digest}{role[0]}n"
            _remove_namespace(name, host_veth)  # a killed earlier run's, of the same tag
            _ip("netns", "add", name)
            made.append((name, host_veth))
            _ip("link", "add", host_veth, "type", "veth", "peer", "name", ns_veth)
            _ip("link", "set", ns_veth, "netns", name)
            _ip("addr", "add", f"{outside}/30", "dev", host_veth)
            _ip("link", "set", host_veth, "up")
            for command in (
                ("addr", "add", f"{inside}/30", "dev", ns_veth),
                ("link", "set", ns_veth, "up"),
                ("link", "set", "lo", "up"),
                ("route", "add", "default", "via", outside),
            ):
                _ip("netns", "exec", name, "ip", *command)
            addresses[role], namespaces[role] = inside, name
        # the resolver's own link to the attacker's name server
        link = subnets[len(ROLES)]
        near, far = f"te{digest}da", f"te{digest}ad"
        _ip("link", "add", near, "netns", namespaces["dns"], "type", "veth", "peer", "name", far, "netns",
            namespaces["attacker"])  # fmt: skip
        for role, dev, address in (("dns", near, link[1]), ("attacker", far, link[2])):
            _ip("netns", "exec", namespaces[role], "ip", "addr", "add", f"{address}/30", "dev", dev)
            _ip("netns", "exec", namespaces[role], "ip", "link", "set", dev, "up")
        addresses["attacker_link"] = str(link[2])
        paths = make_certificates(root, CERT_NAMES, addresses["web"])
        logs = {k: root / f"{k}.jsonl" for k in ("dns", "attacker", "http", "udp", "icmp", "tcp", "model")}
        config = {
            "addresses": addresses,
            "logs": {k: str(v) for k, v in logs.items()},
            "model_script": str(root / "model-script.json"),
            "leaf": str(paths["leaf"]),
            "leaf_key": str(paths["leaf_key"]),
        }
        (root / "config.json").write_text(json.dumps(config))
        for role in ROLES:
            with open(root / f"{role}.stderr", "w") as stderr:
                process = subprocess.Popen(
                    [
                        "ip", "netns", "exec", namespaces[role],
                        sys.executable, "-u", __file__, "serve", role, str(root / "config.json"),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )  # fmt: skip
            processes.append(process)
        for role, process in zip(ROLES, processes, strict=True):
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(
                    f"the {role} test host did not start: {(root / f'{role}.stderr').read_text()[-2000:]}"
                )
        yield EgressHosts(root, addresses, namespaces, paths["ca"], logs)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
            if process.stdout is not None:
                process.stdout.close()
        for name, host_veth in made:
            _remove_namespace(name, host_veth)
        shutil.rmtree(root, ignore_errors=True)


def check_hosts(hosts: EgressHosts) -> None:
    """From the host: each test host answers as the suite expects, and each logger logs (so a count of 0
    in a test means nothing arrived, not that nothing was listening)."""
    got = ask(hosts.addresses["dns"], ALLOWED)
    assert [a["value"] for a in got.answers] == [hosts.web], got
    assert ask(hosts.addresses["dns"], "nowhere.test").rcode == NXDOMAIN
    cname = ask(hosts.addresses["dns"], CNAME_TO_ALLOWED)
    assert [a["type"] for a in cname.answers] == ["CNAME", "A"], cname
    probe = f"probe-{random.randrange(1 << 30):x}.{ATTACKER_ZONE}"
    assert [a["value"] for a in ask(hosts.addresses["dns"], probe).answers] == [hosts.web]
    assert any(q.get("name") == probe for q in hosts.attacker_queries()), "the delegation is not followed"
    for name in (ALLOWED, UNLISTED):
        assert hosts.https(name)["vhost"] == name
    model = ask(hosts.addresses["dns"], MODEL_HOST)
    assert [a["value"] for a in model.answers] == [hosts.addresses["model"]], model
    check_model(hosts)
    with socket.create_connection((hosts.web, TCP_ECHO_PORT), timeout=3) as echo:
        echo.sendall(b"ping")
        assert echo.recv(16) == b"ping"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"probe", (hosts.web, 443))
    icmp_echo(hosts.web)
    deadline = time.monotonic() + 3
    while not (hosts.udp_datagrams() and hosts.icmp_echoes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hosts.udp_datagrams(), "the UDP 443 logger logged nothing"
    assert hosts.icmp_echoes(), "the ICMP logger logged nothing"


def check_model(hosts: EgressHosts) -> None:
    """From the host: the model endpoint answers a token count over HTTPS (verified with the tests' CA) and
    logs the request with its key."""
    key = f"probe-{random.randrange(1 << 30):x}"
    body = b'{"model": "probe", "messages": [{"role": "user", "content": "hi"}]}'
    request = (
        f"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: {MODEL_HOST}\r\nx-api-key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with (
        socket.create_connection((hosts.addresses["model"], 443), timeout=5) as raw,
        hosts.ssl_context().wrap_socket(raw, server_hostname=MODEL_HOST) as tls,
    ):
        tls.sendall(request)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert key in hosts.model.api_keys(), "the model endpoint did not log the request"


def icmp_echo(address: str, timeout: float = 2.0) -> bool:
    """Send one ICMP echo request to ``address`` (a raw socket: root) and whether a reply came."""
    request = struct.pack("!BBHHH", 8, 0, 0, os.getpid() & 0xFFFF, 1) + b"tai-egress-probe"
    total = sum(struct.unpack(f"!{len(request) // 2}H", request))
    total = (total >> 16) + (total & 0xFFFF)
    checksum = ~(total + (total >> 16)) & 0xFFFF
    request = request[:2] + struct.pack("!H", checksum) + request[4:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        sock.settimeout(timeout)
        sock.sendto(request, (address, 0))
        with contextlib.suppress(TimeoutError):
            while True:
                packet, peer = sock.recvfrom(65535)
                if peer[0] == address and packet[(packet[0] & 0x0F) * 4] == 0:
                    return True
    return False


def unavailable() -> str | None:
    """Why the test hosts cannot be made here (None: they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the egress red-team hosts need root (network namespaces, veths, routes)"
    if shutil.which("ip") is None:
        return "the egress red-team hosts need iproute2's `ip` tool"
    return None


def _fixture() -> Iterator[EgressHosts]:
    import pytest

    from tests.support import PART, RUN_ID
    from tests.support.docker import in_ci

    why = unavailable()
    if why is not None:
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    with running_hosts(f"{RUN_ID}-{PART}-{os.getpid()}") as hosts:
        check_hosts(hosts)
        yield hosts


def _make_fixture():  # the servers' script and the benchmark do without pytest
    try:
        import pytest
    except ImportError:
        return None
    return pytest.fixture(scope="session", name="egress_hosts")(_fixture)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: {sys.argv[0]} serve ROLE CONFIG")
else:
    egress_hosts = _make_fixture()
