"""The session agent's tests' real containers (fixtures their folder conftests load: tests/agent/ and
tests/providers/container/) and ``run``.

Images are made with ``docker import`` (no registry): ``agent_only`` holds nothing but an empty ``/.tai``,
``busybox`` holds Debian's static busybox (and the hostile test program) for commands. Each container is
created, given the agent by ``put_archive`` at ``/.tai/agent`` and started with ``/.tai/agent serve`` as
PID 1 (a provider mounts that folder read-only instead: tests/providers/docker/test_docker_agent.py).
Everything carries this run's label and is removed even when a test fails.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import secrets
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_tai_sandbox.agent import AgentBinaryMissing, AgentClient, agent_binary, build_agent
from jupyter_tai_sandbox.agent.binary import go_command
from jupyter_tai_sandbox.agent.client import AGENT_PATH
from tests.support import REPO, aio

#: the fixtures, which the agent's and the container base's folder conftests load whole
__all__ = [
    "agent_path",
    "bare_session",
    "docker_api",
    "hostile_binary",
    "images",
    "nothing_left_behind",
    "session",
]

#: the agent tests' coroutines, each bounded to 120 s
run = functools.partial(aio.run, timeout=120)

RUN = f"{os.environ.get('TAI_SANDBOX_DEPLOYMENT', 'agent')}-{secrets.token_hex(3)}"
LABEL_KEY = "jupyter-tai-sandbox.agent-test"
LABELS = {LABEL_KEY: RUN}
APPLETS = (
    "sh",
    "cat",
    "echo",
    "true",
    "false",
    "sleep",
    "kill",
    "head",
    "yes",
    "ls",
    "stty",
    "tty",
    "sha256sum",
    "wc",
    "seq",
    "wait",
    "ps",
    "readlink",
    "nc",
    "mkdir",
    "ln",
    "id",
    "touch",
    "setsid",
)
HOSTILE_SRC = REPO / "tests" / "agent" / "hostile"
BUSYBOX_CANDIDATES = ("/usr/bin/busybox", "/bin/busybox")


@pytest.fixture(scope="session")
def docker_api():
    try:
        import docker

        client = docker.from_env(version="auto", timeout=60)
        client.ping()
    except Exception as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"no Docker engine: {e}")
        pytest.skip(f"no Docker engine answers ({e}): start one (.ci/docker-up) to run the agent tests")
    yield client
    client.close()


@pytest.fixture(scope="session")
def agent_path() -> Path:
    try:
        return agent_binary()
    except AgentBinaryMissing:
        build_agent()  # a checkout without .ci/agent-up run yet
        return agent_binary()


def _tar(files: dict[str, tuple[bytes | None, int]], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def _import(docker_api, tar: bytes, tag: str) -> str:
    subprocess.run(
        ["docker", "import", "--change", f"LABEL {LABEL_KEY}={RUN}", "-", tag],
        input=tar,
        check=True,
        capture_output=True,
    )
    return tag


@pytest.fixture(scope="session")
def hostile_binary(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("hostile") / "hostile"
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOOS": "linux",
        "GOFLAGS": "-buildvcs=false",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOMAXPROCS": "1",
    }
    subprocess.run(
        [*go_command(), "build", "-p", "1", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."],
        cwd=HOSTILE_SRC,
        env=env,
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


@pytest.fixture(scope="session")
def images(docker_api, hostile_binary) -> Iterator[dict[str, str]]:
    busybox = next((p for p in BUSYBOX_CANDIDATES if os.path.isfile(p)), None) or shutil.which("busybox")
    if busybox is None:
        pytest.skip("Debian's busybox-static is needed for the agent tests' commands")
    tags = {"agent_only": f"tai-agent-test/agent-only:{RUN}", "busybox": f"tai-agent-test/busybox:{RUN}"}
    try:
        _import(docker_api, _tar({".tai": (None, 0o755)}), tags["agent_only"])
        files = {
            "bin": (None, 0o755),
            "bin/busybox": (Path(busybox).read_bytes(), 0o755),
            "bin/hostile": (hostile_binary, 0o755),
            "data": (None, 0o777),
            ".tai": (None, 0o755),
        }
        _import(docker_api, _tar(files, {f"bin/{a}": "busybox" for a in APPLETS}), tags["busybox"])
        yield tags
    finally:
        for tag in tags.values():
            with contextlib.suppress(Exception):
                docker_api.images.remove(tag, force=True)


class Session:
    """One container running the agent as PID 1."""

    def __init__(self, docker_api, container) -> None:
        self.api, self.container, self.name = docker_api, container, container.name

    async def client(self, **kw) -> AgentClient:
        return await AgentClient.docker_exec(self.name, **kw)

    def exec(self, *argv: str) -> str:
        return subprocess.run(
            ["docker", "exec", self.name, *argv], capture_output=True, text=True, check=True
        ).stdout


@contextlib.contextmanager
def started_session(docker_api, image: str, agent: Path) -> Iterator[Session]:
    """A container of ``image`` running the agent as PID 1, removed after, even when the test fails."""
    container = docker_api.containers.create(
        image,
        entrypoint=[AGENT_PATH, "serve"],
        name=f"tai-agent-test-{RUN}-{secrets.token_hex(3)}",
        labels=LABELS,
        network_mode="none",
        detach=True,
    )
    try:
        # as the providers install it: executable by anyone, readable by root alone (a relay is non-dumpable)
        container.put_archive("/.tai", _tar({"agent": (agent.read_bytes(), 0o711)}))
        container.start()
        yield Session(docker_api, container)
    finally:
        container.remove(force=True)


@pytest.fixture
def session(docker_api, images, agent_path) -> Iterator[Session]:
    """The agent in a container of Debian's static busybox (and the hostile test program)."""
    with started_session(docker_api, images["busybox"], agent_path) as s:
        yield s


@pytest.fixture
def bare_session(docker_api, images, agent_path) -> Iterator[Session]:
    """The agent in a container holding nothing else."""
    with started_session(docker_api, images["agent_only"], agent_path) as s:
        yield s


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(request):
    yield
    with contextlib.suppress(Exception):
        import docker

        client = docker.from_env(version="auto")
        for c in client.containers.list(all=True, filters={"label": f"{LABEL_KEY}={RUN}"}):
            c.remove(force=True)
