"""A real Docker Swarm for the swarm provider's tests: `.ci/swarm up` before, `.ci/swarm down` after.

The swarm is three extra engines in network namespaces of their own (see the
script); the machine's default engine only lends its session image (``docker
save``). They run only with ``CI=true`` or ``TAI_SANDBOX_EXTRA_ENGINES=1`` (and skip saying
so otherwise); then they skip when the machine cannot run it (not root, no dockerd, ip or
nsenter, no default engine), or with ``CI=true`` fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jupyter_tai_sandbox.providers.swarm import SwarmSandbox
from tests.support import REPO
from tests.support.docker import RUN_LABEL, TEST_IMAGE, docker_client, in_ci

SCRIPT = REPO / ".ci" / "swarm"
ROOT = Path(os.environ.get("TAI_SWARM_ROOT", "/var/lib/tai-swarm"))
TLS = ROOT / "tls"
MANAGER = "tcp://10.213.7.11:2376"
#: how long `up` and `down` may take (each)
SCRIPT_LIMIT = 180


def node_socket(n: int) -> str:
    return f"unix:///run/tai-swarm-{n}.sock"


def _unable() -> str | None:
    if os.geteuid() != 0:
        return "the swarm tests need root (network namespaces, extra dockerd instances)"
    for tool in ("dockerd", "docker", "ip", "nsenter", "unshare", "openssl"):
        if shutil.which(tool) is None:
            return f"the swarm tests need {tool}"
    return None


def script(*args: str, check: bool = True, limit: float = SCRIPT_LIMIT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TAI_SWARM_IMAGES": TEST_IMAGE}
    done = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=limit, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f".ci/swarm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return done


def leftovers_on_host() -> list[str]:
    """What of the swarm still exists on this machine after `down`."""
    found = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in names.splitlines() if line.startswith("tai-swarm")]
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    found += [f"link {line.split()[0]}" for line in links.splitlines() if line.startswith("tai-sw")]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "/run/tai-sw/" in cmdline or (
            "tai-swarm-" in cmdline and ("containerd" in cmdline or "dockerd" in cmdline)
        ):
            found.append(f"process {pid}: {cmdline[:120]}")
    if ROOT.exists():
        found.append(f"folder {ROOT}")
    found += [f"socket {p}" for p in Path("/run").glob("tai-swarm-*.sock")]
    return found


#: the swarm is three extra engines and network namespaces on this machine: only in CI, or when asked
EXTRA_ENGINES = in_ci() or os.environ.get("TAI_SANDBOX_EXTRA_ENGINES", "") == "1"


@contextmanager
def running_swarm() -> Iterator[None]:
    """Start the swarm (after clearing one a dead run left behind); always tear it down."""
    if not EXTRA_ENGINES:
        pytest.skip(
            "starts a three-engine swarm in network namespaces: set TAI_SANDBOX_EXTRA_ENGINES=1 (CI runs it)"
        )
    reason = _unable()
    if reason is not None:
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    docker_client().close()  # the default engine answers and holds the session image (or skip)
    owner = ROOT / "owner"
    if owner.exists():
        pid = int(owner.read_text().strip() or 0)
        if pid and Path(f"/proc/{pid}").exists() and pid != os.getpid():
            pytest.skip(f"another test run (pid {pid}) holds the swarm at {ROOT}")
    script("down", check=False)
    try:
        script("up")
        owner.write_text(str(os.getpid()))
        yield
    finally:
        script("down", check=False)


def swarm_sandbox(**traits) -> SwarmSandbox:
    """A provider on the test swarm: the manager and the nodes over TLS (engine label tai.engine)."""
    options = {
        "base_url": MANAGER,
        "tls_ca": str(TLS / "ca.pem"),
        "tls_cert": str(TLS / "cert.pem"),
        "tls_key": str(TLS / "key.pem"),
        "image": TEST_IMAGE,
        "extra_labels": RUN_LABEL,
        **traits,
    }
    return SwarmSandbox(**options)


def wait_for(predicate, limit: float, what: str, every: float = 0.25):
    """Poll ``predicate`` until it returns something true; fail after ``limit`` seconds."""
    give_up = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"{what} did not happen within {limit:g} s")
        time.sleep(every)
