"""The Docker Engine API adapter, used by the docker, swarm and vm providers: every call this package
makes to a Docker engine (:class:`DockerEngine`), and the labels, prefixes and paths its things carry
(``names``)."""

from .engine import (
    DEFAULT_SLOW_TIMEOUT,
    DEFAULT_TIMEOUT,
    LEAVING_WAIT_SECONDS,
    READ_FILE_LIMIT,
    RUN_OUTPUT_LIMIT,
    WORKERS,
    WORKERS_PER_PRINCIPAL,
    DockerEngine,
    EngineRefusal,
    EngineRefusedError,
    MissingImageError,
    docker_sdk,
    readable,
)

__all__ = [
    "DEFAULT_SLOW_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "LEAVING_WAIT_SECONDS",
    "READ_FILE_LIMIT",
    "RUN_OUTPUT_LIMIT",
    "WORKERS",
    "WORKERS_PER_PRINCIPAL",
    "DockerEngine",
    "EngineRefusal",
    "EngineRefusedError",
    "MissingImageError",
    "docker_sdk",
    "readable",
]
