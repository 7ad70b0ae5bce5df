"""The base tools: code that ships with the package, and that a preset can expose under a name.

:class:`SandboxExecTool` (``sandbox_exec``) accepts a declared input schema and is
fenced; :class:`SandboxStatusTool` (``sandbox_status``) has a fixed schema and is
open. :data:`BASE_TOOLS` holds one of each, by name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar, Protocol

from .. import sandboxes
from ..contract import ExecRequest, SandboxDurability, SandboxError, SessionSpec
from ..errors import ToolInputError
from ..providers._workspaces import workspace_identity
from .binding import _bind_list, _bind_value, binding_problems, preset_invalid

#: Extra seconds a tool's session lives past its command's deadline (it is destroyed right after).
_TTL_MARGIN = 120.0


class PresetParts(Protocol):
    """What a base tool reads of a preset over it (:class:`~.presets.Preset` is one).

    A preset knows its base tool; a base tool knows of a preset only these parts.
    """

    @property
    def input_schema(self) -> dict[str, Any] | None: ...

    @property
    def session(self) -> dict[str, Any]: ...

    @property
    def binding(self) -> dict[str, Any]: ...


class BaseTool:
    """Code a preset can expose under a name.

    ``accepts_input_schema`` is the explicit difference between base tools:
    False (the default, most tools) means the tool's input schema is fixed and a
    preset over it may not declare one; True means a preset declares the exposed
    tool's own schema and a ``binding`` routing it into this tool's input.
    ``tier = "fenced"`` makes authoring a preset over the tool and running it admin acts.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    input_schema: ClassVar[dict[str, Any]]
    accepts_input_schema: ClassVar[bool] = False
    tier: ClassVar[str] = "open"

    @property
    def fenced(self) -> bool:
        return self.tier == "fenced"

    def check_preset(self, preset: PresetParts) -> None:
        """Refuse (PresetInvalidError) a preset this base tool cannot serve, naming every problem."""
        problems = self.preset_problems(preset)
        if problems:
            raise preset_invalid(problems)

    def preset_problems(self, preset: PresetParts) -> list[str]:
        """Everything that keeps this base tool from serving ``preset`` (empty: it can)."""
        extra = [k for k in ("input_schema", "session", "binding") if getattr(preset, k)]
        if self.accepts_input_schema or not extra:
            return []
        return [
            f"base tool {self.name!r} has a fixed input schema: a preset over it may not declare "
            f"{', '.join(extra)} (only sandbox_exec accepts a declared schema)"
        ]

    def bind(self, preset: PresetParts, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """This tool's own input for a preset call (fixed-schema tools: the caller's input as is)."""
        return dict(inputs)

    async def run(
        self,
        inputs: Mapping[str, Any],
        *,
        consumer: str,
        owner: str | None = None,
        access: sandboxes.SandboxAccess | None = None,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": "base",
            "description": self.description,
            "base": self.name,
            "fenced": self.fenced,
            "accepts_input_schema": self.accepts_input_schema,
            "input_schema": self.input_schema,
            "source": "builtin",
        }


_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


class SandboxExecTool(BaseTool):
    """Run a command in a fresh session acquired through ``require_sandbox()``; schema-accepting, fenced."""

    name = "sandbox_exec"
    description = (
        "Run a command (argv, or a shell script with positional args) in a sandbox session and "
        "return its exit code, stdout and stderr."
    )
    accepts_input_schema = True
    tier = "fenced"
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "oneOf": [{"required": ["argv"]}, {"required": ["script"]}],
        "properties": {
            "argv": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "script": {
                "type": "string",
                "description": "shell text run as sh -c SCRIPT sandbox_exec ARGS...",
            },
            "args": {"type": "array", "items": {"type": "string"}, "description": "the script's $1, $2, ..."},
            "stdin": {"type": "string"},
            "env": _STRING_MAP,
            "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "default": 60},
            "network": {"enum": ["egress", "internal", "none"], "default": "egress"},
            "image": {"type": ["string", "null"]},
            "isolation": {"enum": ["none", "container", "vm", None]},
            "durability": {
                "enum": ["ephemeral", "persistent"],
                "description": "persistent with workspace_key",
            },
            "workspace_key": {
                "type": ["string", "null"],
                "description": "a durable workspace that outlives the run",
            },
            "cpu": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "memory_mb": {"type": ["integer", "null"], "exclusiveMinimum": 0},
        },
        "dependentSchemas": {"args": {"required": ["script"]}},
    }

    def preset_problems(self, preset: PresetParts) -> list[str]:
        problems = []
        if preset.input_schema is None:
            problems.append(
                "a preset over sandbox_exec declares input_schema: the JSON Schema of the tool's own input "
                '(e.g. {"type": "object", "properties": {"text": {"type": "string"}}})'
            )
        return problems + binding_problems(preset.binding, preset.input_schema)

    def bind(self, preset: PresetParts, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The bind kernel: fixed binding + validated caller fields -> sandbox_exec input."""
        b = preset.binding
        out: dict[str, Any] = {k: v for k, v in preset.session.items() if v is not None}
        if "argv" in b:
            out["argv"] = _bind_list(b["argv"], inputs, "argv")
            if not out["argv"]:
                raise ToolInputError("", "the bound argv is empty")
        else:
            out["script"] = b["script"]
            out["args"] = _bind_list(b.get("args", []), inputs, "args")
        if "stdin" in b:
            stdin = _bind_value(b["stdin"], inputs, "stdin")
            if stdin is not None:
                out["stdin"] = stdin
        env = {}
        for name, ref in b.get("env", {}).items():
            value = _bind_value(ref, inputs, "env")
            if value is not None:
                env[name] = value
        if env:
            out["env"] = env
        if "timeout_seconds" in b:
            timeout = b["timeout_seconds"]
            if isinstance(timeout, dict):
                timeout = inputs.get(timeout["field"])
            if timeout is not None:
                out["timeout_seconds"] = timeout
        return out

    async def run(
        self,
        inputs: Mapping[str, Any],
        *,
        consumer: str,
        owner: str | None = None,
        access: sandboxes.SandboxAccess | None = None,
    ) -> dict[str, Any]:
        timeout = inputs.get("timeout_seconds", 60)
        durability: SandboxDurability = inputs.get("durability") or (
            "persistent" if inputs.get("workspace_key") else "ephemeral"
        )
        spec = SessionSpec(
            image=inputs.get("image"),
            isolation=inputs.get("isolation"),
            network=inputs.get("network", "egress"),
            durability=durability,
            workspace_key=inputs.get("workspace_key"),
            cpu=inputs.get("cpu"),
            memory_mb=inputs.get("memory_mb"),
            ttl_seconds=_ttl_for(timeout),
            consumer=consumer,
            owner=owner,
        )
        if "argv" in inputs:
            argv = tuple(inputs["argv"])
        else:
            argv = ("sh", "-c", inputs["script"], "sandbox_exec", *inputs.get("args", []))
        stdin = inputs.get("stdin")
        access = access or sandboxes.PROCESS_ACCESS  # the server's own sandbox, or the process default
        sandbox = access.require()  # the policy gate: isolation, egress, credentials at create;
        # the timeout ceiling, the output limit and the scrub on the run. Admitted before the create, so a
        # refused run costs no session.
        request = sandbox.admit(
            ExecRequest(
                argv,
                timeout,
                env=dict(inputs.get("env") or {}),
                stdin=stdin.encode(errors="surrogatepass") if stdin is not None else None,
            ),
            one_shot=True,
        )
        # seed 002's per-workspace_key lease: runs on one durable workspace take turns
        async with _workspace_lease(access.workspace_leases, owner, spec.workspace_key):
            session = await sandbox.create(spec)
            try:
                result = await session.run(request)
            finally:
                with contextlib.suppress(SandboxError):
                    await session.destroy(remove_workspace=False)
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout.decode(errors="replace"),
            "stderr": result.stderr.decode(errors="replace"),
        }


@contextlib.asynccontextmanager
async def _workspace_lease(
    leases: dict[tuple[str | None, str], asyncio.Lock], owner: str | None, workspace_key: str | None
) -> AsyncIterator[None]:
    """One tool run at a time per persistent workspace (in this server: ``leases`` is its own); keys are a
    namespace per owner, so two owners' runs on keys of one name never wait on each other."""
    if workspace_key is None:
        yield
        return
    async with leases.setdefault(workspace_identity(owner, workspace_key), asyncio.Lock()):
        yield


def _ttl_for(timeout: Any) -> float:
    """A tool session's TTL: its command's deadline plus a margin (it is destroyed right after)."""
    try:
        return float(timeout) + _TTL_MARGIN
    except (TypeError, ValueError, OverflowError):
        return _TTL_MARGIN  # the request's own validation reports the bad timeout


class SandboxStatusTool(BaseTool):
    """The kind row and the policy in force; fixed schema (no input), open tier, no session."""

    name = "sandbox_status"
    description = "Which sandbox provider is installed (or 'off') and the policy in force."
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }

    async def run(
        self,
        inputs: Mapping[str, Any],
        *,
        consumer: str,
        owner: str | None = None,
        access: sandboxes.SandboxAccess | None = None,
    ) -> dict[str, Any]:
        return (access or sandboxes.PROCESS_ACCESS).status_info(show_credentials=owner is None)


BASE_TOOLS: dict[str, BaseTool] = {t.name: t for t in (SandboxExecTool(), SandboxStatusTool())}
