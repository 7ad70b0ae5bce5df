"""Sandboxed kernels: a jupyter_client kernel provisioner whose kernel runs in a sandbox session.

Registered on the ``jupyter_client.kernel_provisioners`` entry point as
``tai-sandbox-provisioner``; a kernelspec names it (``jupyter tai-sandbox
kernelspec install`` writes one). For each kernel start:

1. a session is created through the server's own gate (``SandboxApp.access``; outside a
   server :func:`~jupyter_tai_sandbox.sandboxes.require_sandbox`), so the operator's policy holds (isolation floor, egress ceiling, credentials, TTL
   ceiling, durable switch) and the per-user kernel cap (``SandboxPolicy.max_kernels_per_user``,
   apart from the session cap); its owner is the user whose request started the kernel
   (jupyter_server's ``CallContext`` handler: its identity provider and current user, as
   every sandbox door names its principal), kept for the kernel's restarts; a kernel
   started outside any request (nbclient, a script, server-side code) has no owner, so
   only admins see its session. Its consumer label is ``kernel:<kernel id>`` (so the panel
   can tell kernels apart). A refused spec fails the start at once with the policy's
   message and status (a quota: 429);
2. five host listeners on 127.0.0.1 forward to the kernel's ZMQ ports in the session: through
   the session itself where it opens its own ports (a container's agent dials them inside:
   :class:`~jupyter_tai_sandbox.kernels.ports.SessionPorts`), else through a
   :class:`~jupyter_tai_sandbox.kernels.tunnel.Tunnel` relay started in the session; the
   connection info the kernel manager (and every client) sees points at the listeners;
3. the connection file, with the in-session ports and ip 127.0.0.1, is written into the
   workspace (``.tai-kernel/kernel-<id>.json``, mode 0600 in a 0700 folder, as Jupyter
   keeps its own: it holds the key) and ``python3 -m ipykernel_launcher -f
   <it>`` starts with ``exec_start``. Nothing of the server's environment goes in: the
   kernel sees the session's env (the policy's credentials) and the kernelspec's ``env``.

``poll``/``wait`` follow the kernel command's handle; ``kill``/``terminate`` kill it (the
whole process group); other signals go through the seam as ``kill -SIG <pid>``.
Interrupts: kernelspecs written by the CLI use ``interrupt_mode: message`` (ipykernel
interrupts itself); ``signal`` works too (SIGINT through the seam). A restart is a fresh
session (a persistent ``workspace_key`` keeps the files); shutdown and culling (both
end in ``cleanup``) destroy the session; the host listeners keep their ports across a
restart when they can, so connected clients reconnect by themselves.

**Life.** A kernel has one life, its session's TTL, and the kernel and relay commands
run for all of it, so the life is both a session TTL and a command deadline and is
bounded by both of the operator's maxima: ``ttl_seconds`` (default: the longest both
allow, ``min(SandboxPolicy.max_ttl_seconds, SandboxPolicy.max_timeout_seconds)``, 6 h
with the defaults; 24 h when neither is set). A kernelspec ``ttl_seconds`` over either
maximum is refused at the start, loudly, with a ``SandboxSpecRejectedError`` naming
the setting (never clamped, as on every door: a kernel that silently died at the
command ceiling while its session lived on was the old behaviour); the gated session
holds the relay and the kernel to the ceiling too. Shutdown destroys the session long
before its end; a kernel still running at its deadline dies like a crashed kernel, and
the server's restarter starts a fresh one in a fresh session. A server that dies
without shutting its kernels down leaves sessions that the TTL reap removes.

**Providers.** In a Jupyter server the provider is the server's (SandboxApp.provider).
In another process (nbclient, jupyter console, a script) the slot is filled from
``TAI_MCP_SANDBOX``, else the Jupyter server config files (SandboxApp.provider and
SandboxPolicy), else the kernelspec's ``provider`` setting. The local provider runs the
kernel with the server's own Python (``sys.executable``) on the host: it is **not
isolated**, only a separate workspace.

**Every jupyter_client user.** The tunnel is pumped by an asyncio loop. Under an async
kernel manager (jupyter_server, nbclient) that is the caller's loop; under a blocking
``KernelManager`` (``jupyter console``, ``jupyter run``, ``start_new_kernel``), which runs
a loop only inside its calls, the provisioner does all its work on a loop thread of its
own (``loop``). Outside a server, a watchdog process destroys the kernel's session
when the client process dies (a plain kernel ends with its parent too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Float, Integer, List, Unicode

from .. import sandboxes
from ..contract import (
    EgressPolicy,
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxSession,
    SandboxSpecRejectedError,
    SessionSpec,
    for_door,
)
from .loop import on_kernel_loop, stop_watching, watch_client
from .ports import SessionPorts
from .start_errors import SandboxKernelError, start_error
from .tunnel import Tunnel, TunnelError

PROVISIONER_NAME = "tai-sandbox-provisioner"
#: where the connection file (and the kernel's pid) go in the workspace
KERNEL_DIR = ".tai-kernel"
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
#: argv[0] values replaced by the server's own interpreter on the local provider
_PYTHON_NAMES = ("python", "python3")
#: the kernelspec env entries never forwarded (the server's own ones)
DEFAULT_TTL = 24 * 3600.0


#: Writes stdin into "$2" (mode 0600) in the folder "$1" (mode 0700), as Jupyter keeps its connection
#: files: never readable by another account, not even for a moment (a file left by an earlier start is
#: replaced, not reused with its mode).
_WRITE_PRIVATE = 'umask 077 && mkdir -p "$1" && chmod 700 "$1" && rm -f "$2" && cat > "$2" && chmod 600 "$2"'


async def _write_private(session: SandboxSession, path: str, data: bytes) -> None:
    """Write a kernel's connection file (it holds the key) readable by its account only."""
    result = await session.exec(
        ["sh", "-c", _WRITE_PRIVATE, "sh", posixpath.dirname(path), path], timeout_seconds=60, stdin=data
    )
    if result.exit_code != 0:
        why = (result.stderr or result.stdout).decode("utf-8", "replace").strip()[-500:]
        raise SandboxKernelError(
            f"cannot write the kernel's connection file {path}: {why or result.exit_code}"
        )


#: the attribute of the kernel manager that keeps its kernel's owner across restarts
_OWNER_ATTR = "_tai_sandbox_owner"


def request_principal() -> str | None:
    """The principal of the Jupyter request running now (None: no request, or one without a user).

    jupyter_server sets ``CallContext``'s handler in every handler's ``prepare``; a kernel start
    (``POST /api/kernels``, ``POST /api/sessions``) runs inside it.
    """
    from jupyter_server.base.call_context import CallContext

    from ..sessions import principal_name

    handler = CallContext.get(CallContext.JUPYTER_HANDLER)
    user = getattr(handler, "current_user", None) if handler is not None else None
    if not user:
        return None
    try:
        return principal_name(handler.identity_provider, user)
    except SandboxError:
        return None


@contextlib.contextmanager
def _held_ports(count: int) -> Iterator[list[int]]:
    """``count`` distinct free TCP ports on 127.0.0.1, held bound until the block ends (so the host listeners
    made meanwhile get other ports: the kernel of a local session binds these on this same host)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ensure_provider(fallback: str) -> None:
    """Outside a server, fill the empty slot as the CLI does: TAI_MCP_SANDBOX, server config, ``fallback``."""
    if sandboxes.installed() is not None or sandboxes.failure() is not None:
        return
    if sandboxes.configured() or os.environ.get("TAI_MCP_SANDBOX", "").strip():
        return  # the server switched it off, or require_sandbox() reads the variable itself
    from traitlets.config import Configurable

    from ..policy import SandboxPolicy
    from ..server_config import load_server_config

    config = load_server_config()
    name = str(config.get("SandboxApp", {}).get("provider") or fallback or "").strip()
    if name.lower() in sandboxes.OFF_VALUES:
        return
    cls = sandboxes.load_provider_class(name)
    provider = cls(config=config) if issubclass(cls, Configurable) else cls()
    sandboxes.register_sandbox(provider, policy=SandboxPolicy(config=config))


class SandboxProvisioner(KernelProvisionerBase):
    """Runs the kernel in a sandbox session; its ZMQ ports come to the host through a tunnel.

    Settings come from the kernelspec's ``metadata.kernel_provisioner.config``.
    """

    image = Unicode(None, allow_none=True, help="The session image (None: the provider's default).").tag(
        config=True
    )
    network = Unicode(
        "auto",
        help="""none, internal or egress; 'auto' (default): the narrowest the provider supports (none on docker,
        egress on local, which has no network isolation at all). Past the operator's ceiling: refused.""",
    ).tag(config=True)
    workspace_key = Unicode(
        None,
        allow_none=True,
        help="A persistent workspace kept across restarts and kernels (None: ephemeral).",
    ).tag(config=True)
    cpu = Float(None, allow_none=True, help="CPUs for the session (container providers).").tag(config=True)
    memory_mb = Integer(None, allow_none=True, help="Memory cap in MiB (container providers).").tag(
        config=True
    )
    ttl_seconds = Float(
        None,
        allow_none=True,
        help="""The kernel's life: its session's TTL and its commands' deadline. None: the longest the operator
        allows (the lower of SandboxPolicy.max_ttl_seconds and max_timeout_seconds; 24 h when neither is set).
        Over either maximum the start is refused.""",
    ).tag(config=True)
    isolation = Unicode(
        None, allow_none=True, help="At least this isolation (None: the operator's floor)."
    ).tag(config=True)
    egress_allow = List(
        Unicode(),
        default_value=None,
        allow_none=True,
        help="""The kernel's egress allow-list (host names, '*.example.com', 'host:port'; docs: "Secrets and
        egress by domain"): the kernel reaches only these, through its owner's egress gateway, on network egress
        ('auto' becomes egress). None (default): no list of the kernelspec's own (the operator's
        SandboxPolicy.egress_rules still apply). Outside the operator's rule the start is refused.""",
    ).tag(config=True)
    egress_deny = List(
        Unicode(),
        default_value=[],
        help="Host names the kernel may never reach (over the allow-list and the operator's rule).",
    ).tag(config=True)
    provider = Unicode(
        "",
        help="""The provider to install when this process has none configured (not in a server: nbclient, a
        script): local or docker. TAI_MCP_SANDBOX and the server config files come first.""",
    ).tag(config=True)
    start_timeout_seconds = Float(
        60.0, help="Seconds for the session, the relay and the kernel's ports to come up."
    ).tag(config=True)

    session: SandboxSession | None = None
    tunnel: Tunnel | SessionPorts | None = None
    _handle: Any = None
    _watch: asyncio.Task[None] | None = None
    _exit_code: int | None = None
    _stderr_tail: bytes = b""
    _pid: int | None = None
    _env: dict[str, str]
    _argv: list[str]
    _listen_ports: dict[str, int] | None = None
    _own_loop: bool = False
    _registry: Any = None
    _watchdog: Any = None

    # ---------------------------------------------------------------- launch

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        extra = list(kwargs.pop("extra_arguments", []) or [])
        env = kwargs.pop("env", None) or {}
        # only the kernelspec's own env entries and the session name go into the session: never the
        # server's environment (its tokens, its credentials)
        self._env = {k: str(v) for k, v in (self.kernel_spec.env or {}).items()}
        for name in ("JPY_SESSION_NAME",):
            if env.get(name):
                self._env[name] = env[name]
        self._env.setdefault("PYTHONUNBUFFERED", "1")
        self._argv = list(self.kernel_spec.argv) + extra
        if km is not None and getattr(km, "transport", "tcp") != "tcp":
            raise SandboxKernelError("a sandboxed kernel needs transport 'tcp' (its ports are forwarded)")
        kwargs["cmd"] = list(self._argv)
        return kwargs

    def _spec(self, sandbox: Any) -> SessionSpec:
        policy = getattr(sandbox, "policy", None)
        ttl = self._life(policy)
        network = self.network
        egress = None
        if self.egress_allow is not None or self.egress_deny:
            egress = EgressPolicy(
                allow=None if self.egress_allow is None else tuple(self.egress_allow),
                deny=tuple(self.egress_deny),
            )
            if network == "auto":
                network = "egress"
        if network == "auto":
            networks = getattr(sandbox, "networks", frozenset({"egress"}))
            network = next((n for n in ("none", "internal", "egress") if n in networks), "egress")
        from ..labels import kernel_label

        return SessionSpec(
            image=self.image,
            isolation=self.isolation,  # type: ignore[arg-type]  # a config str: SessionSpec checks it
            network=network,  # type: ignore[arg-type]  # as isolation
            durability="persistent" if self.workspace_key else "ephemeral",
            workspace_key=self.workspace_key,
            ttl_seconds=ttl,
            cpu=self.cpu,
            memory_mb=self.memory_mb,
            consumer=kernel_label(self.kernel_id),
            owner=self._owner(),
            egress=egress,
        )

    def _life(self, policy: Any) -> float:
        """The kernel's life (session TTL and command deadline): the kernelspec's, refused over the operator's
        command ceiling (the policy refuses it over max_ttl_seconds at create), else the longest both allow."""
        ceiling = getattr(policy, "max_timeout_seconds", 0) or 0
        if self.ttl_seconds:
            if ceiling and self.ttl_seconds > ceiling:
                raise SandboxSpecRejectedError(
                    f"the kernel's ttl_seconds {self.ttl_seconds:g} (SandboxProvisioner.ttl_seconds, "
                    f"`kernelspec install --ttl`) is over the operator's maximum command deadline of {ceiling:g} s "
                    "(SandboxPolicy.max_timeout_seconds, TAI_MCP_SANDBOX_MAX_TIMEOUT_SECONDS): the kernel runs "
                    f"as one command for its whole life, so give it at most {ceiling:g} s, or raise the maximum"
                )
            return self.ttl_seconds
        life = getattr(policy, "max_ttl_seconds", 0) or DEFAULT_TTL
        # a default chosen within both maxima (nothing was asked for, so nothing is clamped)
        return min(life, ceiling) if ceiling else life

    def _owner(self) -> str | None:
        """Who the kernel belongs to: the user whose request first started it (kept on the kernel manager,
        so a restart, by the restarter or another request, keeps it); None outside any request."""
        km = self.parent
        if km is not None and hasattr(km, _OWNER_ATTR):
            return getattr(km, _OWNER_ATTR)
        owner = request_principal()
        if km is not None:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(km, _OWNER_ATTR, owner)
        return owner

    async def _create_session(self, spec: SessionSpec) -> SandboxSession:
        """Through the chokepoint, with the owner's kernel cap (no owner: no cap). The kernelspec is the
        operator's configuration (like a preset), so its image is not checked against the non-admin allow-list.

        In a server, the session is recorded in the extension's registry too: the server stops its
        extensions before its kernels, and the extension's stop destroys what its registry holds.
        """
        from ..sessions import Caller, SessionRegistry

        registry = self._server_registry() or SessionRegistry(sandboxes.require_sandbox().policy)
        self._registry = registry
        operator = Caller(spec.owner, frozenset({"write"})) if spec.owner is not None else None
        return await registry.create(spec, operator)

    def _sandbox(self) -> Any:
        """In a server, the server's own gate (SandboxApp.access); elsewhere the process slot."""
        registry = self._server_registry()
        return registry.access.require() if registry is not None else sandboxes.require_sandbox()

    def _server_registry(self) -> Any:
        """The SessionRegistry of this server's sandbox extension (kernel manager -> mapping manager -> server)."""
        from ..server_lookup import server_registry

        return server_registry(getattr(getattr(self.parent, "parent", None), "parent", None))

    async def _run(self, work: Any) -> Any:
        """``work`` (a coroutine) on the loop this kernel's tunnel lives on."""
        if self._own_loop:
            return await on_kernel_loop(work)
        return await work

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        # a blocking manager's loop runs only inside its calls: the tunnel needs one that always runs
        self._own_loop = not isinstance(self.parent, AsyncKernelManager) and self._server_registry() is None
        return await self._run(self._launch_kernel())

    async def _launch_kernel(self) -> KernelConnectionInfo:
        try:
            return await asyncio.wait_for(self._launch(), self.start_timeout_seconds)
        except TimeoutError:
            await self._teardown()
            raise SandboxKernelError(
                f"the sandboxed kernel did not come up within {self.start_timeout_seconds:g} s "
                f"(SandboxProvisioner.start_timeout_seconds){self._stderr_note()}"
            ) from None
        except SandboxError as e:
            await self._teardown()
            # outside a server (jupyter console, a script) a server option is no fix: name the kernel's
            raise start_error(e if self._server_registry() is not None else for_door(e, "kernel")) from e
        except BaseException:
            await self._teardown()
            raise

    async def _launch(self) -> KernelConnectionInfo:
        km = self.parent
        _ensure_provider(self.provider)
        sandbox = self._sandbox()
        spec = self._spec(sandbox)
        self.session = session = await self._create_session(spec)
        if self._registry is not self._server_registry():
            # not in a server: nobody else ends the session if this process dies
            self._watchdog = watch_client(sandbox, session.id)
        self._exit_code = None
        self._stderr_tail = b""
        self._pid = None
        local = sandbox.kind == "local"
        python = sys.executable if local else "python3"
        argv = list(self._argv)
        if argv and argv[0] in _PYTHON_NAMES:
            argv[0] = python
        life = spec.ttl_seconds  # within the operator's command ceiling (_life): the gate refuses past it

        # a session that opens its own ports (a container's agent) needs no relay in it
        self.tunnel = tunnel = (
            SessionPorts(session)
            if session.opens_ports
            else await Tunnel.start(session, python=python, timeout_seconds=life)
        )
        # host listeners first (they hold their ports), then the in-session ports, distinct from them
        previous = self._listen_ports or {}
        listen: dict[str, int] = {}
        with _held_ports(len(PORT_NAMES)) as inner_ports:
            for name, inner in zip(PORT_NAMES, inner_ports, strict=True):
                forward = None
                if previous.get(name):
                    with contextlib.suppress(OSError):
                        forward = await tunnel.forward(
                            inner, port=previous[name], connect_wait=self.start_timeout_seconds
                        )
                if forward is None:
                    forward = await tunnel.forward(inner, connect_wait=self.start_timeout_seconds)
                listen[name] = forward.port
        if set(listen.values()) & set(inner_ports) and local:  # a restart's previous port taken meanwhile
            raise SandboxKernelError("port clash between the host listeners and the kernel's ports")
        self._listen_ports = listen

        info = dict(km.get_connection_info()) if km is not None else {}
        info.update(transport="tcp", ip="127.0.0.1")
        inner_info = {**info, **dict(zip(PORT_NAMES, inner_ports, strict=True))}
        inner_info["key"] = _text(inner_info.get("key", b""))
        for field in ("curve_publickey", "curve_secretkey"):
            if inner_info.get(field) is not None:
                inner_info[field] = _text(inner_info[field])
        rel = f"{KERNEL_DIR}/kernel-{self.kernel_id}.json"
        connection_file = await session.resolve_path(rel)
        await _write_private(session, connection_file, json.dumps(inner_info, indent=1).encode())
        pid_file = await session.resolve_path(f"{KERNEL_DIR}/kernel-{self.kernel_id}.pid")
        argv = [a.replace("{connection_file}", connection_file) for a in argv]
        self._pid_file = f"{KERNEL_DIR}/kernel-{self.kernel_id}.pid"
        # the pid (for signals through the seam), then the kernel itself in the same process
        wrapped = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', pid_file, *argv]
        self._handle = await session.exec_start(wrapped, timeout_seconds=life, env=self._env)
        self._watch = asyncio.create_task(self._follow(self._handle), name=f"kernel-{self.kernel_id}")
        self.connection_info = {**info, **listen}  # type: ignore[typeddict-item]  # listen's keys: its own *_port
        self.log.info(
            "sandboxed kernel %s: %s session %s (%s, network %s), ports forwarded to %s",
            self.kernel_id,
            sandbox.kind,
            session.id,
            spec.image or "default image",
            spec.network,
            ", ".join(str(listen[n]) for n in PORT_NAMES),
        )
        return self.connection_info

    async def _follow(self, handle: Any) -> None:
        """Drain the kernel's own output (its log) and take its exit status; a dead tunnel kills it."""
        assert self.tunnel is not None
        tunnel_gone = asyncio.create_task(self.tunnel.closed.wait())
        code: int | None = None
        try:
            output = handle.output.__aiter__()
            while True:
                step = asyncio.ensure_future(output.__anext__())
                done, _ = await asyncio.wait({step, tunnel_gone}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    # the forwarded ports are gone: the kernel is unreachable, so end it
                    self.log.warning(
                        "sandboxed kernel %s: tunnel ended (%s)", self.kernel_id, self.tunnel.exit_reason
                    )
                    with contextlib.suppress(SandboxError):
                        await handle.kill()
                    done, _ = await asyncio.wait({step})
                try:
                    item = step.result()
                except StopAsyncIteration:
                    break
                if isinstance(item, OutputChunk):
                    self._stderr_tail = (self._stderr_tail + item.data)[-4000:]
                    self.log.debug(
                        "kernel %s: %s", self.kernel_id, item.data.decode("utf-8", "replace").rstrip()
                    )
                elif isinstance(item, ExitItem):
                    code = item.exit_code
        except SandboxError as e:
            self.log.warning("sandboxed kernel %s ended: %s", self.kernel_id, e)
            code = -signal.SIGKILL
        finally:
            tunnel_gone.cancel()
            self._exit_code = 1 if code is None else code
        if code not in (0, None):
            self.log.warning(
                "sandboxed kernel %s exited with status %s%s", self.kernel_id, code, self._stderr_note()
            )

    def _stderr_note(self) -> str:
        tail = self._stderr_tail.decode("utf-8", "replace").strip()
        return f"; its last output: {tail[-800:]}" if tail else ""

    # ------------------------------------------------------------- lifecycle

    @property
    def has_process(self) -> bool:
        return self._handle is not None

    async def poll(self) -> int | None:
        return await self._run(self._poll())

    async def _poll(self) -> int | None:
        if self._handle is None:
            return 0
        if self._watch is not None and not self._watch.done():
            return None
        return self._exit_code if self._exit_code is not None else 0

    async def wait(self) -> int | None:
        return await self._run(self._wait())

    async def _wait(self) -> int | None:
        if self._handle is None:
            return 0
        if self._watch is not None:
            await asyncio.shield(self._watch)
        code = self._exit_code
        await self._kill_handle()
        self._handle = None
        return code

    async def _kill_handle(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(SandboxError):
                await self._handle.kill()

    async def send_signal(self, signum: int) -> None:
        await self._run(self._send_signal(signum))

    async def _send_signal(self, signum: int) -> None:
        if self._handle is None:
            return
        if signum == signal.SIGKILL:
            await self._kill_handle()
            return
        pid = await self._kernel_pid()
        if pid is None or self.session is None:
            if signum == signal.SIGTERM:
                await self._kill_handle()
            return
        try:
            await self.session.exec(["kill", f"-{int(signum)}", str(pid)], timeout_seconds=10)
        except SandboxError as e:
            self.log.warning("sandboxed kernel %s: signal %s failed: %s", self.kernel_id, signum, e)

    async def _kernel_pid(self) -> int | None:
        if self._pid is None and self.session is not None:
            with contextlib.suppress(SandboxError, ValueError):
                self._pid = int((await self.session.get_file(self._pid_file)).decode().strip())
        return self._pid

    async def kill(self, restart: bool = False) -> None:
        await self._run(self._kill_handle())

    async def terminate(self, restart: bool = False) -> None:
        await self._run(self._send_signal(signal.SIGTERM))

    async def cleanup(self, restart: bool = False) -> None:
        """Shutdown, culling and restart all end here: the session goes (a persistent workspace stays)."""
        await self._run(self._teardown())

    async def _teardown(self) -> None:
        handle, tunnel, session, watchdog = self._handle, self.tunnel, self.session, self._watchdog
        self.tunnel = self.session = self._watchdog = None
        if handle is not None:
            with contextlib.suppress(SandboxError):
                await handle.kill()
        if self._watch is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._watch), 10)
        self._handle = None
        if tunnel is not None:
            with contextlib.suppress(SandboxError, TunnelError):
                await tunnel.close()
        if session is not None:
            registry = getattr(self, "_registry", None)
            try:
                await session.destroy(remove_workspace=False)
            except SandboxError as e:
                if registry is not None and session.id not in registry.ids:
                    # the server's stop (its extension before its kernels) destroyed it already
                    self.log.debug(
                        "sandboxed kernel %s: session %s already gone: %s", self.kernel_id, session.id, e
                    )
                else:
                    self.log.warning(
                        "sandboxed kernel %s: destroying session %s: %s", self.kernel_id, session.id, e
                    )
            if registry is not None:
                registry.forget(session.id)
        await stop_watching(watchdog)

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 5.0)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, self.start_timeout_seconds)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info["session_id"] = self.session.id if self.session is not None else None
        return info


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


__all__ = ["PROVISIONER_NAME", "SandboxKernelError", "SandboxProvisioner"]
