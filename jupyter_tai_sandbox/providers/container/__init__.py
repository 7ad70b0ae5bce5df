"""The container base: sessions, commands and files on the session agent, for any container engine.

``engine``   :class:`ContainerEngine`, the seam an engine adapter fills (create, remove, put an archive,
             open the agent's stream, inspect and list by labels)
``channel``  :class:`AgentChannel`, a session's one agent connection, reopened when it drops
``command``  :class:`ContainerCommand`, an agent command as the contract's handle (deadline, stops)
``files``    :class:`WorkspaceFiles`, workspace files confined by the agent (``openat2``)
``session``  :class:`ContainerSession`, one container's exec and files; :class:`ContainerSite`
"""

from .channel import AgentChannel
from .command import KILL_LIMIT_SECONDS, ContainerCommand
from .engine import ContainerEngine
from .files import TransferIdleError, WorkspaceFiles
from .session import WORKSPACE, CommandRegistry, ContainerSession, ContainerSite

__all__ = [
    "KILL_LIMIT_SECONDS",
    "WORKSPACE",
    "AgentChannel",
    "CommandRegistry",
    "ContainerCommand",
    "ContainerEngine",
    "ContainerSession",
    "ContainerSite",
    "TransferIdleError",
    "WorkspaceFiles",
]
