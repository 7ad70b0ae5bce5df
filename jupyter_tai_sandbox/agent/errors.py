"""What the session agent's client raises: a refused or failed operation, or the lost connection."""

from __future__ import annotations


class AgentError(Exception):
    """An operation the agent refused or failed; ``code`` is its errno-style name (``ENOENT``, ``EBUSY``...)."""

    def __init__(self, code: str, message: str, op: str = "") -> None:
        super().__init__(f"{op + ': ' if op else ''}{message} [{code}]")
        self.code, self.message, self.op = code, message, op


class AgentConnectionLost(AgentError):
    """The channel to the agent ended: every pending and later call fails with this, never hangs."""

    def __init__(self, message: str = "the connection to the session agent ended") -> None:
        super().__init__("ECONNRESET", message)
