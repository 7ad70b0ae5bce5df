"""EngineNetworks: the network calls of a :class:`~.docker_engine.DockerEngine`.

The deployment's bridge networks: made unless they exist (on a subnet no other
network holds), listed, joined and left, and removed once no container is on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .calls import EngineCalls, EngineRefusedError, docker_sdk, readable

#: how long a network's removal waits for the endpoints of containers just removed to go
LEAVING_WAIT_SECONDS = (
    10.0  # 3 s was not enough for a loaded engine (an egress network left in two -n 4 runs)
)


class EngineNetworks(EngineCalls):
    """The network calls of one engine (a mixin of :class:`~.docker_engine.DockerEngine`)."""

    # ------------------------------------------------------------ networks

    async def ensure_network(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        options: Mapping[str, str],
        internal: bool,
        subnet: Callable[[list[dict[str, Any]]], str],
    ) -> str:
        """Create the bridge network ``name`` unless it exists; its id (a network removed and made again under
        the same name has a new one). ``subnet`` picks its IPv4 subnet from the engine's networks (every
        network, so it overlaps none; it raises when none is free); a subnet a concurrent creator took
        meanwhile is picked again."""
        return await self._slow_call(
            f"create network {name}",
            self._ensure_network,
            name,
            labels,
            subnet,
            "engine",
            driver="bridge",
            internal=internal,
            options=dict(options),
        )

    def _ensure_network(
        self,
        name: str,
        labels: Mapping[str, str],
        subnet: Callable[[list[dict[str, Any]]], str],
        where: str,
        **create: Any,
    ) -> str:
        """(Blocking.) Create the network ``name`` (the engine's ``create`` options) unless it exists, on a subnet
        ``subnet`` picks from every network of the engine; a name another creator took meanwhile is found, a
        subnet taken meanwhile picked again. ``where``: the engine as an error names it ("this swarm")."""
        docker = docker_sdk()
        api = self._api
        for _ in range(8):
            found = [n for n in api.networks(names=[name]) if n.get("Name") == name]
            if found:
                if not self.in_scope(found[0].get("Labels")):
                    raise EngineRefusedError(
                        f"network {name} belongs to another deployment on this {where}",
                        status=409,
                        detail="taken",
                    )
                return str(found[0].get("Id"))
            ipam = docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet=subnet(api.networks()))]
            )
            try:
                made = api.create_network(
                    name, check_duplicate=True, ipam=ipam, labels=self.scoped_labels(labels), **create
                )
                return str(made.get("Id"))
            except docker.errors.APIError as e:
                # another provider on this engine made it meanwhile: a 409, or (the engine's duplicate check
                # is no lock) its bridge, whose interface name is the network's own, is there already
                if e.status_code == 409 or "same bridge name" in readable(e):
                    time.sleep(0.05)
                    continue
                if "overlap" not in readable(e).lower():  # a subnet taken meanwhile: pick again
                    raise
        raise EngineRefusedError(
            f"network {name}: every subnet picked was taken meanwhile", status=409, detail="subnet race"
        )

    async def networks(self, label: str) -> list[dict[str, Any]]:
        """The deployment's networks carrying ``label``."""
        found = await self._call("list networks", "networks", filters={"label": self.label_filter(label)})
        return list(found or [])

    async def inspect_network(self, name: str) -> dict[str, Any]:
        """The engine's description of network ``name`` (its subnet, its containers' addresses);
        SandboxNotFoundError when there is none."""
        return dict(await self._call(f"inspect network {name}", "inspect_network", name) or {})

    async def network_connect(self, container_id: str, network: str) -> None:
        await self._slow_call(
            f"connect a container to {network}", "connect_container_to_network", container_id, network
        )

    async def network_disconnect(self, container_id: str, network: str) -> None:
        await self._call(
            f"disconnect a container from {network}",
            "disconnect_container_from_network",
            container_id,
            network,
        )

    async def drop_network_if_idle(self, name: str, *, leaving: Collection[str] = ()) -> bool:
        """Remove network ``name`` when no container is on it; True when it is gone.

        ``leaving`` are containers just removed: the engine can list their endpoints (and refuse the
        removal for them) for a moment after a container is gone, so they are waited out, for at most
        ``LEAVING_WAIT_SECONDS``, instead of being taken for users of the network (which left the
        network behind until the reaper's grace). So is the endpoint of any container that no longer
        exists: another session's, removed just before, whose own removal gave up on this caller's
        container (each saw the other's endpoint and left the network to the other)."""
        docker = docker_sdk()

        def gone(container_id: str) -> bool:
            if any(container_id.startswith(g) or g.startswith(container_id) for g in leaving):
                return True
            try:
                self._client.api.inspect_container(container_id)
            except docker.errors.NotFound:
                return True
            return False

        def still_leaving(on: Collection[str]) -> bool:
            return bool(on) and all(gone(c) for c in on)

        def drop() -> bool:
            deadline = time.monotonic() + LEAVING_WAIT_SECONDS
            for network in self._client.networks.list(names=[name]):
                if network.name != name or not self.in_scope(network.attrs.get("Labels")):
                    continue
                while True:
                    network.reload()
                    on = list(network.attrs.get("Containers") or {})
                    if not on:
                        try:
                            network.remove()
                            break
                        except docker.errors.NotFound:
                            break
                        except docker.errors.APIError:
                            pass  # an endpoint still going, or a container joined meanwhile: look again
                    elif not still_leaving(on):
                        return False
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
            return True

        return await self._slow_call(f"remove network {name}", drop)
