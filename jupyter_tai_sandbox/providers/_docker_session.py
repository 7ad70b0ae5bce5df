"""A docker session: one container, reached through its session agent.

Commands, files and path look-ups are the container base's
(:class:`~jupyter_tai_sandbox.providers.container.ContainerSession`, over the agent protocol). A Docker
engine adds the session's resource figures (one stats sample and a bounded ``du``) and, for a session
started in a pooled container, its record volume and the spec's environment given to every command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from ..contract import (
    SandboxError,
    SandboxNotFoundError,
    session_gone,
    usage_record,
)
from ._docker_sandbox import spec_from_labels
from .docker.gateway import GatewaySession
from .docker_engine import DockerEngine
from .docker_engine.names import (
    LABEL_CREATED,
    LABEL_EXPIRES,
    LABEL_FORK,
    LABEL_SESSION,
    LABEL_USER,
    WORKSPACE,
)


async def container_usage(
    engine: DockerEngine, container: str, session_id: str, disk: Awaitable[int | str]
) -> dict[str, Any]:
    """A session's usage record: CPU and memory from one engine stats sample, the disk from ``disk`` (a bounded
    ``du``: bytes, or why there are none); what could not be measured is said in the note."""
    stats, disk_bytes = await asyncio.gather(engine.stats(container), disk, return_exceptions=True)
    if isinstance(stats, SandboxNotFoundError):
        raise session_gone(session_id) from None
    notes = []
    measured: dict[str, Any] = {}
    if isinstance(stats, BaseException):
        if not isinstance(stats, SandboxError):
            raise stats
        notes.append(f"no CPU or memory figures: {stats}")
    else:
        measured.update(_from_stats(stats))
    if isinstance(disk_bytes, BaseException):
        if not isinstance(disk_bytes, (SandboxError, asyncio.TimeoutError)):
            raise disk_bytes
        notes.append(f"no disk figure: du did not answer within {USAGE_DU_SECONDS:g} s")
    elif isinstance(disk_bytes, str):
        notes.append(disk_bytes)
    else:
        measured["disk_bytes"] = disk_bytes
    return usage_record(**measured, note="; ".join(notes) or None)


#: how long the workspace's ``du`` may run for a usage answer
USAGE_DU_SECONDS = 3.0


def _from_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """cpu_seconds, memory_bytes (page cache excluded, as ``docker stats`` shows) and memory_limit_bytes."""
    found: dict[str, Any] = {}
    cpu = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    if isinstance(cpu, (int, float)):
        found["cpu_seconds"] = cpu / 1e9
    memory = stats.get("memory_stats") or {}
    used = memory.get("usage")
    if isinstance(used, int):
        detail = memory.get("stats") or {}
        cache = detail.get("total_inactive_file", detail.get("inactive_file", 0))  # cgroup v1, v2
        found["memory_bytes"] = max(0, used - cache) if isinstance(cache, int) else used
    if isinstance(memory.get("limit"), int):
        found["memory_limit_bytes"] = memory["limit"]
    return found


class DockerSession(GatewaySession):
    """A docker session: the container base's session, whose commands and files go through its agent, behind
    its owner's egress gateway when it has a policy, plus the engine's resource figures and a pooled session's
    record."""

    def __init__(
        self,
        *args: Any,
        engine: DockerEngine,
        record: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        own_image: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._engine = engine
        #: whether the session's container runs an image committed for it (a fork's, see docker/forks)
        self.own_image = own_image
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
            return (
                int(result.stdout.split()[0]) * 1024
                if result.exit_code == 0
                else (f"no disk figure: du exited with status {result.exit_code}")
            )
        except (IndexError, ValueError):
            return "no disk figure: du gave no size"


def session_of(
    site: Any,
    engine: DockerEngine,
    container_id: str,
    labels: Mapping[str, str],
    env: Sequence[str] | None,
    *,
    record: str | None = None,
    pooled: bool = False,
) -> DockerSession:
    """The session of a container, from its labels and ``env``: the container's own environment, or for a
    pooled one (``record`` names its record volume) the spec env from the record, which then goes to every
    exec. One made by an older version without the agent is still listed, reaped and destroyed; its
    commands fail with the typed error of an agent that does not answer."""
    spec = spec_from_labels(labels, env)
    known = None if pooled or env is None else dict(item.split("=", 1) for item in env if "=" in item)
    return DockerSession(
        site,
        container_id,
        labels[LABEL_SESSION],
        spec,
        float(labels[LABEL_CREATED]),
        float(labels[LABEL_EXPIRES]),
        env=known,
        engine=engine,
        record=record,
        extra_env=spec.env if pooled else None,
        user=labels.get(LABEL_USER, ""),
        own_image=labels.get(LABEL_FORK) == labels[LABEL_SESSION],
    )


async def find_container(engine: DockerEngine, session_id: str) -> dict[str, Any] | None:
    """The description of the session's container: the one named for it (one engine call), else the one
    labelled for it (an older version's, or a renamed one); None when there is none (a pooled session's is
    found by its record)."""
    try:
        attrs = await engine.inspect_container(f"tai-{session_id}", what="find a session")
    except SandboxNotFoundError:
        attrs = {}
    if ((attrs.get("Config") or {}).get("Labels") or {}).get(LABEL_SESSION) == session_id:
        return attrs
    found = await engine.containers(f"{LABEL_SESSION}={session_id}", what="find a session")
    if not found:
        return None
    try:
        return await engine.inspect_container(found[0]["Id"], what="inspect a session")
    except SandboxNotFoundError:
        raise session_gone(session_id) from None
