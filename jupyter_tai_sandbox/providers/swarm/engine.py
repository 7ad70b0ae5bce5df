"""SwarmEngine: a DockerEngine that also speaks TLS on its exec streams and the swarm manager's API.

The swarm provider talks to two kinds of engines, both through this class:

* the **manager** (``SwarmSandbox.base_url``): services, tasks, nodes, overlay
  networks and configs (the workspace records);
* each **node's** engine (its address from a node label): everything the
  docker provider does in a container -- commands, files, volumes -- through
  the :class:`~.docker_engine.DockerEngine` methods it inherits.

A ``tcp://`` engine with TLS client certificates gets them on the SDK's
requests *and* on the exec streams the docker provider opens itself
(``docker_engine.stream``), through :class:`TlsEngineAddress`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...contract import SandboxNotFoundError, SandboxUnavailableError
from ..docker_engine import DEFAULT_TIMEOUT, DockerEngine, EngineRefusedError, docker_sdk
from ..docker_engine.stream import READ_SIZE, EngineAddress


class TlsMaterial:
    """A CA and a client certificate and key: the SDK's TLSConfig and an ssl context for exec streams."""

    def __init__(self, ca: str, cert: str, key: str) -> None:
        self.ca, self.cert, self.key = ca, cert, key

    def sdk(self) -> Any:
        return _tls_config(docker_sdk())(client_cert=(self.cert, self.key), ca_cert=self.ca, verify=True)

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context


def _tls_config(docker: Any) -> type:
    class PinnedTLSConfig(docker.tls.TLSConfig):
        """The SDK's TLSConfig, but the CA given wins over $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE
        (which ``requests`` would otherwise put in place of the session's CA on every request)."""

        def configure_client(self, client: Any) -> None:
            super().configure_client(client)
            client.trust_env = False

    return PinnedTLSConfig


class TlsEngineAddress(EngineAddress):
    """A ``tcp://`` engine reached over TLS (the certificate checked against the address)."""

    def __init__(self, base_url: str, context: ssl.SSLContext, *, limit: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(base_url)
        self._context = context
        #: longest a connection (with its TLS handshake) may take
        self._limit = limit

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=READ_SIZE, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: protocol, self.host, self.port, ssl=self._context), self._limit
            )
        except (TimeoutError, OSError, ssl.SSLError) as e:
            raise SandboxUnavailableError(f"cannot reach the Docker engine at {self.url}: {e}") from e
        return reader, TlsHalfCloseWriter(transport, protocol, reader, loop)


class TlsHalfCloseWriter(asyncio.StreamWriter):
    """A TLS stream writer that can end the command's stdin while its output still comes.

    asyncio's TLS transport has no half-close (``can_write_eof()`` is False), but
    an exec's stdin ends only at the end of the connection's sending side. So
    ``write_eof`` waits until everything written is on the wire, then shuts the
    TCP socket's sending side: the engine's TLS layer reads an end of stream at a
    record boundary, ends the command's stdin, and keeps sending its output.
    """

    _half_closing: asyncio.Task[None] | None = None

    def can_write_eof(self) -> bool:
        return not self.transport.is_closing()

    def write_eof(self) -> None:
        if self._half_closing is None:
            self._half_closing = asyncio.get_running_loop().create_task(self._half_close())

    def _unsent(self) -> int:
        transport = self.transport
        inner = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
        return transport.get_write_buffer_size() + (inner.get_write_buffer_size() if inner is not None else 0)

    async def _half_close(self) -> None:
        while self._unsent() and not self.transport.is_closing():
            await asyncio.sleep(0.005)
        sock = self.transport.get_extra_info("socket")
        if sock is not None and not self.transport.is_closing():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)


class SwarmEngine(DockerEngine):
    """One engine of the swarm (the manager or a node), optionally over TLS."""

    def __init__(
        self,
        base_url: str,
        *,
        tls: TlsMaterial | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        scope: Mapping[str, str] | None = None,
    ) -> None:
        material = tls if tls is not None and base_url.startswith(("tcp://", "https://")) else None
        super().__init__(
            base_url, tls=material.sdk() if material is not None else None, timeout=timeout, scope=scope
        )
        self._material = material
        self._connect_limit = timeout

    async def connect(self) -> None:
        await super().connect()
        if self._material is not None and not isinstance(self._address, TlsEngineAddress):
            self._address = TlsEngineAddress(
                self.base_url, self._material.context(), limit=self._connect_limit
            )

    # ------------------------------------------------------------ services

    async def create_service(
        self, task_template: Mapping[str, Any], *, name: str, labels: Mapping[str, str]
    ) -> str:
        """Create a one-replica service; its id."""
        created = await self._call(
            "create a service",
            "create_service",
            dict(task_template),
            name=name,
            labels=self.scoped_labels(labels),
            mode=docker_sdk().types.ServiceMode("replicated", replicas=1),
            endpoint_spec=docker_sdk().types.EndpointSpec(mode="dnsrr"),
        )
        return str(created["ID"])

    async def services(self, label: str | Sequence[str]) -> list[dict[str, Any]]:
        """The deployment's services carrying ``label`` (all of a list)."""
        found = await self._call("list services", "services", filters={"label": self.label_filter(label)})
        return list(found or [])

    async def set_service_labels(self, service_id: str, changes: Mapping[str, str]) -> None:
        """Change labels of a service (its task template untouched: the task keeps running); an update
        that raced another one (the service's version moved) is tried again."""
        docker = docker_sdk()

        def update() -> None:
            # the stored spec goes back as it is, but for its labels: the SDK's update_service (even with
            # fetch_current_spec) fills defaults into the task template (StopGracePeriod, DNSConfig), and a
            # changed template makes the manager replace the task: a new container, the session's state lost
            api = self._api
            for attempt in range(5):
                current = api.inspect_service(service_id)
                spec = dict(current.get("Spec") or {})
                spec["Labels"] = {**(spec.get("Labels") or {}), **changes}
                try:
                    response = api._post_json(
                        api._url("/services/{0}/update", service_id),
                        data=spec,
                        params={"version": current["Version"]["Index"]},
                    )
                    api._raise_for_status(response)
                    return
                except docker.errors.APIError as e:
                    if attempt == 4 or "out of sequence" not in str(e):
                        raise

        await self._call("update a service's labels", update)

    async def remove_service(self, service_id: str) -> None:
        """Remove a service; a missing one is fine."""
        with contextlib.suppress(SandboxNotFoundError):
            await self._call("remove a service", "remove_service", service_id)

    async def tasks(self, service_id: str) -> list[dict[str, Any]]:
        """The service's tasks, newest first."""
        found = await self._call("list tasks", "tasks", filters={"service": service_id})
        return sorted(found or [], key=lambda t: t.get("CreatedAt", ""), reverse=True)

    # --------------------------------------------------------------- nodes

    async def node(self, node_id: str) -> dict[str, Any] | None:
        try:
            return await self._call("inspect a node", "inspect_node", node_id)
        except SandboxNotFoundError:
            return None

    async def nodes(self) -> list[dict[str, Any]]:
        return list(await self._call("list nodes", "nodes") or [])

    # ------------------------------------------------------------ networks

    async def ensure_overlay(
        self, name: str, *, labels: Mapping[str, str], subnet: Callable[[list[dict[str, Any]]], str]
    ) -> None:
        """Create the internal, attachable overlay network ``name`` unless it exists; ``subnet`` picks
        its IPv4 subnet from the manager's networks (see DockerEngine.ensure_network)."""
        await self._call(
            f"create network {name}",
            self._ensure_network,
            name,
            labels,
            subnet,
            "swarm",
            driver="overlay",
            internal=True,
            attachable=True,
        )

    async def overlays(self, label: str) -> list[dict[str, Any]]:
        """The deployment's overlay networks carrying ``label``."""
        found = await self._call(
            "list networks", "networks", filters={"label": self.label_filter(label), "driver": "overlay"}
        )
        return list(found or [])

    async def drop_overlay(self, name: str) -> bool:
        """Remove the deployment's network ``name`` unless a service still uses it; True when it is gone
        (or is not the deployment's)."""
        try:
            found = await self._call(f"inspect network {name}", "inspect_network", name)
        except SandboxNotFoundError:
            return True
        if not self.in_scope(found.get("Labels")):
            return True
        try:
            await self._call(f"remove network {name}", "remove_network", name)
        except SandboxNotFoundError:
            return True
        except EngineRefusedError:
            return False  # in use (a service, or a task not yet cleaned up)
        return True

    async def network_disconnect(self, container_id: str, network: str) -> None:
        await self._call(
            f"disconnect a container from {network}",
            "disconnect_container_from_network",
            container_id,
            network,
        )

    # -------------------------------------------------- configs (records)

    async def configs(self, name: str) -> list[dict[str, Any]]:
        """The deployment's swarm configs named exactly ``name``."""
        found = await self._call("list configs", "configs", filters={"name": name})
        return [
            c
            for c in found or []
            if c.get("Spec", {}).get("Name") == name and self.in_scope(c.get("Spec", {}).get("Labels"))
        ]

    async def create_config(self, name: str, data: bytes, labels: Mapping[str, str]) -> bool:
        """Create a config of the deployment; False when one of that name exists already."""
        try:
            await self._call(f"record {name}", "create_config", name, data, labels=self.scoped_labels(labels))
        except EngineRefusedError as e:
            if e.status == 409:
                return False
            raise
        return True

    async def remove_config(self, config_id: str) -> None:
        with contextlib.suppress(SandboxNotFoundError):
            await self._call("remove a record", "remove_config", config_id)
