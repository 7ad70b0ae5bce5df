"""Where the warm pool's containers wait, and how a claim moves one to its session owner's network.

A pooled container waits on the deployment's holding network (internal, no host address, no traffic
between its containers: it reaches nothing), or, as an owner's spare, on that owner's egress network
(see ``pool``). The claim of one from the holding network joins the owner's egress network,
writes the session's record (:meth:`WarmPool.claim`), and leaves the holding network in the background.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ...contract import SandboxCapacityError, SandboxError, SandboxNotFoundError
from .._docker_networks import NetworkLocks, SessionBridges
from ..container.command import in_background
from ..docker_engine import DockerEngine
from .pool import Ready, WarmPool


class PoolNetworks:
    """The networks of the warm pool's containers: the holding network ``holding`` and owners' egress
    networks. Every join and removal holds the network's lock."""

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

    async def start_on(self, network: str, start: Callable[[str], Awaitable[str]]) -> str:
        """``start(network)`` on ``network`` (an owner's egress network), or on the holding network for '',
        once that network is there with its firewall rules; the container's id."""
        kind = "egress" if network else "pool"
        network = network or self.holding
        async with self._locks.hold(network):
            await self._bridges.ensure(network, kind)
            return await start(network)

    async def claim(
        self, ready: Ready, labels: Mapping[str, str], env: Mapping[str, str], network: str
    ) -> str | None:
        """Make a pooled container the session's, moving it to its owner's egress network ``network`` unless
        it waits there already; its record, or None when that failed (the container is then removed)."""
        if ready.network == network:  # the owner's spare
            return await self._pool.claim(ready, labels, env)
        container_id = ready.container_id
        async with self._locks.hold(network):
            try:
                await self._bridges.ensure(network, "egress")
                await self._engine.network_connect(container_id, network)
            except SandboxError as e:
                self._pool.discard(container_id)
                with contextlib.suppress(SandboxError):
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
                    await self._bridges.drop(network)
                return None
        # off the holding network after the claim (a slow engine call the session need not wait for): it is
        # internal, with no host address and no traffic between its containers, so meanwhile it reaches nothing
        in_background(self._leave_holding(container_id))
        return record

    async def _leave_holding(self, container_id: str) -> None:
        try:
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
        removes their containers, not through a teardown), and the holding network unless a container waits."""
        for network in {*owner_networks, self.holding}:
            if network != self.holding or not self._pool.ready_count():
                await self._bridges.drop_if_idle(network)

    async def close(self) -> None:
        """Remove the networks the pool waited on, when idle (another provider's pool may use them)."""
        for network in {self.holding, *self._pool.kept_networks}:
            await self._bridges.drop_if_idle(network)
