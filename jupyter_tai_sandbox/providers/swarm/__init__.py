"""The swarm provider (``swarm``): a one-replica service per session on a Docker Swarm."""

from .sandbox import (
    LABEL_NODE,
    SwarmSandbox,
    SwarmSession,
)

__all__ = [
    "LABEL_NODE",
    "SwarmSandbox",
    "SwarmSession",
]
