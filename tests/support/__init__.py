"""What the test modules share: engines (docker, swarm), servers (in-process and live), kernels, MCP
clients, the browser, and how the suite is scheduled. No test module imports another; what two of them
need lives here."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

#: the checkout the tests run from
REPO = Path(__file__).resolve().parents[2]
#: screenshots and logs a failed test leaves for a human (ignored by git)
ARTIFACTS = REPO / "tests" / "artifacts"

#: True in the process that started the run (the xdist controller, or the only process without -n): it
#: plants the foreign deployment and checks, at the end, that the whole run left nothing on the engine.
#: Its workers and the serial group's process inherit the run's id.
TOP_LEVEL = "TAI_SANDBOX_TEST_RUN" not in os.environ
#: one id for the whole run, shared by its workers
RUN_ID = os.environ.setdefault("TAI_SANDBOX_TEST_RUN", secrets.token_hex(5))
#: this process's part of the run: an xdist worker (gw0...), the serial group, or main
PART = (
    os.environ.get("PYTEST_XDIST_WORKER")
    or os.environ.get("TAI_SANDBOX_TEST_PART")
    or ("main" if TOP_LEVEL else f"nested-{secrets.token_hex(3)}")
)
#: this process's deployment scope (DockerSandbox.deployment), inherited by every server it starts: the
#: parts never see, reap or touch each other's sessions, nor anyone else's on a shared engine
DEPLOYMENT = f"pytest-{RUN_ID}-{PART}"
#: what every deployment of this run starts with
RUN_PREFIX = f"pytest-{RUN_ID}-"


#: the ports free_port handed out in this process (never twice: a harness takes several before it binds any)
_HANDED_OUT: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A localhost port free now, for a server started next. Chosen at random below the kernel's ephemeral
    range: a port the kernel picked (bind to 0) is one it may hand to the next outgoing connection of this busy
    machine before the server binds it ("port ... is not available", seen once in CI), and at random, so
    parallel workers do not pick the same one."""
    top = _ephemeral_start()
    for _ in range(200):
        port = secrets.SystemRandom().randrange(max(1024, top - 12000), top)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # the range is crowded: any port the kernel has
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
