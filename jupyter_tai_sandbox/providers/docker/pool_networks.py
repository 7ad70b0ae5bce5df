"""Where the warm pool's containers wait, and how a claim moves one to its session owner's network.

A pooled container waits on the deployment's holding network (internal, no host address, no traffic
between its containers: it reaches nothing), or, as an owner's spare, on that owner's egress network
(see ``pool``). The claim of one from the holding network joins the owner's egress network,
writes the session's record (:meth:`WarmPool.claim`), and leaves the holding network in the background.

Claims run side by side: a join to an owner network whose firewall rules are in force takes neither the
network's lock nor an engine listing (one engine call: the connect). The engine itself keeps a network with a
container on it from being removed, so a removal racing the join either fails (the network stays) or comes
first (the join finds no network, and makes it again under the lock, once for all the claims waiting on it).
A start of a pooled container holds the network's lock only while the network is made; the pool's own
removals leave alone a network a pooled container waits or starts on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ...contract import SandboxCapacityError, SandboxError, SandboxNotFoundError
from .._docker_networks import NetworkLocks, SessionBridges
from ..container.command import in_background
from ..docker_engine import DockerEngine
from .pool import Ready, WarmPool

#: how long a claimed container's leaving of the holding network waits for the claims under way to end (its
#: engine call would slow them), and how many such leavings run at once
LEAVE_WAIT_SECONDS = 5.0
LEAVES_AT_ONCE = 2
#: joins of a pooled container to an owner network that was removed meanwhile, and made again, before a claim
#: gives up
JOIN_ATTEMPTS = 3


def network_missing(error: SandboxError, network: str) -> bool:
    """Whether ``error`` is the engine's "network <name> not found" for ``network`` (not a missing container)."""
    return isinstance(error, SandboxNotFoundError) and f"network {network} not found" in str(error)


class PoolNetworks:
    """The networks of the warm pool's containers: the holding network ``holding`` and owners' egress
    networks. Making a network and removing one hold its lock; joins do not (see the module's docstring)."""

    def __init__(
        self,
        engine: DockerEngine,
        pool: WarmPool,
        bridges: SessionBridges,
        locks: NetworkLocks,
        *,
        holding: str,
        log: Any,
        full_error: Callable[[SandboxError, str], SandboxCapacityError | None] = lambda e, network: None,
    ) -> None:
        self._engine = engine
        self._pool = pool
        self._bridges = bridges
        self._locks = locks
        self.holding = holding
        #: the typed refusal of a join to a full network (the provider's, naming its setting), else None
        self._full_error = full_error
        self._log = log
        #: networks being made for claims, each once for every claim that found it missing
        self._making: dict[str, asyncio.Future[None]] = {}
        self._leaving: asyncio.Semaphore | None = None

    async def start_on(self, network: str, start: Callable[[str], Awaitable[str]]) -> str:
        """``start(network)`` on ``network`` (an owner's egress network), or on the holding network for '',
        once that network is there with its firewall rules; the container's id. The network's lock is held
        while it is made, not during the start (starts run side by side; the pool keeps the network meanwhile:
        see :meth:`drop_idle`); a network removed in between (by another server) is made again."""
        kind = "egress" if network else "pool"
        network = network or self.holding
        for attempt in range(2):
            async with self._locks.hold(network):
                await self._bridges.ensure(network, kind)
            try:
                return await start(network)
            except SandboxError as e:
                if attempt or not network_missing(e, network):
                    raise
        raise AssertionError("unreachable")

    async def claim(
        self, ready: Ready, labels: Mapping[str, str], env: Mapping[str, str], network: str
    ) -> str | None:
        """Make a pooled container the session's, moving it to its owner's egress network ``network`` unless
        it waits there already; its record, or None when that failed (the container is then removed)."""
        with self._pool.claiming():
            if ready.network == network:  # the owner's spare
                return await self._pool.claim(ready, labels, env)
            container_id = ready.container_id
            try:
                await self._join(container_id, network)
            except SandboxError as e:
                self._pool.discard(container_id)
                with contextlib.suppress(SandboxError):
                    async with self._locks.hold(network):
                        await self._bridges.drop(network)
                if isinstance(e, SandboxCapacityError):
                    raise
                full = self._full_error(e, network)
                if full is not None:
                    raise full from None
                self._log.warning("sandbox-docker: a pooled container could not join %s: %s", network, e)
                return None
            record = await self._pool.claim(ready, labels, env)
            if record is None:
                with contextlib.suppress(SandboxError):
                    async with self._locks.hold(network):
                        await self._bridges.drop(network)
                return None
        # off the holding network after the claim, and after the claims under way (a slow engine call the
        # session need not wait for): it is internal, with no host address and no traffic between its
        # containers, so meanwhile it reaches nothing
        in_background(self._leave_holding(container_id, ready.session_id))
        return record

    async def _join(self, container_id: str, network: str) -> None:
        """Connect the container to the owner network ``network``, its firewall rules in force first: made
        (with them) when missing, by one of the claims that found it so."""
        for attempt in range(1, JOIN_ATTEMPTS + 1):
            if not self._bridges.firewall.in_force(network):
                await self._made(network)  # its rules are set as it is made, or found
            try:
                await self._engine.network_connect(container_id, network)
            except SandboxError as e:
                if attempt == JOIN_ATTEMPTS or not network_missing(e, network):
                    raise
                await self._made(network)
                continue
            if self._bridges.firewall.in_force(network):
                return
            # removed and made again (its rules released, then set anew) while the container joined: its
            # rules are in force once the make under way is done, or this one
            await self._made(network)
            return

    async def _made(self, network: str) -> None:
        """Make the owner network ``network`` unless it exists (and its firewall rules), under its lock;
        claims that ask while a make is under way wait for that one."""
        making = self._making.get(network)
        if making is None:
            making = asyncio.ensure_future(self._make(network))
            self._making[network] = making
            making.add_done_callback(lambda _: self._making.pop(network, None))
        await asyncio.shield(making)

    async def _make(self, network: str) -> None:
        async with self._locks.hold(network):
            await self._bridges.ensure(network, "egress")

    async def _leave_holding(self, container_id: str, session_id: str) -> None:
        await self._pool.claims_ended(LEAVE_WAIT_SECONDS)
        if self._leaving is None:
            self._leaving = asyncio.Semaphore(LEAVES_AT_ONCE)
        try:
            async with self._leaving:
                # not for a session that ended meanwhile: its container's removal takes it off every network, and
                # a disconnect racing that removal can leave the engine an endpoint that keeps the network
                if self._pool.knows(session_id):
                    await self._engine.network_disconnect(container_id, self.holding)
        except SandboxNotFoundError:
            pass  # the session already ended
        except SandboxError as e:
            self._log.warning(
                "sandbox-docker: %s stays on the pool's network (it reaches nothing there): %s",
                container_id[:12],
                e,
            )

    async def drop_idle(self, owner_networks: Iterable[str]) -> None:
        """Remove, when idle, the owner networks of pooled sessions a pool reap may just have removed (it
        removes their containers, not through a teardown), and the holding network; not one a pooled
        container waits or starts on."""
        for network in {*owner_networks, self.holding}:
            if not self._pool.busy_on("" if network == self.holding else network):
                await self._bridges.drop_if_idle(network)

    async def close(self) -> None:
        """Remove the networks the pool waited on, when idle (another provider's pool may use them)."""
        for network in {self.holding, *self._pool.kept_networks}:
            await self._bridges.drop_if_idle(network)
