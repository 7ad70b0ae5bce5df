"""Where a swarm's persistent workspaces live: one record per workspace on the manager.

A persistent workspace is a volume local to one node. The node holding it is recorded in a swarm config
(``tai-ws-<hash of deployment, key and owner>``, labelled with the key, node and owner) on the manager, so
any server finds it, and a session with that key is constrained to that node. A new workspace goes where
the scheduler puts the session, and is recorded then; one whose node left the swarm starts afresh.

Keys are a namespace per owner (providers/_workspaces): an owner's ``key`` is the key's unscoped record
and volume (``tai-ws-<hash of deployment and key>``, ``tai-sbx-<tag>-<key>``) when no owner is asking or
that record names the asking owner (made before keys were per owner); else the owner's own
(:func:`record_name` and ``Deployment.workspace_volume`` with the owner).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...contract import SandboxNotFoundError, SandboxUnavailableError, SessionSpec
from .._workspaces import unscoped_serves
from ..docker_engine.names import LABEL_OWNER, LABEL_WORKSPACE, Deployment
from .engine import SwarmEngine
from .session import LABEL_NODE, record_name


class WorkspaceRecords:
    """The deployment's workspace records on the swarm manager."""

    def __init__(
        self, manager: SwarmEngine, scope: Deployment, labels: Mapping[str, str], log: Any, home_owner: str
    ) -> None:
        self._manager = manager
        self._scope = scope
        self._labels = dict(labels)
        self._log = log
        self._home_owner = home_owner

    async def _scoped(self, spec: SessionSpec) -> str | None:
        """None when the spec's workspace is its key's unscoped record and volume, else its owner."""
        if spec.owner is None:
            return None
        key = str(spec.workspace_key)
        found = await self._manager.configs(record_name(self._scope, key))
        recorded = (found[0]["Spec"].get("Labels") or {}).get(LABEL_OWNER) if found else None
        home = spec.owner == self._home_owner
        has_scoped = (
            home
            and recorded is None
            and bool(await self._manager.configs(record_name(self._scope, key, spec.owner)))
        )
        return None if unscoped_serves(spec.owner, recorded, home=home, has_scoped=has_scoped) else spec.owner

    async def volume(self, spec: SessionSpec) -> str:
        """The name of the volume that is the spec's workspace (on the node it lives on)."""
        return self._scope.workspace_volume(str(spec.workspace_key), await self._scoped(spec))

    async def _record_name(self, spec: SessionSpec) -> str:
        return record_name(self._scope, str(spec.workspace_key), await self._scoped(spec))

    async def find(self, spec: SessionSpec) -> dict[str, Any] | None:
        """The record of the spec's workspace (None: a new one)."""
        found = await self._manager.configs(await self._record_name(spec))
        if not found:
            return None
        labels = found[0]["Spec"].get("Labels") or {}
        recorded = labels.get(LABEL_OWNER)
        if spec.owner is not None and recorded is not None and recorded != spec.owner:
            # only two owners whose record names meet get here: never mount another's
            raise SandboxNotFoundError(
                f"no workspace {spec.workspace_key!r} can be made for this owner: name another key"
            )
        return found[0]

    async def pin(self, spec: SessionSpec) -> str | None:
        """The node a persistent workspace lives on (None: anywhere); its node down is SandboxUnavailableError."""
        record = await self.find(spec)
        if record is None:
            return None
        node_id = (record["Spec"].get("Labels") or {}).get(LABEL_NODE, "")
        node = await self._manager.node(node_id)
        if node is None:
            # the node left the swarm, and its volume with it: the key starts afresh
            self._log.warning(
                "sandbox-swarm: workspace %s was on node %s, gone from the swarm", spec.workspace_key, node_id
            )
            await self._manager.remove_config(record["ID"])
            return None
        state = (node.get("Status") or {}).get("State")
        if state != "ready":
            hostname = (node.get("Description") or {}).get("Hostname", node_id)
            raise SandboxUnavailableError(
                f"workspace {spec.workspace_key!r} lives on node {hostname}, which is {state}: try again when it is back"
            )
        return node_id

    async def keep(self, spec: SessionSpec, node_id: str) -> bool:
        """Record a new workspace on ``node_id``; False when another session recorded it elsewhere first."""
        key = str(spec.workspace_key)
        labels = {**self._labels, LABEL_WORKSPACE: key, LABEL_NODE: node_id}
        if spec.owner is not None:
            labels[LABEL_OWNER] = spec.owner
        data = json.dumps({"workspace": key, "node": node_id, "owner": spec.owner}).encode()
        if await self._manager.create_config(await self._record_name(spec), data, labels):
            return True
        record = await self.find(spec)
        return record is not None and (record["Spec"].get("Labels") or {}).get(LABEL_NODE) == node_id

    async def forget(self, spec: SessionSpec) -> None:
        """The record of the spec's workspace, once its volume is removed."""
        for record in await self._manager.configs(await self._record_name(spec)):
            await self._manager.remove_config(record["ID"])
