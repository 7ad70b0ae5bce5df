"""The Jupyter server extension: configuration, provider loading, the reaper, shutdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from jupyter_server._tz import utcnow
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Float, Integer, Unicode, default, validate
from traitlets.config import Configurable

from . import sandboxes
from ._version import __version__
from .contract import Sandbox, SandboxError, SandboxSession
from .events import Listener
from .gate import GatedSandbox
from .policy import SandboxPolicy
from .providers.local import LocalSandbox
from .server.execs import LiveCommandPolicy, LiveCommands
from .sessions import SessionRegistry
from .tools import PresetStore, ToolRegistry

#: the web app setting the server's idle culling reads (any key ending in _last_activity)
LAST_ACTIVITY_KEY = "jupyter_tai_sandbox_last_activity"


class ServerAccess(sandboxes.SandboxAccess):
    """A server's own sandbox: the gate its doors use, under its policy and limits.

    With no provider of its own (SandboxApp.provider 'off'), a provider a plugin registers in the
    process slot, before the start or after it, is taken under this server's gate.
    """

    def __init__(self, app: SandboxApp) -> None:
        super().__init__()
        self.app = app
        self.follows_plugins = False

    def gate_for(self, provider: Sandbox) -> GatedSandbox:
        app = self.app
        gate = GatedSandbox(provider, app.policy, app.max_output_bytes, app.max_spill_bytes)
        for listener, output in app.event_listeners:
            gate.events.subscribe(listener, output=output)
        return gate

    def _adopt(self) -> None:
        plugin = sandboxes.installed() if self.follows_plugins else None
        if plugin is None:
            return
        if self.gate is None or self.gate.provider is not plugin.provider:
            self.gate = self.gate_for(plugin.provider)

    def require(self) -> GatedSandbox:
        self._adopt()
        return super().require()

    def status_info(self, *, show_credentials: bool = True) -> dict[str, Any]:
        self._adopt()
        return super().status_info(show_credentials=show_credentials)


def _provider_classes() -> list[type]:
    classes: list[type] = [SandboxPolicy, LocalSandbox]
    with contextlib.suppress(ImportError):
        from .providers.docker import DockerSandbox
        from .providers.swarm import SwarmSandbox

        classes += [DockerSandbox, SwarmSandbox]
    from .providers.remote import RemoteSandbox
    from .providers.vm import VmSandbox

    classes += [RemoteSandbox, VmSandbox]
    from .audit.settings import AuditSettings

    classes.append(AuditSettings)
    from .metrics import MetricsSettings

    classes.append(MetricsSettings)
    from .agents import SandboxAgents  # no jupyter-ai import: the settings only
    from .previews.settings import PreviewSettings
    from .usage_history import UsageHistory

    classes += [SandboxAgents, PreviewSettings, UsageHistory]
    with contextlib.suppress(ImportError):  # the mcp extra
        from .mcp_door.door import SandboxMCP

        classes.append(SandboxMCP)
    from .transcripts import TranscriptSettings

    classes.append(TranscriptSettings)
    return classes


class SandboxApp(ExtensionApp):
    """Sandbox sessions for Jupyter: REST and websocket API under /api/sandbox."""

    name = "jupyter_tai_sandbox"
    app_name = "jupyter-tai-sandbox"
    description = "Sandbox sessions: a workspace, exec, file transfer and a TTL reap, behind one policy."
    #: the reap loop, once started (unset when the settings failed to load: nothing to reap then)
    _reaper: asyncio.Task[None] | None = None
    version = __version__
    load_other_extensions = True
    classes = _provider_classes()

    provider = Unicode(
        help="""The sandbox provider (TAI_MCP_SANDBOX, the sandbox_module setting): 'off' (default),
        'local' (host subprocesses, no isolation), 'docker' (one container per session), 'swarm' (one
        Docker Swarm service per session, see SwarmSandbox), 'remote' (the sessions of another server
        running this extension, see RemoteSandbox), 'vm' (one QEMU microVM per session, see VmSandbox),
        or 'module:Class' naming an external Sandbox provider class.""",
    ).tag(config=True)

    adopt_sessions = Bool(
        False,
        help="""At start, take every live session of this server's deployment as its own: the reaper and this
        server's stop destroy them like those it made. The JupyterHub service (`jupyter tai-sandbox serve`)
        turns it on, so a service restarted after a crash still stops what the one before it made. Leave it
        off where several servers share one deployment (each would stop the others' sessions).""",
    ).tag(config=True)

    reap_interval_seconds = Float(
        30.0,
        help="Seconds between two passes of the reaper, which destroys sessions past their TTL.",
    ).tag(config=True)

    max_upload_bytes = Integer(
        1 << 30,
        help="Largest file accepted by an upload (PUT sessions/{id}/files/{path}), in bytes; larger gets 413.",
    ).tag(config=True)

    handoff_max_bytes = Integer(
        512 << 20,
        help="""Most bytes one workspace handoff copies (POST sessions/{id}/handoff: a contents folder into a
        session, or the session's changes back), counted on the listing before any file is copied; more is
        refused with 413 HandoffTooLargeError naming this setting.""",
    ).tag(config=True)

    handoff_max_files = Integer(
        10_000,
        help="""Most files (and, apart, most folders) one workspace handoff walks, either way; more is refused
        with 413 HandoffTooLargeError naming this setting before any file is copied.""",
    ).tag(config=True)

    handoff_max_file_bytes = Integer(
        64 << 20,
        help="""Largest single file a workspace handoff copies, in bytes (a contents manager hands a file over
        whole, base64, so the server holds it in memory once); a larger one is skipped and listed with why.
        Never more than SandboxApp.handoff_max_bytes.""",
    ).tag(config=True)

    presets = Dict(
        key_trait=Unicode(),
        value_trait=Dict(),
        help="""Code tools from config (the manifest-apply door): tool name -> preset definition
        {"description", "base" (default "sandbox_exec"), "input_schema" (JSON Schema of the tool's
        input), "session" (fixed image/network/durability/workspace_key/cpu/memory_mb),
        "binding" (argv or script + args, stdin, env, timeout_seconds; fields as {"field": NAME})}.
        Applied at start through the same preset chokepoint as REST and the CLI, as the operator;
        an invalid entry fails the extension's start. Not written to the preset store.""",
    ).tag(config=True)

    presets_path = Unicode(
        "",
        help="""The preset store: presets authored at run time (REST PUT tools/{name}, CLI preset add),
        one JSON file replaced atomically. Default: <jupyter data dir>/tai_sandbox/presets.json.""",
    ).tag(config=True)

    max_output_bytes = Integer(
        64 << 20,
        help="""Most output (stdout and stderr together, in bytes) a one-shot exec keeps, on every door (REST,
        MCP, a tool run, server-side code through require_sandbox()). Past it the command is stopped and the
        call answers 413 OutputTooLargeError with the byte counts. Stream large output through the exec
        websocket or a workspace file instead. 0: no limit.""",
    ).tag(config=True)

    max_spill_bytes = Integer(
        1 << 30,
        help="""Most unread output one command may keep on the server's disk (in a deleted temporary file)
        once its memory buffer is full. Past it the command is stopped and its output ends with
        OutputTooLargeError saying why. 0 means no limit (only the command's deadline bounds it).""",
    ).tag(config=True)

    live_command_grace_seconds = Float(
        300.0,
        help="""How long a live command (started over the exec websocket or MCP's session_exec_start) runs on
        while nobody watches it (no websocket attached, no MCP poll) before it is killed, in seconds:
        attaching again (by exec id, from an output offset) or polling within it cancels the kill. An ended
        command nobody read to its end is kept as long for a reattach. The command's own deadline always
        applies. 0 kills on disconnect.""",
    ).tag(config=True)

    live_command_retention_seconds = Float(
        600.0,
        help="""How long an ended live command that was polled over MCP keeps its output and exit for its
        last polls, in seconds (a websocket gets the exit pushed once and the command is forgotten).""",
    ).tag(config=True)

    live_command_buffer_bytes = Integer(
        1 << 20,
        help="""Bytes of each live command's most recent output the server keeps (its output ring) for a
        client that attaches again or polls late, from the offset it asks for as far back as the ring
        reaches; older output is dropped (a poll reports how much).""",
    ).tag(config=True)

    max_live_commands_per_user = Integer(
        32,
        help="""Most live commands one user may hold at once, those started over the exec websocket and over
        MCP together, detached and unpolled ones included (each keeps its output ring until it is forgotten;
        an ended one kept for its readers gives its place first); one more is refused with SandboxQuotaError
        (429). 0 means no cap.""",
    ).tag(config=True)

    max_live_commands_per_session = Integer(
        64,
        help="""Most live commands one session may hold at once (websocket and MCP ones, detached ones
        included); one more is refused with SandboxQuotaError (429). 0 means no cap. The default is the
        session agent's own cap (64 commands held per session); the conformance suite runs 32 at once.""",
    ).tag(config=True)

    max_preset_bytes = Integer(
        64 << 10,
        help="Largest preset definition (as JSON) the preset store accepts, in bytes. 0 means no limit.",
    ).tag(config=True)

    max_presets = Integer(
        200,
        help="""Most shared presets the preset store holds (those admins author, listed to every user);
        authoring one more is refused. Users' private presets do not count here. 0 means no limit.""",
    ).tag(config=True)

    max_presets_per_user = Integer(
        20,
        help="""Most private presets one user may hold (a user who is not admin authors presets for
        themselves only: listed and run by their author alone); authoring one more is refused. 0 means no limit.""",
    ).tag(config=True)

    @default("provider")
    def _provider_default(self) -> str:
        return os.environ.get("TAI_MCP_SANDBOX", "off").strip() or "off"

    @validate("provider")
    def _check_provider(self, proposal: Any) -> str:
        value = proposal["value"].strip()
        return "off" if value.lower() in sandboxes.OFF_VALUES else value

    #: this server's own sandbox (its gate, or why it has none), made in initialize_settings
    access: ServerAccess | None = None

    @property
    def sandbox(self) -> GatedSandbox | None:
        """This server's provider behind its own gate (None: off, or it could not start)."""
        return self.access.gate if self.access is not None else None

    @sandbox.setter
    def sandbox(self, gate: GatedSandbox | None) -> None:
        if self.access is None:
            self.access = ServerAccess(self)
        self.access.gate = gate

    def initialize_settings(self) -> None:
        self.access = ServerAccess(self)
        # the config door first: an invalid SandboxApp.presets stops the start before a provider exists
        self.tools = ToolRegistry(
            PresetStore(self.presets_path or None),
            log=self.log,
            max_preset_bytes=self.max_preset_bytes,
            max_presets=self.max_presets,
            max_presets_per_user=self.max_presets_per_user,
            access=self.access,
        )
        self.tools.apply_manifest(self.presets)
        self.policy = SandboxPolicy(parent=self)
        #: what listens to the gate's events (jupyter_tai_sandbox.events): (listener, takes output bytes)
        self.event_listeners: list[tuple[Listener, bool]] = []
        # issue 55's listeners are added here, before any gate is made
        from . import audit

        self.audit_log = audit.install(self)  # the hash-chained audit log (AuditSettings), None when off
        from .metrics import MetricsSettings

        self.metrics = MetricsSettings(parent=self)  # Prometheus series on /metrics: a listener when enabled
        metrics_listener = self.metrics.attach(self)
        if metrics_listener is not None:
            self.event_listeners.append((metrics_listener, False))
        from .transcripts import TranscriptSettings

        self.transcripts = TranscriptSettings(parent=self)  # sessions' transcripts (takes output bytes)
        if self.transcripts.enabled:
            self.event_listeners.append((self.transcripts, True))
        from .previews.settings import PreviewSettings

        self.previews = PreviewSettings(parent=self)
        from .usage_history import UsageHistory

        self.usage_history = UsageHistory(self.access, parent=self)  # GET /api/sandbox/usage: its sampler
        self._load_agents()
        self.registry = SessionRegistry(self.policy, self.access)
        self.execs = LiveCommands(self.live_command_policy(), log=self.log)
        self._reaper = None
        # this server's doors use its own gate (self.access); the process slot gets the same provider
        # and policy as the default for code outside the server (require_sandbox() in kernels, plugins)
        sandboxes.use_policy(self.policy, output_limit=self.max_output_bytes)
        # normalised here too: a value loaded from config files skips the trait's validator
        self.provider = self.provider.strip()
        if self.provider.lower() in sandboxes.OFF_VALUES:
            self.provider = "off"
        if self.provider == "off":
            self.access.follows_plugins = True
            plugin = sandboxes.installed()
            if plugin is not None:
                # a plugin registered its provider: it stays, under this server's policy
                self.sandbox = self.access.gate_for(plugin.provider)
                self.log.info("jupyter_tai_sandbox: %s provider registered by a plugin", plugin.kind)
            else:
                sandboxes.disable_sandbox()
                self.log.info(
                    "jupyter_tai_sandbox: no sandbox provider (set SandboxApp.provider or TAI_MCP_SANDBOX)"
                )
        else:
            self._install_provider()

    def _load_agents(self) -> None:
        """SandboxAgents, with this server's config: the configured personas checked (a bad one, or one naming a
        secret SandboxPolicy.secrets lacks, stops the start), and their secrets and egress rules put in the
        policy (also for the sandboxed personas plugins register on jupyter-ai's entry points); the configured
        personas put in jupyter-ai's persona manager."""
        from .agents import SandboxAgents

        self.agents = SandboxAgents(parent=self)
        self.agent_specs = self.agents.specs()
        specs = list(self.agent_specs)
        if self.agents.plugin_personas:
            from .agents.persona_manager import entry_point_specs

            keys = {spec.key for spec in specs}
            specs += [spec for spec in entry_point_specs(self.log) if spec.key not in keys]
        for line in self.agents.grant(self.policy, specs):
            self.log.info("jupyter_tai_sandbox: coding agents: %s", line)
        if self.agent_specs and self.serverapp is not None:
            # every extension is linked before any loads: jupyter-ai's persona manager is there (or never will be),
            # and it reads its class when a chat opens
            from .agents.persona_manager import install

            install(self.serverapp, self.agent_specs, self.log)

    def _install_provider(self) -> None:
        """Start the configured provider; one that cannot start leaves the routes answering 503 saying why."""
        access = self.access
        assert access is not None  # made by initialize_settings, the one caller
        try:
            provider = self._make_provider()
        except Exception as e:  # any failure of a provider's start, reported, never a half-loaded server
            message = f"the sandbox provider {self.provider!r} (SandboxApp.provider, TAI_MCP_SANDBOX) could not start: {e}"
            if sandboxes.PROVIDER_CHOICES not in message:
                message += f". Use {sandboxes.PROVIDER_CHOICES}."
            self.log.error("jupyter_tai_sandbox: %s", message)
            access.failure = message
            sandboxes.mark_failed(message)
            return
        previous = sandboxes.installed()
        if previous is not None and previous.provider is not provider:
            self.log.warning(
                "jupyter_tai_sandbox: the configured %s provider replaces the %s provider a plugin registered",
                provider.kind,
                previous.kind,
            )
        sandboxes.register_sandbox(
            provider,
            policy=self.policy,
            output_limit=self.max_output_bytes,
            spill_limit=self.max_spill_bytes,
            replace=True,
        )
        self.sandbox = access.gate_for(provider)
        self.log.info(
            "jupyter_tai_sandbox: %s provider, isolation floor %s, egress ceiling %s",
            provider.kind,
            self.policy.isolation,
            self.policy.egress,
        )
        refused = sandboxes.floor_refusal(provider.kind, self.policy.isolation, provider.max_isolation)
        if refused:
            self.log.warning("jupyter_tai_sandbox: %s", refused)

    def live_command_policy(self) -> LiveCommandPolicy:
        """The one policy of live commands (both doors: the exec websocket and MCP)."""
        return LiveCommandPolicy(
            grace_seconds=self.live_command_grace_seconds,
            retention_seconds=self.live_command_retention_seconds,
            buffer_bytes=self.live_command_buffer_bytes,
            max_per_user=self.max_live_commands_per_user,
            max_per_session=self.max_live_commands_per_session,
        )

    def touch(self) -> None:
        """Record sandbox use for the server's idle culling (and JupyterHub's, which asks /api/status)."""
        if self.serverapp is not None and self.serverapp.web_app is not None:
            self.serverapp.web_app.settings[LAST_ACTIVITY_KEY] = utcnow()

    def current_activity(self) -> bool:
        """Live sandbox commands are running (the server's no-activity shutdown waits for them)."""
        return self.execs.running_count() > 0

    def _make_provider(self) -> Sandbox:
        cls = sandboxes.load_provider_class(self.provider)
        if issubclass(cls, Configurable):
            return cls(parent=self)
        return cls()

    def initialize_handlers(self) -> None:
        from .server.handler_base import quiet_log_request
        from .server.handlers import SESSION_ID, rest_handlers

        web_app = getattr(self.serverapp, "web_app", None)
        log_request = web_app.settings.get("log_function") if web_app is not None else None
        if (
            web_app is not None
            and log_request is not None
            and not getattr(log_request, "quiet_for_expected_errors", False)
        ):
            web_app.settings["log_function"] = quiet_log_request(log_request)
        from .server.handoff_handlers import handoff_handlers
        from .server.preview_ports_handlers import preview_ports_handlers
        from .server.tool_handlers import tool_handlers
        from .server.transcript_handlers import transcript_handlers
        from .server.ws import ExecWebSocketHandler

        self.handlers.extend(rest_handlers)
        self.handlers.extend(handoff_handlers)
        self.handlers.extend(preview_ports_handlers)
        self.handlers.extend(transcript_handlers)
        self.handlers.extend(tool_handlers)
        from .server.audit_handlers import audit_handlers

        self.handlers.extend(audit_handlers)
        from .server.usage_handlers import usage_handlers

        self.handlers.extend(usage_handlers)
        self.handlers.append((rf"/api/sandbox/sessions/{SESSION_ID}/exec/ws", ExecWebSocketHandler))
        from .server.preview_handlers import install_preview_host, preview_handlers

        self.handlers.extend(preview_handlers)
        if web_app is not None:  # PreviewSettings.origin_template: the preview hosts, matched before all else
            install_preview_host(web_app, self.previews, self.name)
        from . import mcp_door

        self.handlers.extend(mcp_door.handlers(self))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        self.stop_cleanly_on_sigint(serverapp)
        if self.adopt_sessions and self.sandbox is not None:
            await self.adopt_deployment_sessions()
        self.start_reaper()
        if self.sandbox is not None and self._checked_at_start(self.sandbox.provider):
            self._provider_check: asyncio.Future[str | None] | None = asyncio.ensure_future(
                self.report_provider_problem()
            )
        self.export_server_env(serverapp)
        from . import mcp_door

        await mcp_door.start(self)

    #: how long a stop waits for the creates under way to end (JupyterHub's SIGTERM follows its SIGINT in 30 s)
    STOP_CREATES_WAIT_SECONDS = 20.0
    #: how many sessions a stopping server destroys at once
    STOP_DESTROYS_AT_ONCE = 8

    #: what kernels this server starts read to find its sandbox API (client.discover_server)
    KERNEL_ENV = ("TAI_SANDBOX_URL", "TAI_SANDBOX_TOKEN")

    def export_server_env(self, serverapp: Any) -> None:
        """Kernels this server starts get its URL and token in their environment.

        So ``%%sandbox`` in a kernel this server started needs no setup. The token is the
        one the server already writes into its runtime file for the same user. Added to the
        environment of each kernel this server's kernel manager starts, not to the process's:
        two servers in one process each give their kernels their own.
        """
        url = serverapp.connection_url
        if not url.startswith(("http://", "https://")):
            return  # a unix socket: kernels fall back to discovery
        token = getattr(serverapp.identity_provider, "token", "") or ""
        self.kernel_env = {"TAI_SANDBOX_URL": url, "TAI_SANDBOX_TOKEN": token}
        manager = getattr(serverapp, "kernel_manager", None)
        if manager is None or "start_kernel" in vars(manager):
            return
        start_kernel = manager.start_kernel
        kernel_env = self.kernel_env

        async def start_with_server_env(*args: Any, **kwargs: Any) -> Any:
            env = kwargs.get("env")
            kwargs["env"] = {**(os.environ if env is None else env), **kernel_env}
            return await start_kernel(*args, **kwargs)

        manager.start_kernel = start_with_server_env
        self._kernel_manager = manager

    def stop_cleanly_on_sigint(self, serverapp: Any) -> None:
        """Make SIGINT stop the server the way SIGTERM does, cleanup included.

        Without a terminal jupyter_server leaves SIGINT to Python, whose
        KeyboardInterrupt ends the loop *without* the extensions' cleanup, so
        every session and sandboxed kernel of the server would outlive it; and
        SIGINT is how JupyterHub stops a user's server. A handler someone
        installed on purpose (the terminal's confirmation prompt, JupyterHub's
        own) is left alone; the previous one comes back at stop.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        stop = getattr(serverapp, "_signal_stop", None)
        if stop is None:
            return
        signal.signal(signal.SIGINT, stop)
        self._restore_sigint: Callable[[int, FrameType | None], Any] | None = signal.default_int_handler

    def _give_back_sigint(self) -> None:
        previous = getattr(self, "_restore_sigint", None)
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)
        self._restore_sigint = None

    def start_reaper(self) -> None:
        if self._reaper is None and self.sandbox is not None:
            self._reaper = asyncio.create_task(self._reap_forever())
            # a previous server's live commands, where the sessions hold them (a session agent does)
            self.execs.start_adopting(self._deployment_sessions)

    @staticmethod
    def _checked_at_start(provider: Sandbox) -> bool:
        """Whether the start asks the provider: a container provider answers with a ping and an image look-up;
        a vm one would boot a guest to probe KVM, which its status route starts when someone asks."""
        from .providers._docker_sandbox import ContainerSandbox

        return isinstance(provider, ContainerSandbox)

    async def report_provider_problem(self) -> str | None:
        """At the server's start: ask the provider whether a session could start (its engine answers, the
        session agent and the image are there) and log why not, with the fix, at once rather than at the
        first create. Returns the problem, or None."""
        sandbox = self.sandbox
        assert sandbox is not None  # asked only of a server with a provider
        try:
            await sandbox.check_available()
        except SandboxError as e:
            self.log.error("jupyter_tai_sandbox: the %s provider cannot create sessions: %s", sandbox.kind, e)
            return str(e)
        return None

    async def _deployment_sessions(self) -> list[SandboxSession]:
        """Every live session of this server's deployment, found a few at a time."""
        sandbox = self.sandbox
        if sandbox is None:
            return []
        room = asyncio.Semaphore(8)

        async def find(session_id: str) -> SandboxSession | None:
            async with room:
                try:
                    return await sandbox.get(session_id)
                except SandboxError:
                    return None

        found = await asyncio.gather(*(find(info.id) for info in await sandbox.list()))
        return [session for session in found if session is not None]

    async def _reap_forever(self) -> None:
        while True:
            await self.reap_once()
            await asyncio.sleep(self.reap_interval_seconds)

    async def reap_once(self) -> list[str]:
        if self.sandbox is None:
            return []
        try:
            reaped = await self.sandbox.reap()
        except SandboxError as e:
            self.log.warning("jupyter_tai_sandbox: reaping failed: %s", e)
            return []
        for session_id in reaped:
            self.registry.forget(session_id)
            await self.execs.end_session(session_id, "ttl")
        return reaped

    async def adopt_deployment_sessions(self) -> None:
        """Take the live sessions of this server's deployment as this server's (SandboxApp.adopt_sessions)."""
        assert self.sandbox is not None
        try:
            found = await self.sandbox.list()
        except SandboxError as e:
            self.log.warning("jupyter_tai_sandbox: the sessions of the deployment could not be listed: %s", e)
            return
        self.registry.ids.update(info.id for info in found)
        if found:
            self.log.info(
                "jupyter_tai_sandbox: took %d session(s) of the deployment as this server's", len(found)
            )

    def _server_kernels(self) -> list[Any]:
        """The kernel managers of the server's kernels (none outside a server)."""
        multi = getattr(getattr(self, "serverapp", None), "kernel_manager", None)
        kernels: list[Any] = []
        if multi is None:
            return kernels
        for kernel_id in list(getattr(multi, "list_kernel_ids", list)()):
            with contextlib.suppress(Exception):
                kernels.append(multi.get_kernel(kernel_id))
        return kernels

    def _stop_kernel_restarters(self) -> None:
        """At the stop, no kernel restarter restarts a kernel any more: jupyter_server shuts every kernel down
        right after the extensions, and a restart under way then (a sandboxed kernel whose session the stop
        destroys is one) leaves a kernel's ``ready`` pending, which jupyter_client's shutdown_all cannot read:
        the server's whole stop failed there, and a hub waited on it."""
        for kernel in self._server_kernels():
            with contextlib.suppress(Exception):
                kernel.stop_restarter()

    async def _kernel_starts_ended(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout`` s) for kernel starts and restarts under way when the stop began."""
        pending = []
        for kernel in self._server_kernels():
            ready = getattr(kernel, "_ready", None)
            if ready is not None and not ready.done():
                pending.append(
                    asyncio.wrap_future(ready) if isinstance(ready, concurrent.futures.Future) else ready
                )
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def stop_extension(self) -> None:
        """Stop every session this server started (persistent workspaces are kept)."""
        from . import mcp_door

        self._give_back_sigint()
        self._stop_kernel_restarters()
        registry = getattr(self, "registry", None)
        if registry is not None:
            registry.stopping = True  # no create starts now, and one under way is destroyed as it ends
        await mcp_door.stop(self)
        usage_history = getattr(self, "usage_history", None)
        if usage_history is not None:
            await usage_history.stop()
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        check = getattr(self, "_provider_check", None)
        if check is not None:
            check.cancel()
            self._provider_check = None
        manager = getattr(self, "_kernel_manager", None)
        if manager is not None:
            vars(manager).pop("start_kernel", None)
            self._kernel_manager = None
        execs = getattr(self, "execs", None)  # None when the settings were never initialized
        if execs is not None:
            await execs.close()
        if registry is not None:
            # a create under way when the stop began (a kernel restarter's, right as JupyterHub stops the
            # service) ends first: the process must not exit with the engine making a container no one holds
            left = await registry.creates_ended(timeout=self.STOP_CREATES_WAIT_SECONDS)
            if left:
                self.log.warning("jupyter_tai_sandbox: %d create(s) still under way at shutdown", left)
        await self._kernel_starts_ended()
        sandbox = self.sandbox
        if sandbox is None:
            failure = self.access.failure if self.access is not None else None
            if failure is not None and sandboxes.failure() == failure:
                sandboxes.unregister_sandbox()
            self._close_audit_log()
            return
        at_once = asyncio.Semaphore(self.STOP_DESTROYS_AT_ONCE)

        async def destroy(session_id: str) -> None:
            async with at_once:
                try:
                    session = await sandbox.get(session_id)
                    await session.destroy(remove_workspace=False)
                except SandboxError as e:
                    self.log.debug("jupyter_tai_sandbox: %s at shutdown: %s", session_id, e)
                self.registry.forget(session_id)

        # several at a time: JupyterHub kills a service that has not exited 60 s after its SIGINT
        await asyncio.gather(*(destroy(session_id) for session_id in list(self.registry.ids)))
        await sandbox.close()
        self.sandbox = None
        installed = sandboxes.installed()
        if installed is not None and installed.provider is sandbox.provider:
            sandboxes.unregister_sandbox()
        self._close_audit_log()

    def _close_audit_log(self) -> None:
        """The audit log's last lines written (the sessions this stop destroyed), its thread ended."""
        audit_log = getattr(self, "audit_log", None)
        if audit_log is not None:
            audit_log.close()


main = launch_new_instance = SandboxApp.launch_instance


if __name__ == "__main__":
    main()
