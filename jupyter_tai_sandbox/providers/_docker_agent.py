"""The session agent on a Docker engine: its injection into a container, its channel, and the session.

A container started for the agent runs ``/.tai/agent serve`` as PID 1 (it reaps what commands leave
behind, so the engine's init is not needed). ``/.tai`` is an anonymous volume of the container
(removed with it), so the binary lands there by ``put_archive`` between the container's create and
its start even on a read-only root filesystem, and the image needs nothing: no shell, no ``/tmp``.
The channel is one exec of ``/.tai/agent connect`` whose hijacked stream, demultiplexed, carries the
protocol (``agent/PROTOCOL.md``). The session is the container base's
:class:`~jupyter_tai_sandbox.providers.container.ContainerSession` plus what a Docker engine adds:
its resource figures and a pooled session's record.
"""

from __future__ import annotations

import functools
import io
import tarfile
from collections.abc import Mapping
from typing import Any

from ..agent import AgentClient, agent_binary
from ..agent.client import AGENT_PATH
from ..agent.transport import open_docker_api
from ._docker_names import WORKSPACE
from ._docker_session import USAGE_DU_SECONDS, container_usage
from .container import ContainerSession
from .docker_engine import DockerEngine

#: the folder the agent is put in (a volume of its own: writable on a read-only root filesystem)
AGENT_DIR = "/.tai"


@functools.lru_cache(maxsize=4)
def agent_archive(arch: str | None = None) -> bytes:
    """A tar holding the agent binary for ``arch`` (the engine's ``Architecture``), as ``agent``."""
    data = agent_binary(arch).read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("agent")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def with_agent(options: Mapping[str, Any], volume_labels: Mapping[str, str]) -> dict[str, Any]:
    """Container options that run the agent as PID 1 from its own volume."""
    from .docker_engine import docker_sdk

    mount = docker_sdk().types.Mount(AGENT_DIR, None, type="volume", labels=dict(volume_labels))
    return {**options, "entrypoint": [AGENT_PATH, "serve"], "command": [], "init": False,
            "mounts": [*options.get("mounts", []), mount]}


def open_agent_on_any_loop(engine: DockerEngine):
    """An opener for a loop other than the server's (a synchronous resolve): the SDK in a thread."""

    async def open_(container_id: str) -> AgentClient:
        return await open_docker_api(engine.api, container_id)

    return open_


class DockerAgentSession(ContainerSession):
    """A docker session whose commands and files go through its agent."""

    def __init__(self, *args: Any, engine: DockerEngine, record: str | None = None,
                 extra_env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._engine = engine
        #: the record volume of a session started in a pooled container (None otherwise)
        self._record = record
        #: environment given to every command (a pooled container was started without the spec's env)
        self._extra_env = dict(extra_env or {})

    async def _command_env(self) -> dict[str, str]:
        return {**await super()._command_env(), **self._extra_env}

    @property
    def record(self) -> str | None:
        return self._record

    async def usage(self) -> dict[str, Any]:
        """CPU and memory from one engine stats sample, the workspace's disk from ``du`` (both bounded)."""
        self._check_live()
        return await container_usage(self._engine, self._container, self._id, self._disk())

    async def _disk(self) -> int | str:
        result = await self.exec(["du", "-sk", WORKSPACE], timeout_seconds=USAGE_DU_SECONDS)
        try:
            return int(result.stdout.split()[0]) * 1024 if result.exit_code == 0 else (
                f"no disk figure: du exited with status {result.exit_code}")
        except (IndexError, ValueError):
            return "no disk figure: du gave no size"
