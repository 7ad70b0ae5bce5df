"""The session agent on a Docker engine: its injection into a container, and its channel.

A container started for the agent runs ``/.tai/agent serve`` as PID 1 (it reaps what commands leave
behind, so the engine's init is not needed). ``/.tai`` is a named volume mounted **read-only**, one per
engine, architecture and agent build (:class:`AgentVolumes`), filled once through a container that is
created, given the binary by ``put_archive`` and removed, never started. So session code, even root,
cannot change the program the server's next ``connect`` runs: the file is on a read-only mount (EROFS),
``/.tai`` is a mount point (EBUSY on a rename or removal), and mounting needs CAP_SYS_ADMIN, which
sessions never get. The agent listens on an abstract socket, so there is no socket file to remove either.
The image needs nothing: no shell, no ``/tmp``. The channel is one exec of ``/.tai/agent connect`` whose
hijacked stream, demultiplexed, carries the protocol (``agent/PROTOCOL.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import io
import tarfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ..agent import AgentBinaryMissing, AgentClient, agent_binary
from ..agent.client import AGENT_DIR, AGENT_PATH
from ..agent.transport import create_relay_exec, open_docker_api, open_docker_streams
from ..contract import SandboxError, SandboxUnavailableError
from .container import CommandRegistry, ContainerSite
from .docker_engine import DockerEngine
from .docker_engine.names import LABEL, WORKSPACE
from .docker_engine.stream import start_exec

#: on an agent volume: the agent build it holds (the first 12 hex digits of its tar's sha256)
LABEL_AGENT_BUILD = f"{LABEL}.agent-build"
AGENT_VOLUME_PREFIX = "tai-agent-"


#: what the agent of a session with a user needs beyond a session's capabilities (to become the user for each
#: command and to signal its processes; a command loses them all as it becomes a user other than root)
AGENT_USER_CAPABILITIES = ("SETUID", "SETGID", "KILL")


def checked_agent_binary(arch: str | None = None) -> Path:
    """The agent binary for ``arch``, or SandboxUnavailableError (503) saying how to get it: without it no
    session can start, which is the operator's to fix, not the caller's."""
    try:
        return agent_binary(arch)
    except AgentBinaryMissing as e:
        raise SandboxUnavailableError(f"no session can start: the session agent {e}") from None


def agent_archive(arch: str | None = None) -> bytes:
    """A tar holding the agent binary for ``arch`` (the engine's ``Architecture``), as ``agent``;
    SandboxUnavailableError when there is none."""
    path = checked_agent_binary(arch)
    return _archive(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _archive(path: Path, mtime_ns: int) -> bytes:
    data = path.read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("agent")
        # executable by anyone, readable by root alone: a relay exec'd as RELAY_USER is non-dumpable from its start
        info.size, info.mode = len(data), 0o711
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def with_agent(options: Mapping[str, Any], volume: str) -> dict[str, Any]:
    """Container options that run the agent as PID 1 from the read-only agent ``volume``."""
    from .docker_engine import docker_sdk

    mount = docker_sdk().types.Mount(AGENT_DIR, volume, type="volume", read_only=True)
    return {
        **options,
        "entrypoint": [AGENT_PATH, "serve"],
        "command": [],
        "init": False,
        "mounts": [*options.get("mounts", []), mount],
    }


def is_missing_agent(error: BaseException) -> bool:
    """True when a container's start failed because its agent volume held no agent (it was removed, and
    the engine made an empty one of that name at the create)."""
    return AGENT_PATH in str(error) and (
        "no such file" in str(error).lower() or "not found" in str(error).lower()
    )


class AgentVolumes:
    """The read-only volume agent sessions take the binary from: one per engine, architecture and agent
    build (``tai-agent-<arch>-<build>``), shared by every server and deployment on the engine like an image
    (it holds only the package's own program, and no session can write it), filled by the first server that
    needs it. A reap removes other builds' volumes once no container uses them."""

    def __init__(self, engine: DockerEngine) -> None:
        self._engine = engine
        self._filled: dict[str, asyncio.Future[str]] = {}
        self._builds: set[str] = set()

    async def volume_for(self, arch: str | None, image: str) -> str:
        """The name of the filled agent volume for ``arch`` (filled through a container of ``image``, which the
        engine has, when no server filled it yet)."""
        key = arch or ""
        filled = self._filled.get(key)
        if filled is None or (filled.done() and (filled.cancelled() or filled.exception() is not None)):
            filled = self._filled[key] = asyncio.ensure_future(self._fill(arch, image, refill=False))
        return await asyncio.shield(filled)

    def forget(self, arch: str | None, image: str) -> None:
        """The volume was found without the agent (removed, and made again empty by a create): fill it again."""
        self._filled[arch or ""] = asyncio.ensure_future(self._fill(arch, image, refill=True))

    async def _fill(self, arch: str | None, image: str, *, refill: bool) -> str:
        archive = await asyncio.to_thread(agent_archive, arch)
        build = hashlib.sha256(archive).hexdigest()[:12]
        self._builds.add(build)
        name = f"{AGENT_VOLUME_PREFIX}{arch or 'host'}-{build}"
        await self._engine.fill_shared_volume(
            name, image, archive, labels={LABEL_AGENT_BUILD: build}, refill=refill
        )
        return name

    async def reap(self) -> None:
        """Remove agent volumes of builds this server does not use that no container uses."""
        if not self._builds:
            return  # this server has not filled one yet: it cannot tell which builds are old
        for volume in await self._engine.shared_volumes(LABEL_AGENT_BUILD, dangling=True):
            if (volume.get("Labels") or {}).get(LABEL_AGENT_BUILD) not in self._builds:
                with contextlib.suppress(SandboxError):
                    await self._engine.remove_volume(volume["Name"])


def agent_site(
    provider: Any,
    engine: DockerEngine,
    commands: CommandRegistry,
    *,
    answer_within: float,
    current_end: Callable[[str], Awaitable[float | None]] | None = None,
    set_paused: Callable[[Any, bool], Awaitable[None]] | None = None,
    fork: Callable[[Any], Awaitable[Any]] | None = None,
) -> ContainerSite:
    """The container site of ``provider``'s agent sessions on ``engine`` (docker's one engine, a swarm node's)."""

    return ContainerSite(
        kind=provider.kind,
        isolation=provider.max_isolation,
        open_agent=engine.open_agent,
        inspect=lambda container_id: engine.inspect_container(container_id, what="inspect a session"),
        teardown=provider._teardown,
        log=provider.log,
        memory_limit=provider.output_memory_bytes,
        commands=commands,
        retime=provider._retime,
        workspace=WORKSPACE,
        container_env=engine.container_env,
        open_agent_elsewhere=open_agent_on_any_loop(engine),
        transfer_idle_seconds=provider.transfer_idle_seconds,
        answer_within=answer_within,
        current_end=current_end,
        set_paused=set_paused,
        fork=fork,
        connect_port=engine.connect_port,
    )


def open_agent_on_any_loop(engine: DockerEngine):
    """An opener for a loop other than the server's (a synchronous resolve): the exec made by the SDK in a
    thread, its stream opened on the calling loop (the engine's address is no loop's; over TLS too, where
    the SDK's own hijacked socket is an SSL socket asyncio cannot take)."""

    async def open_(container_id: str) -> AgentClient:
        address = engine.address
        if address is None:  # the engine never connected: the SDK's socket (a unix or plain tcp engine)
            return await open_docker_api(engine.api, container_id)
        api = engine.api
        exec_id = await asyncio.to_thread(create_relay_exec, api, container_id)
        reader, writer = await start_exec(address, str(api._version), exec_id, False)
        try:
            return await open_docker_streams(reader, writer)
        except BaseException:
            writer.close()
            raise

    return open_
