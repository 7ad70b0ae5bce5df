"""Helpers for the tests that need a real Docker engine: the one docker provider factory (``provider``) and
session spec (``spec``) the tests make sessions with, the ``client`` fixture the folder conftests load, what
this run left on the engine, and stopping and starting the engine.

Outside CI the docker tests skip, saying how to start an engine, when none
answers; with ``CI=true`` a missing engine fails them instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.providers._docker_networks import BRIDGE_PREFIX, CHAIN_PREFIX
from jupyter_tai_sandbox.providers.docker import LABEL, DockerSandbox
from jupyter_tai_sandbox.providers.docker.images.build import DEFAULT_IMAGE, PYTHON_IMAGE, build_minimal_image
from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_FORK
from tests.support import PART, RUN_ID, RUN_PREFIX

TEST_IMAGE = os.environ.get("TAI_SANDBOX_TEST_IMAGE", DEFAULT_IMAGE)
START_HINT = (
    "no Docker engine answers at $DOCKER_HOST or /var/run/docker.sock: start one "
    "(as root: `nohup dockerd >/tmp/dockerd.log 2>&1 &`, or run .ci/docker-up) to run the docker tests"
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def docker_client():  # -> docker.DockerClient
    """A client of a live engine with the test image built, or skip (fail in CI)."""
    try:
        import docker

        client = docker.from_env(version="auto", timeout=30)
        client.ping()
    except Exception as e:
        if in_ci():
            pytest.fail(f"{START_HINT} ({e})")
        pytest.skip(f"{START_HINT} ({e})")
    try:
        client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        if TEST_IMAGE != DEFAULT_IMAGE:
            pytest.fail(f"test image {TEST_IMAGE} is missing: build or load it first")
        build_minimal_image(TEST_IMAGE)
    return client


#: Put on everything this part of the test run makes (DockerSandbox.extra_labels), so runs sharing an engine,
#: and the xdist workers of one run, stay apart.
RUN_LABEL = {f"{LABEL}.test-run": f"{RUN_ID}-{PART}"}
#: RUN_LABEL as the engine's label filter (and a ``--DockerSandbox.extra_labels`` option's value): key=value
RUN_FILTER = "=".join(*RUN_LABEL.items())


def provider(**traits) -> DockerSandbox:
    """The tests' docker provider: the test image, this part of the run's label on all it makes, ``traits``."""
    return DockerSandbox(image=TEST_IMAGE, extra_labels=RUN_LABEL, **traits)


def spec(consumer: str = "docker-tests", **changes) -> SessionSpec:
    """A session of the test image, for ``consumer`` (a module's own, where it looks its sessions up by it)."""
    return SessionSpec(**{"image": TEST_IMAGE, "consumer": consumer, **changes})


def server_args(image: str | None = TEST_IMAGE) -> tuple[str, ...]:
    """A live server's options for the docker provider: sessions of ``image`` (None: the provider's default)
    with this part of the run's label."""
    named = (f"--DockerSandbox.image={image}",) if image else ()
    return ("--SandboxApp.provider=docker", *named, f"--DockerSandbox.extra_labels={RUN_FILTER}")


@pytest.fixture(scope="module")
def client():
    """A client of the live engine for one test module (the test image built), or skip (fail in CI)."""
    client = docker_client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def nothing_left(client):
    """After the module's last test: nothing this part of the run made is left on the engine (a module's
    ``pytest.mark.usefixtures("nothing_left")``)."""
    yield
    assert leftovers(client) == []


def leftovers(client) -> list[str]:
    """Containers, volumes and forks' images this test run made, and idle networks of its deployment, that
    still exist."""
    mine = {"label": RUN_FILTER}
    found = [f"container {c.name}" for c in client.containers.list(all=True, filters=mine)]
    found += [f"volume {v.name}" for v in client.volumes.list(filters=mine)]
    forks = {"label": [mine["label"], LABEL_FORK]}  # the provider's own images (a test may build others)
    found += [f"image {', '.join(i.tags) or i.id}" for i in client.images.list(filters=forks)]
    ours = {"label": f"{LABEL}.deployment={os.environ['TAI_SANDBOX_DEPLOYMENT']}"}
    for network in client.networks.list(filters=ours):
        network.reload()
        if not network.attrs.get("Containers"):  # one in use belongs to a live session elsewhere
            found.append(f"network {network.name}")
    return found


def run_leftovers(client) -> list[str]:
    """What any part of this whole run (every worker, the serial group) left on the engine: containers,
    volumes and images (forks') with its run label, and containers, volumes, images and networks of its
    deployments. Empty at the end."""
    key = f"{LABEL}.test-run"
    deployment = f"{LABEL}.deployment"

    def ours(labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return labels.get(key, "").startswith(f"{RUN_ID}-") or labels.get(deployment, "").startswith(
            RUN_PREFIX
        )

    # the low-level listing (one call, labels included): another run may remove a container between a
    # listing and a look at it
    containers = {
        c["Id"]: c
        for flt in (key, deployment)
        for c in client.api.containers(all=True, filters={"label": flt})
    }
    found = [f"container {c['Names'][0].lstrip('/')}" for c in containers.values() if ours(c.get("Labels"))]
    volumes = {v.name: v for flt in (key, deployment) for v in client.volumes.list(filters={"label": flt})}
    found += [f"volume {name}" for name, v in volumes.items() if ours(v.attrs.get("Labels"))]
    images = {
        i.id: i for flt in (key, deployment) for i in client.images.list(filters={"label": [flt, LABEL_FORK]})
    }
    found += [f"image {', '.join(i.tags) or i.id}" for i in images.values() if ours(i.labels)]
    for network in client.networks.list(filters={"label": deployment}):
        labels = network.attrs.get("Labels") or {}
        if ours(labels):
            # which part of the run made it, and when: what a failed end-of-run check needs to find its test
            made = time.strftime("%H:%M:%S", time.localtime(float(labels.get(f"{LABEL}.created", "0") or 0)))
            found.append(f"network {network.name} ({labels.get(deployment)}, made {made})")
    return found


def remove_deployment(client, deployment: str) -> None:
    """Remove everything of ``deployment`` (a test's own, after a failed check left its server no chance
    to): its sessions by its own provider, as its server would (networks with their firewall rules,
    workspaces), then whatever a half-made session left, by force."""
    from docker.errors import NotFound

    async def destroy_sessions() -> None:
        sandbox = DockerSandbox(image=TEST_IMAGE, deployment=deployment)
        try:
            for info in await sandbox.list():
                with contextlib.suppress(Exception):
                    await (await sandbox.get(info.id)).destroy(remove_workspace=True)
        finally:
            await sandbox.close()

    asyncio.run(destroy_sessions())
    mine = {"label": f"{LABEL}.deployment={deployment}"}
    for container in client.api.containers(all=True, filters=mine):
        with contextlib.suppress(NotFound):
            client.api.remove_container(container["Id"], force=True, v=True)
    for volume in client.volumes.list(filters=mine):
        with contextlib.suppress(NotFound):
            volume.remove(force=True)
    for image in sorted(
        client.images.list(filters=mine), key=lambda i: i.attrs.get("Created", ""), reverse=True
    ):
        with contextlib.suppress(NotFound):  # forks' images, the latest first (an image under another waits)
            client.images.remove(image.id, force=True)
    for network in client.networks.list(filters=mine):
        with contextlib.suppress(NotFound):
            network.remove()


def firewall_rules() -> set[str]:
    """The host firewall rules the docker provider tags (``tai-sbx:<deployment tag>``) and the chains it makes
    (``TAI-SBX-<hex>``), as ``-S`` prints them (empty when iptables is missing or not ours to read)."""
    rules: set[str] = set()
    for tool in ("iptables", "ip6tables"):
        exe = shutil.which(tool)
        if exe is None:
            continue
        listed = subprocess.run([exe, "-w", "-S"], capture_output=True, text=True, check=False)
        rules |= {
            f"{tool} {line}"
            for line in listed.stdout.splitlines()
            if "tai-sbx:" in line or line.startswith(f"-N {CHAIN_PREFIX}")
        }
    return rules


def stale_firewall_rules(before: set[str]) -> list[str]:
    """Tagged rules and chains made since ``before`` whose bridge is gone: a network was removed, its rules
    were not."""

    def bridge_gone(rule: str) -> bool:
        words = rule.split()
        if words[1] == "-N":
            bridge = BRIDGE_PREFIX + words[2].removeprefix(CHAIN_PREFIX)
        else:
            bridge = next((words[i + 1] for i, word in enumerate(words[:-1]) if word in ("-i", "-o")), "")
        return bool(bridge) and not Path("/sys/class/net", bridge).exists()

    return sorted(rule for rule in firewall_rules() - before if bridge_gone(rule))


async def running_in(session, pid: int) -> bool:
    """Whether ``pid`` (of the container's pid namespace) is alive, not a zombie, by its /proc entry."""
    probe = await session.exec(
        ["sh", "-c", 'read -r l </proc/$1/stat && set -- ${l##*) } && [ "$1" != Z ]', "sh", str(pid)],
        timeout_seconds=10,
    )
    return probe.exit_code == 0


async def wait_stopped_in(session, pid: int, seconds: float = 3.0) -> bool:
    """Whether ``pid`` of ``session`` is gone (or a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while await running_in(session, pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@contextmanager
def host_listener() -> Iterator[int]:
    """A TCP port on this machine (all addresses) that answers ``pong`` to every connection."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"pong\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        server.close()


# ------------------------------------------------- stopping and starting the engine (fault tests)

PIDFILE = "/var/run/docker.pid"
ENGINE_LOG = os.environ.get("DOCKER_UP_LOG", "/tmp/dockerd.log")


def engine_pid() -> int:
    with open(PIDFILE) as f:
        return int(f.read().strip())


def freeze_engine(pid: int, within: float = 5.0) -> None:
    """SIGSTOP the engine and return once every thread of it is stopped (a signal is delivered to each thread
    as it is next scheduled: a call made right after ``kill`` could still be answered)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine's threads did not all stop within {within:g} s: {states}")
        time.sleep(0.01)


def engine_answers() -> bool:
    return subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0


def wait_for_engine(seconds: float) -> None:
    """Return once the engine answers; TimeoutError after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            if engine_answers():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Docker engine did not answer within {seconds:g} s")
        time.sleep(1)


def start_engine() -> None:
    """Start dockerd as .ci/docker-up does (unless one answers) and wait for it, bounded."""
    started = None
    for _ in range(90):
        if engine_answers():
            return
        if started is None or started.poll() is not None:
            # the killed dockerd may linger as a zombie (PID 1 here reaps no orphans), and dockerd refuses
            # to start while its pid file names a live process: drop a pid file of a dead or zombie one
            with contextlib.suppress(OSError, ValueError):
                with open(f"/proc/{engine_pid()}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
                if state in ("Z", "X"):
                    os.unlink(PIDFILE)
            if not os.path.exists(f"/proc/{engine_pid() if os.path.exists(PIDFILE) else 0}"):
                with contextlib.suppress(OSError):
                    os.unlink(PIDFILE)
            with open(ENGINE_LOG, "ab") as log:
                started = subprocess.Popen(
                    ["nohup", "dockerd"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        time.sleep(1)
    raise AssertionError(f"dockerd did not come back within 90 s: see {ENGINE_LOG}")


# ------------------------------------------------------------------ the fault tests' shared pieces

#: the tests that freeze or kill the shared engine run only in CI, or when asked for (see tests/conftest.py)
DISTURB = in_ci() or os.environ.get("TAI_SANDBOX_DISTURB_ENGINE", "") == "1"
DISTURB_HINT = "stops the shared Docker engine: set TAI_SANDBOX_DISTURB_ENGINE=1 (CI runs it)"
#: freezes the engine (SIGSTOP, then SIGCONT): the serial group, after every other test
disturbs_engine = pytest.mark.disturbs_engine("freezes")
#: kills the engine and starts it again: the serial group's last tests
kills_engine = pytest.mark.disturbs_engine("kills")


#: the fault tests' sessions (one of them finds its containers by this consumer)
fault_spec = functools.partial(spec, consumer="docker-fault-tests")


async def timed(awaitable, limit: float) -> tuple[float, object]:
    """(seconds taken, result or exception), never longer than ``limit``."""
    started = time.monotonic()
    try:
        result: object = await asyncio.wait_for(awaitable, limit)
    except Exception as e:  # the outcome is what we look at
        result = e
    return time.monotonic() - started, result


# ------------------------------------------------- another deployment on the same engine

#: the deployment a foreign server would be in: planted before the run, it must survive it untouched
FOREIGN_DEPLOYMENT = f"someone-else-{secrets.token_hex(4)}"
FOREIGN_WORKSPACE_KEY = "shared-key"


def plant_foreign_sessions() -> dict[str, list[str]] | None:
    """Sessions, a workspace and an owner network of another deployment, all past their TTL (so any
    reaper that saw them would take them); what was made, or None when no engine answers."""
    try:
        client = docker_client()
    except BaseException:  # skip/fail outcomes: the tests that need an engine report them
        return None

    async def plant() -> dict[str, list[str]]:
        sandbox = DockerSandbox(image=TEST_IMAGE, deployment=FOREIGN_DEPLOYMENT)
        try:
            internal = await sandbox.create(SessionSpec(ttl_seconds=1, network="internal", owner="alice"))
            durable = await sandbox.create(
                SessionSpec(
                    ttl_seconds=1, durability="persistent", workspace_key=FOREIGN_WORKSPACE_KEY, owner="alice"
                )
            )
            await durable.put_file("secret.txt", b"alice's")
            return {
                "containers": [internal.container_id, durable.container_id],
                "volumes": [sandbox.scope.workspace_volume(FOREIGN_WORKSPACE_KEY, "alice")],
                "networks": [sandbox.scope.owner_network(sandbox.internal_network, "alice")],
            }
        finally:
            await sandbox.close()

    try:
        return asyncio.run(plant())
    finally:
        client.close()


def foreign_survivors(planted: dict[str, list[str]]) -> list[str]:
    """What of the planted foreign things is gone (empty: all survived)."""
    import docker

    client = docker.from_env(version="auto", timeout=120)
    missing = []
    try:
        for kind, getter in (
            ("containers", client.containers),
            ("volumes", client.volumes),
            ("networks", client.networks),
        ):
            for name in planted[kind]:
                try:
                    getter.get(name)
                except docker.errors.NotFound:
                    missing.append(f"{kind[:-1]} {name}")
    finally:
        client.close()
    return missing


def remove_foreign_sessions() -> None:
    """Remove everything of the foreign deployment (its own provider does it, as its server would)."""
    client = docker_client()
    try:
        remove_deployment(client, FOREIGN_DEPLOYMENT)
    finally:
        client.close()


def python_image():
    """A client of a live engine that has the Python image, or skip (fail in CI)."""
    client = docker_client()
    try:
        client.images.get(PYTHON_IMAGE)
    except Exception:
        client.close()
        message = f"{PYTHON_IMAGE} is missing: build it with `jupyter tai-sandbox build-image --python`"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return client
