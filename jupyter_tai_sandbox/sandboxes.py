"""The sandbox slot: one installed provider, reached only through the policy gate.

``require_sandbox()`` is the chokepoint every door that runs code goes through
(REST, websocket, magics, the panel, ``sandbox_exec``). It hands out the
installed provider wrapped in :class:`~jupyter_tai_sandbox.gate.GatedSandbox`,
which applies the operator's :class:`~jupyter_tai_sandbox.policy.SandboxPolicy` to
every spec at create and hands out sessions that apply it to every command (the
timeout ceiling, the output limit, the transcript scrub), so no consumer reaches a
provider without the policy.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import os
from typing import Any

from .contract import (
    ISOLATION_FLOOR_HINTS,
    Sandbox,
    SandboxError,
    SandboxUnavailableError,
    isolation_rank,
)
from .gate import DEFAULT_OUTPUT_LIMIT, GatedSandbox
from .gate import GatedSession as GatedSession  # the sessions the gate hands out
from .policy import SandboxPolicy
from .suggest import did_you_mean

#: The entry-point group a distribution names its providers in (``name = "module:Class"``), as
#: ``jupyter_client.kernel_provisioners`` does for provisioners: a name found there is a provider name.
PROVIDER_ENTRY_POINTS = "jupyter_tai_sandbox.providers"
#: Built-in provider names and the classes behind them: this package's own entry points (pyproject.toml),
#: and the names used when its metadata is not installed (a source tree on sys.path).
BUILTIN_PROVIDERS = {
    "local": "jupyter_tai_sandbox.providers.local:LocalSandbox",
    "docker": "jupyter_tai_sandbox.providers.docker:DockerSandbox",
    "swarm": "jupyter_tai_sandbox.providers.swarm:SwarmSandbox",
    "remote": "jupyter_tai_sandbox.providers.remote:RemoteSandbox",
    "vm": "jupyter_tai_sandbox.providers.vm:VmSandbox",
}
OFF_VALUES = {"", "off", "none"}
#: the values SandboxApp.provider (TAI_MCP_SANDBOX) takes, for help texts and hints
PROVIDER_CHOICES = "off, " + ", ".join(BUILTIN_PROVIDERS) + " or module:Class"

_installed: GatedSandbox | None = None
#: True once the slot was set explicitly (a provider registered, or switched off by the app):
#: from then on TAI_MCP_SANDBOX is not consulted.
_configured = False
#: The policy a registration without its own gets: the server extension's configured one while it runs.
_default_policy: SandboxPolicy | None = None
#: The one-shot output limit a registration without its own gets: the server's SandboxApp.max_output_bytes
#: while it runs (None: DEFAULT_OUTPUT_LIMIT).
_default_output_limit: int | None = None
#: Why the configured provider could not start (the slot then answers SandboxUnavailableError with it).
_failure: str | None = None


def registered_providers() -> dict[str, str]:
    """The provider names installed distributions register (PROVIDER_ENTRY_POINTS), each with its ``module:Class``."""
    return {entry.name: entry.value for entry in importlib.metadata.entry_points(group=PROVIDER_ENTRY_POINTS)}


def load_provider_class(name: str) -> type[Sandbox]:
    """The provider class for a name registered as an entry point (PROVIDER_ENTRY_POINTS), a built-in name
    (BUILTIN_PROVIDERS) or a ``module:Class`` sandbox_module."""
    registered = {} if ":" in name else registered_providers()
    target = registered.get(name) or BUILTIN_PROVIDERS.get(name, name)
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        hint = did_you_mean(name, [*BUILTIN_PROVIDERS, *registered, "off"])
        raise SandboxUnavailableError(
            f"unknown sandbox provider {name!r}: {hint}set TAI_MCP_SANDBOX (sandbox_module) to {PROVIDER_CHOICES}"
        )
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise SandboxUnavailableError(
            f"cannot load sandbox provider {name!r} named by TAI_MCP_SANDBOX (sandbox_module): {e}"
        ) from e
    if not (isinstance(cls, type) and issubclass(cls, Sandbox)):
        raise SandboxUnavailableError(
            f"sandbox_module {name!r} (TAI_MCP_SANDBOX) is not a Sandbox provider class"
        )
    return cls


class SandboxAccess:
    """How one holder reaches its sandbox: a server's own gate (or why it has none), and the
    per-holder state of its doors. Each SandboxApp holds one, so two servers in one process share
    nothing; :data:`PROCESS_ACCESS` is the process default (the module slot below), for code outside
    a server."""

    def __init__(self) -> None:
        self.gate: GatedSandbox | None = None
        self.failure: str | None = None
        #: one tool run at a time per persistent workspace, (owner, workspace_key) (sandbox_exec's lease), per holder
        self.workspace_leases: dict[tuple[str | None, str], asyncio.Lock] = {}

    def require(self) -> GatedSandbox:
        """The holder's provider behind its gate, or a loud SandboxUnavailableError."""
        if self.failure is not None:
            raise SandboxUnavailableError(self.failure)
        if self.gate is None:
            raise SandboxUnavailableError(_NO_PROVIDER)
        return self.gate

    def status_info(self, *, show_credentials: bool = True) -> dict[str, Any]:
        return describe(self.gate, self.failure, show_credentials=show_credentials)


class _ProcessAccess(SandboxAccess):
    """The module slot as a SandboxAccess (it consults TAI_MCP_SANDBOX, as require_sandbox() does)."""

    def require(self) -> GatedSandbox:
        return require_sandbox()

    def status_info(self, *, show_credentials: bool = True) -> dict[str, Any]:
        return status_info(show_credentials=show_credentials)


_NO_PROVIDER = (
    "no sandbox provider is installed: set TAI_MCP_SANDBOX (the sandbox_module setting, "
    f"SandboxApp.provider) to one of {', '.join(BUILTIN_PROVIDERS)} or a module:Class provider"
)

#: the process default: the module slot, for code outside a server (kernels, scripts, plugins)
PROCESS_ACCESS: SandboxAccess = _ProcessAccess()


def register_sandbox(
    provider: Sandbox,
    *,
    policy: SandboxPolicy | None = None,
    replace: bool = False,
    output_limit: int | None = None,
    spill_limit: int | None = None,
) -> Sandbox:
    """Install ``provider`` as the deployment's one sandbox; return it behind the gate.

    The slot holds a single provider: registering a second one is an error unless
    ``replace`` is set. ``output_limit``: most output bytes a one-shot run keeps, on
    every door (0: no limit; None: the server's ``SandboxApp.max_output_bytes`` while
    it runs, else 64 MiB).
    """
    global _installed, _configured, _failure
    if not isinstance(provider, Sandbox):
        raise SandboxError(f"register_sandbox needs a Sandbox provider, got {type(provider).__name__}")
    if isinstance(provider, GatedSandbox):
        provider = provider.provider
    if _installed is not None and not replace and _installed.provider is not provider:
        raise SandboxError(
            f"a {_installed.kind} sandbox provider is already installed: a deployment has exactly one"
        )
    if output_limit is None:
        output_limit = DEFAULT_OUTPUT_LIMIT if _default_output_limit is None else _default_output_limit
    _installed = GatedSandbox(
        provider, policy or _default_policy or SandboxPolicy(), output_limit, spill_limit
    )
    _configured = True
    _failure = None
    return _installed


def use_policy(policy: SandboxPolicy | None, *, output_limit: int | None = None) -> None:
    """Make ``policy`` (and ``output_limit``, when given) the one in force: for the provider
    installed now and any registered later.

    The server extension calls this with its configured policy and ``SandboxApp.max_output_bytes``,
    so a plugin's ``register_sandbox(provider)`` without them gets the server's, not a policy read
    from environment variables alone.
    """
    global _default_policy, _default_output_limit
    _default_policy = policy
    if output_limit is not None:
        _default_output_limit = output_limit
    if _installed is not None and policy is not None:
        _installed.policy = policy
    if _installed is not None and output_limit is not None:
        _installed.output_limit = output_limit


def mark_failed(message: str) -> None:
    """The configured provider could not start: every call answers SandboxUnavailableError(message)."""
    global _installed, _configured, _failure
    _installed, _configured, _failure = None, True, message


def configured() -> bool:
    """Whether the slot was set explicitly (a provider registered, or switched off): then
    TAI_MCP_SANDBOX is not consulted."""
    return _configured


def installed() -> GatedSandbox | None:
    """The gated provider in the slot, without consulting the environment."""
    return _installed


def disable_sandbox() -> Sandbox | None:
    """Switch the slot off explicitly (the kind row reads ``off``); return the previous provider."""
    global _configured
    previous = unregister_sandbox()
    _configured = True
    return previous


def unregister_sandbox() -> Sandbox | None:
    """Empty the slot and forget any explicit setting; return the provider that was installed."""
    global _installed, _configured, _failure, _default_policy, _default_output_limit
    previous, _installed, _configured, _failure, _default_policy = _installed, None, False, None, None
    _default_output_limit = None
    return previous.provider if previous else None


def _install_from_env() -> None:
    """Without explicit configuration, TAI_MCP_SANDBOX names the provider (for scripts)."""
    name = os.environ.get("TAI_MCP_SANDBOX", "").strip()
    if _configured or name.lower() in OFF_VALUES:
        return
    register_sandbox(load_provider_class(name)())


def require_sandbox() -> GatedSandbox:
    """The installed provider behind the policy gate, or a loud SandboxUnavailableError."""
    _install_from_env()
    if _failure is not None:
        raise SandboxUnavailableError(_failure)
    if _installed is None:
        raise SandboxUnavailableError(_NO_PROVIDER)
    return _installed


def status() -> str:
    """The kind row: the installed provider's kind, or ``off``."""
    try:
        _install_from_env()
    except SandboxUnavailableError:
        return "off"
    return _installed.kind if _installed is not None else "off"


def failure() -> str | None:
    """Why the configured provider could not start, or None."""
    return _failure


def status_info(*, show_credentials: bool = True) -> dict[str, Any]:
    """The kind row with the policy in force and, when off, how to turn it on.

    ``show_credentials=False`` leaves out which consumer holds which credential names
    (only admins see that map).
    """
    status()  # consults TAI_MCP_SANDBOX once, as require_sandbox() does
    return describe(_installed, _failure, show_credentials=show_credentials)


def describe(
    gate: GatedSandbox | None, failure: str | None, *, show_credentials: bool = True
) -> dict[str, Any]:
    """The kind row of ``gate`` (None: off, or ``failure`` says why it could not start)."""
    info: dict[str, Any] = {"kind": gate.kind if gate is not None else "off"}
    if failure is not None:
        info["error"] = failure
    if gate is not None:
        info["policy"] = gate.policy.public_json(show_credentials=show_credentials)
        info["max_isolation"] = gate.max_isolation
        info["networks"] = sorted(gate.networks)
        info["supports_limits"] = gate.supports_limits
        if gate.isolation_note:
            info["isolation_note"] = gate.isolation_note
        info["pausable"] = gate.pausable
        info["forkable"] = gate.forkable
        info["egress_policy"] = gate.egress_policy
        limits = provider_limits(gate.provider) if gate.supports_limits else {}
        if limits:
            info["limits"] = limits
        refused = floor_refusal(gate.kind, gate.policy.isolation, gate.max_isolation)
        if refused:
            info["create_refused"] = refused
    else:
        info["message"] = failure or (
            "no sandbox provider is installed: set TAI_MCP_SANDBOX (sandbox_module) to one of "
            + ", ".join(BUILTIN_PROVIDERS)
        )
    return info


#: the cpu/memory bounds of a provider with limits the status route shows, so a New session form can say what an
#: empty field means
LIMIT_SETTINGS = ("default_cpu", "max_cpu", "default_memory_mb", "max_memory_mb")


def provider_limits(provider: Sandbox) -> dict[str, float]:
    """The provider's cpu/memory defaults and maxima (0: none), from its session limits; none at all when it
    declares no bound (a remote provider: its server decides)."""
    limits = provider.session_limits()
    values = {name: getattr(limits, name) for name in LIMIT_SETTINGS}
    return values if any(values.values()) else {}


def floor_refusal(kind: str, floor: str, max_isolation: str) -> str | None:
    """Why every create is refused when the operator's isolation floor is over what the provider
    gives (the server's words: it names the server's option), else None."""
    if isolation_rank(floor) <= isolation_rank(max_isolation):
        return None
    hint = ISOLATION_FLOOR_HINTS["server"].format(level=max_isolation)
    return (
        f"every session create is refused: the isolation floor is {floor!r} but the {kind} provider gives "
        f"{max_isolation!r} at most. Lower the floor ({hint}) and restart the server, "
        "or use a stronger provider."
    )
