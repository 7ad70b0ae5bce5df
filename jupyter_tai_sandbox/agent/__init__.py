"""The session agent: a small static supervisor inside every container session (agent/PROTOCOL.md).

``protocol`` is the wire codec, ``client`` an asyncio client over any byte stream pair (``command``, one
command over it; ``errors``, what both raise), ``binary`` finds (or, in a checkout, builds) the binaries
the wheel ships.
"""

from .binary import AgentBinaryMissing, agent_binary, build_agent
from .client import AgentClient
from .command import AgentCommand, ExitStatus
from .errors import AgentConnectionLost, AgentError

__all__ = [
    "AgentBinaryMissing",
    "AgentClient",
    "AgentCommand",
    "AgentConnectionLost",
    "AgentError",
    "ExitStatus",
    "agent_binary",
    "build_agent",
]
