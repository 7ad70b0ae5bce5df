"""The disk ceiling of docker and swarm sessions: where a session may write, and how much.

A container's writable layer grows on the engine host's disk without bound on the storage most
engines use (overlay2 on ext4 cannot size it: ``storage_opt`` needs xfs with project quotas), and so
does an anonymous volume. With a ceiling, nothing a session writes lands on the engine's disk:

* the root filesystem is read-only;
* the ephemeral workspace is an anonymous ``local`` volume of type tmpfs, ``size=`` the ceiling.
  The engine mounts it on its host, so the archive API (uploads, downloads, path lookups) sees it
  as it sees any volume, and it goes with the container;
* ``/tmp`` is a tmpfs of the same size inside the container.

The kernel enforces each size (a write past it fails with ENOSPC). Both are memory: pages a
session's processes write are charged to its memory limit, so the tighter of the two applies.
A persistent workspace is a named volume on the engine's storage and is not capped here (see the docs: operators/providers/docker.md).
"""

from __future__ import annotations

from typing import Any

#: where a session with a ceiling may write besides its workspace
SCRATCH = "/tmp"


def workspace_driver(limit_mb: int) -> Any:
    """The ``local`` driver options of an ephemeral workspace of at most ``limit_mb`` MiB."""
    from .docker_engine import docker_sdk

    return docker_sdk().types.DriverConfig(
        "local", {"type": "tmpfs", "device": "tmpfs", "o": f"size={limit_mb}m,mode=1777"}
    )


def scratch_tmpfs(limit_mb: int | None) -> dict[str, str]:
    """The container's ``tmpfs`` option for /tmp: sized when there is a ceiling, executable either way."""
    size = f",size={limit_mb}m" if limit_mb else ""
    return {SCRATCH: f"rw,exec,nosuid,nodev,mode=1777{size}"}
