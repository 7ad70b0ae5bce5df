"""The session agent on a Docker engine: its injection into a container, its channel, and the session.

A container started for the agent runs ``/.tai/agent serve`` as PID 1 (it reaps what commands leave
behind, so the engine's init is not needed). ``/.tai`` is a named volume mounted **read-only**, one per
architecture and provider instance (:class:`AgentVolumes`), filled once through a container that is
created, given the binary by ``put_archive`` and removed, never started. So session code, even root,
cannot change the program the server's next ``connect`` runs: the file is on a read-only mount (EROFS),
``/.tai`` is a mount point (EBUSY on a rename or removal), and mounting needs CAP_SYS_ADMIN, which
sessions never get. The agent listens on an abstract socket, so there is no socket file to remove either.
The image needs nothing: no shell, no ``/tmp``. The channel is one exec of ``/.tai/agent connect`` whose
hijacked stream, demultiplexed, carries the protocol (``agent/PROTOCOL.md``). The session is the container
base's :class:`~jupyter_tai_sandbox.providers.container.ContainerSession` plus what a Docker engine adds:
its resource figures and a pooled session's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import io
import logging
import tarfile
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..agent import AgentClient, agent_binary
from ..agent.client import AGENT_DIR, AGENT_PATH
from ..agent.transport import open_docker_api
from ..contract import SandboxError
from ._docker_names import LABEL, WORKSPACE
from ._docker_pool import new_owner, owner_gone
from ._docker_session import USAGE_DU_SECONDS, container_usage
from .container import ContainerSession
from .docker_engine import DockerEngine

#: on an agent volume: the provider instance that keeps it (``host:pid:token``, as a warm pool's owner)
LABEL_AGENT_KEEPER = f"{LABEL}.agent-keeper"
AGENT_VOLUME_PREFIX = "tai-agent-"
#: a dangling agent volume whose keeper is on another host (so cannot be asked) is removed after this long
AGENT_VOLUME_STALE_SECONDS = 24 * 3600.0


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


def with_agent(options: Mapping[str, Any], volume: str) -> dict[str, Any]:
    """Container options that run the agent as PID 1 from the read-only agent ``volume``."""
    from .docker_engine import docker_sdk

    mount = docker_sdk().types.Mount(AGENT_DIR, volume, type="volume", read_only=True)
    return {**options, "entrypoint": [AGENT_PATH, "serve"], "command": [], "init": False,
            "mounts": [*options.get("mounts", []), mount]}


def is_missing_agent(error: BaseException) -> bool:
    """True when a container's start failed because its agent volume held no agent (it was removed, and
    the engine made an empty one of that name at the create)."""
    return AGENT_PATH in str(error) and ("no such file" in str(error).lower() or "not found" in str(error).lower())


class AgentVolumes:
    """The read-only volumes a provider instance's sessions take the agent binary from: one per architecture,
    named for this instance (two servers never fill one volume at once), removed by :meth:`close` when no
    session uses it any more, and by any instance's :meth:`reap` once dangling with its keeper gone."""

    def __init__(self, engine: DockerEngine, labels: Mapping[str, str], tag: str, log: logging.Logger) -> None:
        self._engine, self._labels, self._log = engine, dict(labels), log
        self._keeper = new_owner()
        self._prefix = f"{AGENT_VOLUME_PREFIX}{tag}-"
        self._filled: dict[str, asyncio.Future[str]] = {}

    async def volume_for(self, arch: str | None, image: str) -> str:
        """The name of this instance's filled agent volume for ``arch`` (filled on first use, through a
        container of ``image``, which the engine has)."""
        key = arch or ""
        filled = self._filled.get(key)
        if filled is None or (filled.done() and (filled.cancelled() or filled.exception() is not None)):
            filled = self._filled[key] = asyncio.ensure_future(self._fill(arch, image))
        return await asyncio.shield(filled)

    def forget(self, arch: str | None) -> None:
        """Fill the volume again on its next use (it was found empty)."""
        self._filled.pop(arch or "", None)

    async def _fill(self, arch: str | None, image: str) -> str:
        archive = await asyncio.to_thread(agent_archive, arch)
        digest = hashlib.sha256(archive).hexdigest()[:12]
        token = hashlib.sha256(self._keeper.encode()).hexdigest()[:8]
        name = f"{self._prefix}{arch or 'host'}-{digest}-{token}"
        await self._engine.create_volume(name, {**self._labels, LABEL_AGENT_KEEPER: self._keeper})
        await self._engine.fill_volume(name, image, archive, labels=self._labels)
        return name

    async def close(self) -> None:
        """Remove this instance's volumes that no container uses (a session that outlives the server keeps its own)."""
        for filled in self._filled.values():
            if filled.done() and not filled.cancelled() and filled.exception() is None:
                with contextlib.suppress(SandboxError):
                    await self._engine.remove_volume(filled.result())
        self._filled.clear()

    async def reap(self, now: float) -> None:
        """Remove the deployment's dangling agent volumes whose keeper is gone (another host's: once stale)."""
        for volume in await self._engine.volumes(LABEL_AGENT_KEEPER, dangling=True):
            keeper = (volume.get("Labels") or {}).get(LABEL_AGENT_KEEPER, "")
            if keeper == self._keeper or not (owner_gone(keeper) or _age(volume, now) > AGENT_VOLUME_STALE_SECONDS):
                continue
            with contextlib.suppress(SandboxError):
                await self._engine.remove_volume(volume["Name"])


def _age(volume: Mapping[str, Any], now: float) -> float:
    try:
        return now - datetime.fromisoformat(str(volume.get("CreatedAt")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


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
