"""One connection to a session's agent, shared by every call of the session.

The connection is opened on first use and reused by every command, transfer and look-up;
one that dropped (its relay killed, the engine's stream cut) is opened again on the next
call. An agent that is gone makes every call fail promptly with a :class:`SandboxError`
(never a hang): the open is bounded, and a lost connection fails everything waiting on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from ...agent import AgentClient, AgentError
from ...contract import SandboxError, SandboxNotFoundError
from ...metrics.hooks import agent_reconnect
from .command import in_background

#: the longest an open of the agent's connection (engine exec + handshake) may take
OPEN_LIMIT_SECONDS = 10.0


def agent_failure(error: BaseException, what: str) -> SandboxError:
    """An agent's refusal or a lost connection as the contract's error."""
    if isinstance(error, SandboxError):
        return error
    return SandboxError(f"{what}: the session agent failed: {error}")


class AgentChannel:
    """The session's one agent connection: ``await channel.client()`` gives a live one."""

    def __init__(
        self,
        open_: Callable[[], Awaitable[AgentClient]],
        *,
        session_id: str,
        limit: float = OPEN_LIMIT_SECONDS,
        still_there: Callable[[], Awaitable[bool]] | None = None,
        answer_within: float = 2.0,
    ) -> None:
        self._open = open_
        self._answer_within = answer_within
        #: whether the session's container still runs (asked by a client whose write waits: AgentClient.still_there)
        self._still_there = still_there
        #: the session this channel serves, as its errors name it (a pooled container's is set at its claim)
        self.session_id = session_id
        self._limit = limit
        self._client: AgentClient | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> bool:
        """No live connection is open (none yet, or the last one ended)."""
        return self._client is None or self._client.lost

    async def client(self) -> AgentClient:
        client = self._client
        if client is not None and not client.lost:
            return client
        async with self._lock:
            if self._closed:
                raise SandboxNotFoundError(f"session {self.session_id} is gone")
            if self._client is not None and not self._client.lost:
                return self._client
            old, self._client = self._client, None
            if old is not None:
                in_background(old.close())
                agent_reconnect()  # the one before was lost: counted when a server's metrics are on
            try:
                self._client = await asyncio.wait_for(self._open(), self._limit)
                self._client.still_there = self._still_there
                self._client.answer_within = self._answer_within
            except TimeoutError:
                raise SandboxError(
                    f"the agent of session {self.session_id} did not answer within {self._limit:g} s"
                ) from None
            except AgentError as e:
                raise SandboxError(f"the agent of session {self.session_id} cannot be reached: {e}") from None
            return self._client

    async def close(self) -> None:
        """Close the connection (the agent's commands keep running); later calls fail."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
