"""The docker provider's egress gateway (issue 52): what it costs against plain egress, in the same run.

    sudo python benchmarks/egress_gateway.py [--quick] [--sessions 100] [--json FILE]

Needs root and iproute2 (the upstream is the red-team suite's offline test hosts, tests/support/egress_hosts.py:
an HTTPS server in a network namespace of its own, with its own CA and resolver), a Docker engine and the
Python image (``jupyter tai-sandbox build-image --python``). Sessions of one owner, round-robin between:

* **plain egress**: a session on the owner's ordinary egress bridge, connecting to the server's address (the
  baseline: the way out a session without a policy has);
* **gateway, pass-through**: a session with an allow-list, connecting to the allowed name (its DNS answers
  the gateway, which reads the SNI, dials the name itself and splices the TLS bytes);
* **gateway, substitution**: the same session to the host of a secret it holds, with the placeholder in a
  header (the gateway terminates TLS with the deployment's CA, swaps the secret in and forwards over
  verified TLS); its baseline is plain egress to the same host with the same header.

Rows: an HTTPS download of 256 MiB (32 with ``--quick``), MiB/s measured in the session from the connect to
the last byte; a new connection's first byte (TCP connect, TLS handshake, a small GET, the first byte of the
answer: p50 over many connections, the name already resolved); the gateway container's memory (the
engine's stats: usage, and the anonymous/RSS part) idle, after the downloads and with ``--sessions``
sessions behind the one gateway (their policies registered, idle), where the download and first-byte rows
are measured again. The measuring client is Python's ``ssl`` in the session, the same in every variant.

Targets (issue 52): the download through the gateway >= 0.8x plain egress; the gateway adds <= 5 ms p50 to
a new connection's first byte, <= 10 ms with substitution; both kept with 100 sessions behind one gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import Report, Row

from jupyter_tai_sandbox.contract import SandboxError, SessionSpec
from jupyter_tai_sandbox.contract.egress import EgressPolicy, SecretGrant, new_placeholder
from jupyter_tai_sandbox.images import DEFAULT_IMAGE, PYTHON_IMAGE
from jupyter_tai_sandbox.providers.docker import DockerSandbox


def _load_hosts():  # the test hosts' module, by path (the tests package's own __init__ is not needed)
    path = Path(__file__).resolve().parents[1] / "tests" / "support" / "egress_hosts.py"
    spec = importlib.util.spec_from_file_location("tai_egress_hosts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hosts_module = _load_hosts()
ALLOWED, SECRET_HOST = hosts_module.ALLOWED, hosts_module.SECRET_HOST

LABEL = {"jupyter-tai-sandbox.bench": "egress-gateway"}
POOL = "10.219.0.0/16"
#: a /24 per owner network: room for 100 sessions and the gateway on the filtered one
PREFIX = 24
SECRET = "bench-token"
ROOTS = "bench-roots.pem"

#: run in a session: ``python3 -c CLIENT ARGS_JSON`` prints one JSON object
CLIENT = r"""
import json, os, socket, ssl, sys, time

args = json.loads(sys.argv[1])
context = ssl.create_default_context()  # SSL_CERT_FILE: the gateway's CA where a policy installed it
context.load_verify_locations(args["roots"])  # the test hosts' CA: the public roots of this offline world
header = "Authorization: Bearer %s\r\n" % os.environ.get(args.get("env") or "", "none")


def connect():
    raw = socket.create_connection((args["connect"], 443), timeout=30)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return context.wrap_socket(raw, server_hostname=args["name"])


def request(path):
    return ("GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n" % (path, args["name"], header)).encode()


if args["op"] == "download":
    size = args["bytes"]
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    started = time.perf_counter()
    sock = connect()
    sock.sendall(request("/bytes/%d" % size))
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    got = len(head.partition(b"\r\n\r\n")[2])
    while got < size:
        n = sock.recv_into(view)
        if not n:
            break
        got += n
    seconds = time.perf_counter() - started
    sock.close()
    print(json.dumps({"bytes": got, "seconds": seconds, "status": head.split(b" ", 2)[1].decode()}))
else:
    samples = []
    for _ in range(args["count"]):
        started = time.perf_counter()
        sock = connect()
        sock.sendall(request("/first"))
        first = sock.recv(1)
        samples.append((time.perf_counter() - started) * 1000)
        sock.close()
        if not first:
            raise SystemExit("no answer")
    print(json.dumps({"ms": samples}))
"""


class Hooks:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.lines = 0

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        return self.values.get(name)

    def audit(self, record: Any) -> None:
        self.lines += 1


async def client_run(session: Any, args: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    result = await session.exec(
        ["python3", "-c", CLIENT, json.dumps({**args, "roots": session.resolve(ROOTS)})],
        timeout_seconds=timeout,
    )
    if result.exit_code != 0:
        raise RuntimeError(f"the client failed: {result.stderr.decode()[-1500:]}")
    return json.loads(result.stdout)


def gateway_container(client: Any, owner: str) -> Any:
    (container,) = client.containers.list(
        filters={"label": ["jupyter-tai-sandbox.role=gateway", f"jupyter-tai-sandbox.owner={owner}"]}
    )
    return container


def cpu_seconds(container: Any) -> float:
    """CPU time the container's processes have used (its cgroup's account, v1 or v2), in seconds."""
    container.reload()
    pid = container.attrs["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            for base in ("cpuacct", "cpu,cpuacct"):
                usage = Path("/sys/fs/cgroup", base, path.lstrip("/"), "cpuacct.usage")
                if usage.exists():
                    return int(usage.read_text()) / 1e9
        if controllers == "":
            stat = Path("/sys/fs/cgroup", path.lstrip("/"), "cpu.stat")
            if stat.exists():
                fields = dict(line.split() for line in stat.read_text().splitlines())
                return int(fields["usage_usec"]) / 1e6
    return float("nan")


def gateway_memory(client: Any, owner: str) -> dict[str, float]:
    """The owner's gateway container's memory from the engine's stats, in MiB."""
    container = gateway_container(client, owner)
    memory = client.api.stats(container.id, stream=False)["memory_stats"]
    stats = memory.get("stats", {})
    mib = 1 << 20
    return {
        "usage MiB": memory.get("usage", 0) / mib,
        "max usage MiB": memory.get("max_usage", 0) / mib,
        "rss/anon MiB": stats.get("rss", stats.get("anon", 0)) / mib,
        "cache/file MiB": stats.get("cache", stats.get("file", 0)) / mib,
    }


class Bench:
    def __init__(self, report: Report, hosts: Any, sandbox: DockerSandbox, owner: str, docker: Any) -> None:
        self.report, self.hosts, self.sandbox, self.owner, self.docker = report, hosts, sandbox, owner, docker
        self.placeholder = new_placeholder()
        self.sessions: list[Any] = []

    async def session(self, egress: EgressPolicy | None, image: str = PYTHON_IMAGE, **changes: Any) -> Any:
        session = await self.sandbox.create(
            SessionSpec(image=image, owner=self.owner, ttl_seconds=3600, egress=egress, **changes)
        )
        self.sessions.append(session)
        if image == PYTHON_IMAGE:
            await session.put_file(ROOTS, self.hosts.ca.read_bytes())
        return session

    async def variants(
        self, plain: Any, gated: Any, gateway_ip: str
    ) -> dict[str, tuple[Any, dict[str, Any]]]:
        web = self.hosts.web
        return {
            "plain egress": (plain, {"connect": web, "name": ALLOWED}),
            "gateway, pass-through": (gated, {"connect": gateway_ip, "name": ALLOWED}),
            "plain egress, secret's host": (
                plain,
                {"connect": web, "name": SECRET_HOST, "env": "BENCH_TOKEN"},
            ),
            "gateway, substitution": (
                gated,
                {"connect": gateway_ip, "name": SECRET_HOST, "env": "BENCH_TOKEN"},
            ),
        }

    async def measure(
        self, suffix: str, plain: Any, gated: Any, gateway_ip: str, rounds: int, mib: int
    ) -> None:
        variants = await self.variants(plain, gated, gateway_ip)
        size = mib << 20
        gateway = gateway_container(self.docker, self.owner)
        cpu: dict[str, float] = {}
        download: dict[str, list[float]] = {name: [] for name in variants}
        first: dict[str, list[float]] = {name: [] for name in variants}
        for session, args in variants.values():  # a warm-up each
            await client_run(session, {**args, "op": "download", "bytes": 1 << 20})
        for _ in range(rounds):
            for name, (session, args) in variants.items():
                before = cpu_seconds(gateway)
                got = await client_run(session, {**args, "op": "download", "bytes": size})
                cpu[name] = cpu.get(name, 0.0) + cpu_seconds(gateway) - before
                if got["bytes"] != size or got["status"] != "200":
                    raise RuntimeError(f"{name}: {got}")
                download[name].append(mib / got["seconds"])
            for name, (session, args) in variants.items():
                first[name] += (await client_run(session, {**args, "op": "first", "count": 20}))["ms"]
        baselines = {
            "plain egress": None,
            "gateway, pass-through": "plain egress",
            "plain egress, secret's host": None,
            "gateway, substitution": "plain egress, secret's host",
        }
        for rows, label, unit in (
            (download, f"HTTPS {mib} MiB download: {{}}{suffix}", "MiB/s"),
            (first, f"new connection's first byte: {{}}{suffix}", "ms"),
        ):
            for name, samples in rows.items():
                base = baselines[name]
                baseline = label.format(base) if base else None
                self.report.add(Row("egress", label.format(name), unit, samples, baseline=baseline))
        for name in ("gateway, pass-through", "gateway, substitution"):
            per_gib = cpu[name] / (rounds * mib / 1024)
            self.report.meta[f"gateway CPU s per GiB, {name}{suffix}"] = per_gib
            print(f"   gateway CPU per GiB downloaded, {name}{suffix}: {per_gib:.2f} s", flush=True)
        ratio = statistics.median(download["gateway, pass-through"]) / statistics.median(
            download["plain egress"]
        )
        self.report.target(
            f"download through the gateway >= 0.8x plain egress{suffix}", ratio >= 0.8, f"{ratio:.2f}x"
        )
        added = statistics.median(first["gateway, pass-through"]) - statistics.median(first["plain egress"])
        self.report.target(
            f"gateway adds <= 5 ms p50 to a new connection's first byte{suffix}",
            added <= 5,
            f"+{added:.2f} ms",
        )
        added = statistics.median(first["gateway, substitution"]) - statistics.median(
            first["plain egress, secret's host"]
        )
        self.report.target(
            f"gateway adds <= 10 ms p50 with substitution{suffix}", added <= 10, f"+{added:.2f} ms"
        )

    def memory(self, when: str) -> None:
        seen = gateway_memory(self.docker, self.owner)
        self.report.meta.setdefault("gateway memory", {})[when] = seen
        print(f"   gateway memory {when}: " + ", ".join(f"{k} {v:.1f}" for k, v in seen.items()), flush=True)
        self.report.add(Row("egress", f"gateway container memory: {when}", "MiB", [seen["usage MiB"]]))


async def main(quick: bool, sessions: int, report: Report) -> None:
    import docker

    docker_client = docker.from_env(version="auto", timeout=120)
    rounds = 2 if quick else 5
    mib = 32 if quick else 256
    with hosts_module.running_hosts(f"bench-{os.getpid()}") as hosts:
        hosts_module.check_hosts(hosts)
        sandbox = DockerSandbox(
            image=DEFAULT_IMAGE,
            extra_labels=LABEL,
            network_pool=POOL,
            network_prefix=PREFIX,
            deployment="bench-egress",
            egress_resolver=hosts.resolver,
            egress_upstream_ca=str(hosts.ca),
        )
        owner = f"bench-{secrets.token_hex(3)}"
        real = f"bench-secret-{secrets.token_hex(16)}"
        sandbox.egress_hooks = Hooks({SECRET: real})
        bench = Bench(report, hosts, sandbox, owner, docker_client)
        grant = SecretGrant(SECRET, "BENCH_TOKEN", bench.placeholder, hosts=(SECRET_HOST,))
        policy = EgressPolicy(allow=(ALLOWED, SECRET_HOST), secrets=(grant,))
        try:
            started = time.perf_counter()
            gated = await bench.session(policy, env={"BENCH_TOKEN": bench.placeholder})
            report.meta["first policy session (gateway made) s"] = time.perf_counter() - started
            plain = await bench.session(None, env={"BENCH_TOKEN": bench.placeholder})
            probe = await gated.exec(
                ["python3", "-c", f"import socket; print(socket.gethostbyname({ALLOWED!r}))"],
                timeout_seconds=30,
            )
            gateway_ip = probe.stdout.decode().strip()
            report.meta["gateway ip"] = gateway_ip
            bench.memory("idle, 1 session")
            await bench.measure("", plain, gated, gateway_ip, rounds, mib)
            bench.memory("after the downloads")
            if sessions > 1:
                await add_sessions(bench, policy, sessions - 1, report)
                bench.memory(f"{sessions} sessions, idle")
                await bench.measure(f" ({sessions} sessions)", plain, gated, gateway_ip, rounds, mib)
                bench.memory(f"{sessions} sessions, after the downloads")
            report.meta["audit lines received"] = sandbox.egress_hooks.lines  # type: ignore[union-attr]
        finally:
            gate = asyncio.Semaphore(6)

            async def drop(session: Any) -> None:
                async with gate:
                    with contextlib.suppress(SandboxError):
                        await session.destroy()

            await asyncio.gather(*(drop(s) for s in bench.sessions))
            await sandbox.close()
            docker_client.close()


async def add_sessions(bench: Bench, policy: EgressPolicy, count: int, report: Report) -> None:
    """``count`` more sessions behind the one gateway (the minimal image: idle, their policies registered)."""
    gate = asyncio.Semaphore(4)
    filler = EgressPolicy(allow=(ALLOWED,))
    started = time.perf_counter()

    async def one(i: int) -> None:
        async with gate:
            await bench.session(filler, image=DEFAULT_IMAGE)

    await asyncio.gather(*(one(i) for i in range(count)))
    report.meta[f"{count} more policy sessions created in s"] = time.perf_counter() - started


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the test hosts live in network namespaces (run it with sudo)"
    if shutil.which("ip") is None:
        return "needs iproute2's `ip`"
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, a 32 MiB download")
    parser.add_argument(
        "--sessions", type=int, default=100, help="sessions behind one gateway in the last phase (1: skip it)"
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    if (reason := why_not()) is not None:
        sys.exit(reason)
    report = Report(quick=args.quick, image=PYTHON_IMAGE)
    report.meta["cpus"] = os.cpu_count()
    load_before = os.getloadavg()[0]
    asyncio.run(main(args.quick, args.sessions, report))
    report.meta["load average (1 min) before, after"] = [load_before, os.getloadavg()[0]]
    if load_before > 0.75 * (os.cpu_count() or 1):  # before: the run's own work raises it after
        report.note(
            f"the machine was busy before the run (load {load_before:.1f}, {os.cpu_count()} CPUs): the "
            "download rows shared its cores with other work"
        )
    report.note(
        "the test hosts' server and the measuring client run on this machine: with every core busy in both "
        "variants, the download ratio is the gateway's extra kernel TCP hop competing with them for CPU; "
        "'gateway CPU s per GiB' (meta) is its own cost"
    )
    print()
    print(report.table())
    for when, seen in report.meta.get("gateway memory", {}).items():
        print(f"gateway memory, {when}: " + ", ".join(f"{k} {v:.1f}" for k, v in seen.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2))
