"""The Jupyter server extension: configuration, provider loading, the reaper, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Integer, Unicode, default, validate
from traitlets.config import Configurable

from . import sandboxes
from ._version import __version__
from .contract import Sandbox, SandboxError, SandboxSession, SessionSpec
from .policy import SandboxPolicy
from .providers.local import LocalSandbox


def _provider_classes() -> list[type]:
    classes: list[type] = [SandboxPolicy, LocalSandbox]
    with contextlib.suppress(ImportError):
        from .providers.docker import DockerSandbox

        classes.append(DockerSandbox)
    return classes


class SessionRegistry:
    """The sessions this server created, so shutdown stops exactly those."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    async def create(self, spec: SessionSpec) -> SandboxSession:
        session = await sandboxes.require_sandbox().create(spec)
        self.ids.add(session.id)
        return session

    def forget(self, session_id: str) -> None:
        self.ids.discard(session_id)


class SandboxApp(ExtensionApp):
    """Sandbox sessions for Jupyter: REST and websocket API under /api/sandbox."""

    name = "jupyter_tai_sandbox"
    app_name = "jupyter-tai-sandbox"
    description = "Sandbox sessions: a workspace, exec, file transfer and a TTL reap, behind one policy."
    version = __version__
    load_other_extensions = True
    classes = _provider_classes()

    provider = Unicode(
        help="""The sandbox provider (TAI_MCP_SANDBOX, the sandbox_module setting): 'off' (default),
        'local' (host subprocesses, no isolation), 'docker' (one container per session), or
        'module:Class' naming an external Sandbox provider class.""",
    ).tag(config=True)

    reap_interval = Float(
        30.0,
        help="Seconds between two passes of the reaper, which destroys sessions past their TTL.",
    ).tag(config=True)

    max_upload_bytes = Integer(
        1 << 30,
        help="Largest file accepted by an upload (PUT sessions/{id}/files/{path}), in bytes; larger gets 413.",
    ).tag(config=True)

    @default("provider")
    def _provider_default(self) -> str:
        return os.environ.get("TAI_MCP_SANDBOX", "off").strip() or "off"

    @validate("provider")
    def _check_provider(self, proposal: Any) -> str:
        value = proposal["value"].strip()
        return "off" if value.lower() in sandboxes.OFF_VALUES else value

    def initialize_settings(self) -> None:
        self.policy = SandboxPolicy(parent=self)
        self.registry = SessionRegistry()
        self._reaper: asyncio.Task[None] | None = None
        if self.provider == "off":
            sandboxes.disable_sandbox()
            self.log.info(
                "jupyter_tai_sandbox: no sandbox provider (set SandboxApp.provider or TAI_MCP_SANDBOX)"
            )
        else:
            provider = self._make_provider()
            sandboxes.register_sandbox(provider, policy=self.policy, replace=True)
            self.log.info(
                "jupyter_tai_sandbox: %s provider, isolation floor %s, egress ceiling %s",
                provider.kind,
                self.policy.isolation,
                self.policy.egress,
            )
        self.settings.update(
            {
                "tai_sandbox_app": self,
                "tai_sandbox_registry": self.registry,
                "tai_sandbox_policy": self.policy,
            }
        )

    def _make_provider(self) -> Sandbox:
        cls = sandboxes.load_provider_class(self.provider)
        if issubclass(cls, Configurable):
            return cls(parent=self)  # type: ignore[call-arg]
        return cls()

    def initialize_handlers(self) -> None:
        from .handlers import SESSION_ID, rest_handlers
        from .ws import ExecWebSocketHandler

        self.handlers.extend(rest_handlers)
        self.handlers.append((rf"/api/sandbox/sessions/{SESSION_ID}/exec/ws", ExecWebSocketHandler))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        self.start_reaper()

    def start_reaper(self) -> None:
        if self._reaper is None and self.provider != "off":
            self._reaper = asyncio.create_task(self._reap_forever())

    async def _reap_forever(self) -> None:
        while True:
            await self.reap_once()
            await asyncio.sleep(self.reap_interval)

    async def reap_once(self) -> list[str]:
        try:
            reaped = await sandboxes.require_sandbox().reap()
        except SandboxError as e:
            self.log.warning("jupyter_tai_sandbox: reaping failed: %s", e)
            return []
        for session_id in reaped:
            self.registry.forget(session_id)
        return reaped

    async def stop_extension(self) -> None:
        """Stop every session this server started (persistent workspaces are kept)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self.provider == "off":
            return
        try:
            sandbox = sandboxes.require_sandbox()
        except SandboxError:
            return
        for session_id in list(self.registry.ids):
            try:
                session = await sandbox.get(session_id)
                await session.destroy(remove_workspace=False)
            except SandboxError as e:
                self.log.debug("jupyter_tai_sandbox: %s at shutdown: %s", session_id, e)
            self.registry.forget(session_id)
        await sandbox.close()
        sandboxes.unregister_sandbox()


main = launch_new_instance = SandboxApp.launch_instance
