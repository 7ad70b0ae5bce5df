"""Code tools: the ``sandbox_exec`` base tool, presets over it, and the fenced admin tier.

A **base tool** is code that ships with the package. Most base tools have a fixed
input schema (``accepts_input_schema = False``): a preset over one can rename and
describe it, nothing more. ``sandbox_exec`` is the exception: it *accepts* a
schema, so a preset over it declares the exposed tool's own JSON Schema, fixes
the session settings and binds the caller's validated fields into the command --
as argv elements, stdin or environment values, never spliced into shell text.

Two chokepoints, which every door goes through:

* :meth:`ToolRegistry.author` / :meth:`ToolRegistry.remove` -- the **preset
  chokepoint** (REST ``PUT``/``DELETE tools/{name}``, the CLI's
  ``preset add|rm``, the ``SandboxApp.presets`` manifest): validation, name
  clashes, the fence, persistence.
* :meth:`ToolRegistry.run` -- the **tool-run chokepoint** (REST
  ``POST tools/{name}/run``, the CLI's ``preset run``): the fence, input
  validation, the bind kernel, then the base tool, which reaches a sandbox only
  through :func:`~jupyter_tai_sandbox.sandboxes.require_sandbox`.

A base tool in the ``fenced`` tier (``sandbox_exec``) makes authoring a preset
over it and running it admin acts: the acting :class:`Principal` must be allowed
``write`` (authoring) or ``execute`` (running) on ``jupyter_tai_sandbox:admin``.
Over REST that is the jupyter_server ``Authorizer``'s decision; the CLI and the
config door act as the operator (:data:`OPERATOR_CLI`, :data:`OPERATOR_CONFIG`),
who owns the server's files and configuration and is therefore admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match

from . import sandboxes
from .contract import (
    ExecRequest,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SessionSpec,
)
from .errors import (
    PresetConflictError,
    PresetInvalidError,
    PresetStoreError,
    ToolAccessDeniedError,
    ToolInputError,
)
from .sessions import ADMIN_RESOURCE

NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Session settings a preset may fix (the consumer is always the tool's name).
SESSION_FIELDS = ("image", "isolation", "network", "durability", "workspace_key", "cpu", "memory_mb")
_PRESET_FIELDS = {"name", "description", "base", "input_schema", "session", "binding"}
_BINDING_FIELDS = {"argv", "script", "args", "stdin", "env", "timeout_seconds"}
_REF_FIELDS = {"field", "spread"}
#: Extra seconds a tool's session lives past its command's deadline (it is destroyed right after).
_TTL_MARGIN = 120.0
STORE_VERSION = 1


# --------------------------------------------------------------------- errors


# ----------------------------------------------------------------- principals


class Principal:
    """Who acts at a chokepoint, and which admin actions it may take.

    ``owner`` is the user a tool's session belongs to (None for the operator's doors).
    """

    name = "anonymous"
    door = "?"
    owner: str | None = None

    def may(self, action: str) -> bool:
        """Whether ``action`` (``read``, ``write``, ``execute``) on ``jupyter_tai_sandbox:admin`` is allowed."""
        return False


@dataclass(frozen=True)
class Operator(Principal):
    """The operator: the CLI and the config door run as whoever owns the server's files and config."""

    door: str = "cli"

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"operator ({self.door})"

    def may(self, action: str) -> bool:
        return True


@dataclass(frozen=True)
class Decided(Principal):
    """A principal whose admin actions were decided up front (e.g. by jupyter_server's Authorizer)."""

    name: str = "user"  # type: ignore[assignment]
    door: str = "rest"
    allowed: frozenset[str] = frozenset()
    owner: str | None = None

    def may(self, action: str) -> bool:
        return action in self.allowed


OPERATOR_CLI = Operator("cli")
OPERATOR_CONFIG = Operator("config")


def fence(principal: Principal, action: str, what: str) -> None:
    """The admin tier's one check, used by both chokepoints."""
    if not principal.may(action):
        raise ToolAccessDeniedError(
            f"{principal.name} may not {what}: that is an admin act (action {action!r} on "
            f"{ADMIN_RESOURCE}), which this server's authorizer does not grant"
        )


# ----------------------------------------------------------------- base tools


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

    def check_preset(self, preset: Preset) -> None:
        """Refuse (PresetInvalidError) a preset this base tool cannot serve."""
        if not self.accepts_input_schema:
            extra = [k for k in ("input_schema", "session", "binding") if getattr(preset, k)]
            if extra:
                raise PresetInvalidError(
                    f"base tool {self.name!r} has a fixed input schema: a preset over it may not declare "
                    f"{', '.join(extra)} (only sandbox_exec accepts a declared schema)"
                )

    def bind(self, preset: Preset, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """This tool's own input for a preset call (fixed-schema tools: the caller's input as is)."""
        return dict(inputs)

    async def run(
        self, inputs: Mapping[str, Any], *, consumer: str, owner: str | None = None, output_limit: int | None = None
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
            "script": {"type": "string", "description": "shell text run as sh -c SCRIPT sandbox_exec ARGS..."},
            "args": {"type": "array", "items": {"type": "string"}, "description": "the script's $1, $2, ..."},
            "stdin": {"type": "string"},
            "env": _STRING_MAP,
            "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "default": 60},
            "network": {"enum": ["egress", "internal", "none"], "default": "egress"},
            "image": {"type": ["string", "null"]},
            "isolation": {"enum": ["none", "container", "vm", None]},
            "durability": {"enum": ["ephemeral", "persistent"], "description": "persistent with workspace_key"},
            "workspace_key": {"type": ["string", "null"], "description": "a durable workspace that outlives the run"},
            "cpu": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "memory_mb": {"type": ["integer", "null"], "exclusiveMinimum": 0},
        },
        "dependentSchemas": {"args": {"required": ["script"]}},
    }

    def check_preset(self, preset: Preset) -> None:
        if preset.input_schema is None:
            raise PresetInvalidError(
                "a preset over sandbox_exec declares input_schema: the JSON Schema of the tool's own input "
                '(e.g. {"type": "object", "properties": {"text": {"type": "string"}}})'
            )
        check_binding(preset.binding, preset.input_schema)

    def bind(self, preset: Preset, inputs: Mapping[str, Any]) -> dict[str, Any]:
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
        self, inputs: Mapping[str, Any], *, consumer: str, owner: str | None = None, output_limit: int | None = None
    ) -> dict[str, Any]:
        timeout = inputs.get("timeout_seconds", 60)
        durability = inputs.get("durability") or ("persistent" if inputs.get("workspace_key") else "ephemeral")
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
            argv = list(inputs["argv"])
        else:
            argv = ["sh", "-c", inputs["script"], "sandbox_exec", *inputs.get("args", [])]
        stdin = inputs.get("stdin")
        sandbox = sandboxes.require_sandbox()  # the policy gate: isolation, egress, credentials
        request = ExecRequest(
            argv,
            timeout,
            env=dict(inputs.get("env") or {}),
            stdin=stdin.encode(errors="surrogatepass") if stdin is not None else None,
            output_limit=output_limit,
        ).check_limit(sandbox.policy.max_timeout_seconds)
        # seed 002's per-workspace_key lease: runs on one durable workspace take turns
        async with _workspace_lease(spec.workspace_key):
            session = await sandbox.create(spec)
            try:
                result = await session.run(request)
            finally:
                with contextlib.suppress(SandboxError):
                    await session.destroy(remove_workspace=False)
        scrub = sandbox.policy.scrub
        return {
            "exit_code": result.exit_code,
            "stdout": scrub(result.stdout.decode(errors="replace")),
            "stderr": scrub(result.stderr.decode(errors="replace")),
        }


_leases: dict[str, asyncio.Lock] = {}


@contextlib.asynccontextmanager
async def _workspace_lease(workspace_key: str | None) -> AsyncIterator[None]:
    """One tool run at a time per persistent workspace (in this server)."""
    if workspace_key is None:
        yield
        return
    async with _leases.setdefault(workspace_key, asyncio.Lock()):
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
    input_schema: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}, "additionalProperties": False}

    async def run(
        self, inputs: Mapping[str, Any], *, consumer: str, owner: str | None = None, output_limit: int | None = None
    ) -> dict[str, Any]:
        return sandboxes.status_info(show_credentials=owner is None)


BASE_TOOLS: dict[str, BaseTool] = {t.name: t for t in (SandboxExecTool(), SandboxStatusTool())}


# -------------------------------------------------------------------- binding


def _fenced_base(definition: Any) -> bool:
    """Whether a stored definition's base tool is fenced (an unknown base counts as fenced)."""
    base_name = definition.get("base", "sandbox_exec") if isinstance(definition, Mapping) else None
    base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
    return base is None or base.fenced


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict)


def _check_ref(ref: Any, where: str, properties: Mapping[str, Any], *, spread_ok: bool) -> None:
    if isinstance(ref, str):
        return
    if not isinstance(ref, dict) or "field" not in ref or set(ref) - _REF_FIELDS:
        raise PresetInvalidError(
            f"binding.{where}: each element is fixed text or a field reference "
            '{"field": NAME} (+ "spread": true for an array in argv/args)'
        )
    name = ref["field"]
    if not isinstance(name, str) or name not in properties:
        declared = ", ".join(sorted(properties)) or "none"
        raise PresetInvalidError(
            f"binding.{where} references field {name!r}, which input_schema does not declare "
            f"(declared properties: {declared})"
        )
    if ref.get("spread") and not spread_ok:
        raise PresetInvalidError(f"binding.{where}: spread is only allowed in argv and args")
    if "spread" in ref and not isinstance(ref["spread"], bool):
        raise PresetInvalidError(f"binding.{where}: spread is true or false")


def check_binding(binding: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Refuse a binding that is malformed or names a field the schema does not declare."""
    if not isinstance(binding, Mapping) or not binding:
        raise PresetInvalidError(
            'a preset over sandbox_exec needs a binding, e.g. {"argv": ["wc", "-w"], "stdin": {"field": "text"}}'
        )
    unknown = sorted(set(binding) - _BINDING_FIELDS)
    if unknown:
        raise PresetInvalidError(
            f"unknown binding field(s): {', '.join(unknown)}; known: {', '.join(sorted(_BINDING_FIELDS))}"
        )
    properties = schema.get("properties") or {}
    if ("argv" in binding) == ("script" in binding):
        raise PresetInvalidError("binding needs exactly one of argv (a list) or script (fixed shell text)")
    if "argv" in binding:
        if not isinstance(binding["argv"], list) or not binding["argv"]:
            raise PresetInvalidError("binding.argv is a non-empty list of fixed strings and field references")
        if "args" in binding:
            raise PresetInvalidError("binding.args (the script's positional parameters) needs binding.script")
        if not isinstance(binding["argv"][0], str):
            raise PresetInvalidError("binding.argv[0], the program, is fixed text, never caller input")
        for i, item in enumerate(binding["argv"]):
            _check_ref(item, f"argv[{i}]", properties, spread_ok=True)
    else:
        if not isinstance(binding["script"], str) or not binding["script"].strip():
            raise PresetInvalidError(
                "binding.script is fixed shell text; caller input reaches it only as $1.. (args), stdin or env"
            )
        args = binding.get("args", [])
        if not isinstance(args, list):
            raise PresetInvalidError("binding.args is a list of fixed strings and field references")
        for i, item in enumerate(args):
            _check_ref(item, f"args[{i}]", properties, spread_ok=True)
    if "stdin" in binding:
        _check_ref(binding["stdin"], "stdin", properties, spread_ok=False)
    env = binding.get("env", {})
    if not isinstance(env, dict):
        raise PresetInvalidError("binding.env maps variable names to fixed strings or field references")
    for name, ref in env.items():
        if not _ENV_NAME.match(name):
            raise PresetInvalidError(f"binding.env: invalid environment variable name {name!r}")
        _check_ref(ref, f"env.{name}", properties, spread_ok=False)
    if "timeout_seconds" in binding:
        timeout = binding["timeout_seconds"]
        if _is_ref(timeout):
            _check_ref(timeout, "timeout_seconds", properties, spread_ok=False)
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise PresetInvalidError("binding.timeout_seconds is a positive number or a field reference")


def _text(value: Any, field: str, where: str) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if where != "stdin" and "\x00" in text:
        raise ToolInputError(
            field, f"contains a NUL byte, which cannot travel in {where}; a preset binds such input to stdin"
        )
    return text


def _bind_value(ref: Any, inputs: Mapping[str, Any], where: str) -> str | None:
    if isinstance(ref, str):
        return ref
    name = ref["field"]
    if name not in inputs or inputs[name] is None:
        return None
    return _text(inputs[name], name, where)


def _bind_list(items: list[Any], inputs: Mapping[str, Any], where: str) -> list[str]:
    out: list[str] = []
    for item in items:
        if isinstance(item, dict) and item.get("spread"):
            values = inputs.get(item["field"])
            if values is None:
                continue
            if not isinstance(values, list):
                values = [values]
            out.extend(_text(v, item["field"], where) for v in values)
        else:
            value = _bind_value(item, inputs, where)
            if value is not None:
                out.append(value)
    return out


# -------------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """A named tool over a base tool: its own schema, fixed session settings, a binding."""

    name: str
    description: str
    base: str = "sandbox_exec"
    input_schema: dict[str, Any] | None = None
    session: dict[str, Any] = field(default_factory=dict)
    binding: dict[str, Any] = field(default_factory=dict)
    source: str = "store"

    def definition(self) -> dict[str, Any]:
        """What is stored and authored (without ``source``)."""
        data: dict[str, Any] = {"name": self.name, "description": self.description, "base": self.base}
        if self.input_schema is not None:
            data["input_schema"] = copy.deepcopy(self.input_schema)
        if self.session:
            data["session"] = dict(self.session)
        if self.binding:
            data["binding"] = copy.deepcopy(self.binding)
        return data

    def to_json(self) -> dict[str, Any]:
        base = BASE_TOOLS.get(self.base)
        return {
            **self.definition(),
            "kind": "preset",
            "fenced": bool(base and base.fenced),
            "input_schema": self.schema(),
            "source": self.source,
        }

    def schema(self) -> dict[str, Any]:
        if self.input_schema is not None:
            return self.input_schema
        return BASE_TOOLS[self.base].input_schema


def parse_preset(definition: Any, *, name: str | None = None, source: str = "store") -> Preset:
    """Validate a preset definition completely (PresetInvalidError), before anything is stored."""
    if not isinstance(definition, Mapping):
        raise PresetInvalidError("a preset is a JSON object: name, description, base, input_schema, session, binding")
    data = dict(definition)
    if name is not None and data.setdefault("name", name) != name:
        raise PresetInvalidError(f"the preset's name {data['name']!r} differs from {name!r} in the path/key")
    unknown = sorted(set(data) - _PRESET_FIELDS)
    if unknown:
        raise PresetInvalidError(
            f"unknown preset field(s): {', '.join(unknown)}; known: {', '.join(sorted(_PRESET_FIELDS))}"
        )
    preset_name = data.get("name")
    if not isinstance(preset_name, str) or not NAME_PATTERN.match(preset_name):
        raise PresetInvalidError(
            f"invalid preset name {preset_name!r}: 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        raise PresetInvalidError("a preset needs a description: the text a caller (or a model) reads")
    base_name = data.get("base", "sandbox_exec")
    base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
    if base is None:
        raise PresetInvalidError(f"unknown base tool {base_name!r}: known base tools are {', '.join(BASE_TOOLS)}")
    schema = data.get("input_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise PresetInvalidError("input_schema must be a JSON Schema object")
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as e:
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            raise PresetInvalidError(f"input_schema is not valid JSON Schema at {where}: {e.message}") from None
        except RecursionError:
            raise PresetInvalidError("input_schema is nested too deeply to check") from None
        if schema.get("type") != "object":
            raise PresetInvalidError('input_schema describes the input object: it needs "type": "object"')
        if not isinstance(schema.get("properties", {}), dict):
            raise PresetInvalidError("input_schema.properties must be an object")
    session = data.get("session") or {}
    if not isinstance(session, dict):
        raise PresetInvalidError(f"session is an object of fixed session settings: {', '.join(SESSION_FIELDS)}")
    unknown = sorted(set(session) - set(SESSION_FIELDS))
    if unknown:
        raise PresetInvalidError(
            f"unknown session setting(s): {', '.join(unknown)}; a preset may fix {', '.join(SESSION_FIELDS)}"
        )
    if session:
        settings = dict(session)
        if settings.get("workspace_key") and "durability" not in settings:
            settings["durability"] = "persistent"
        try:
            SessionSpec(**settings, consumer=preset_name)
        except SandboxSpecRejectedError as e:
            raise PresetInvalidError(f"session: {e}") from None
    binding = data.get("binding") or {}
    preset = Preset(
        name=preset_name,
        description=description,
        base=base_name,
        input_schema=copy.deepcopy(schema),
        session=dict(session),
        binding=copy.deepcopy(binding) if isinstance(binding, dict) else binding,
        source=source,
    )
    base.check_preset(preset)
    return preset


def validate_input(schema: Mapping[str, Any], inputs: Any) -> dict[str, Any]:
    """The caller's input, validated against ``schema`` with top-level defaults filled in (ToolInputError)."""
    if not isinstance(inputs, Mapping):
        raise ToolInputError("", "the input is a JSON object")
    try:
        error = best_match(Draft202012Validator(schema).iter_errors(inputs))
    except RecursionError:
        raise ToolInputError("", "the input is nested too deeply to check") from None
    if error is not None:
        raise ToolInputError(_field_of(error), error.message)
    data = dict(inputs)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in data and isinstance(prop, dict) and "default" in prop:
            data[name] = copy.deepcopy(prop["default"])
    return data


def _field_of(error: ValidationError) -> str:
    path = [str(p) for p in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, Mapping):
        missing = [n for n in error.validator_value if n not in instance]
        path += missing[:1]
    elif error.validator == "additionalProperties" and isinstance(instance, Mapping):
        known = set((error.schema or {}).get("properties", {}))
        extra = sorted(n for n in instance if n not in known)
        path += extra[:1]
    return ".".join(path)


# ---------------------------------------------------------------------- store


def default_store_path() -> Path:
    """``<jupyter data dir>/tai_sandbox/presets.json`` (JUPYTER_DATA_DIR moves it)."""
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "tai_sandbox" / "presets.json"


class PresetStore:
    """Presets authored at run time, in one JSON file replaced atomically on every change."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path else default_store_path()
        self._cache: tuple[tuple[int, int], dict[str, dict[str, Any]]] | None = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialize read-modify-write between processes (the server and the CLI)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: atomic replace only
            yield
            return
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def load(self) -> dict[str, dict[str, Any]]:
        """name -> stored definition (as written; validated by the registry)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return {}
        stamp = (stat.st_mtime_ns, stat.st_size)
        if self._cache is not None and self._cache[0] == stamp:
            return copy.deepcopy(self._cache[1])
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PresetStoreError(f"cannot read the preset store {self.path}: {e}") from None
        presets = data.get("presets") if isinstance(data, dict) else None
        if not isinstance(presets, dict):
            raise PresetStoreError(f"the preset store {self.path} is not a {{'presets': {{...}}}} object")
        self._cache = (stamp, presets)
        return copy.deepcopy(presets)

    def save(self, presets: Mapping[str, Mapping[str, Any]]) -> None:
        """Write the whole store to a temporary file beside it, fsync, then rename over it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": STORE_VERSION, "presets": presets}, indent=2, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".presets-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise PresetStoreError(f"cannot write the preset store {self.path}: {e}") from None
            raise
        self._cache = None


# ------------------------------------------------------------------- registry


class ToolRegistry:
    """Base tools, config (manifest) presets and stored presets: the two chokepoints live here."""

    def __init__(
        self,
        store: PresetStore | None = None,
        log: Any = None,
        *,
        max_preset_bytes: int = 64 << 10,
        max_presets: int = 200,
        max_output_bytes: int = 64 << 20,
    ) -> None:
        self.store = store if store is not None else PresetStore()
        self.config: dict[str, Preset] = {}
        self.log = log
        self.max_preset_bytes = max_preset_bytes
        self.max_presets = max_presets
        self.max_output_bytes = max_output_bytes
        self._shadowed: set[str] = set()

    # --- reading (not fenced)

    def _stored(self) -> dict[str, Preset]:
        out = {}
        for name, definition in self.store.load().items():
            if name in BASE_TOOLS or name in self.config:
                # a config preset shadows a stored one of the same name
                if self.log is not None and name not in self._shadowed:
                    self._shadowed.add(name)
                    self.log.warning("preset %r in %s is shadowed by the server's config", name, self.store.path)
                continue
            try:
                out[name] = parse_preset(definition, name=name, source="store")
            except PresetInvalidError as e:
                raise PresetStoreError(
                    f"preset {name!r} in {self.store.path} is invalid ({e}): remove it with "
                    f"`jupyter tai-sandbox preset rm {name}` and author it again"
                ) from None
        return out

    def presets(self) -> dict[str, Preset]:
        return {**self._stored(), **self.config}

    def get(self, name: str) -> BaseTool | Preset:
        if name in BASE_TOOLS:
            return BASE_TOOLS[name]
        if name in self.config:
            return self.config[name]
        stored = self.store.load()
        if name not in stored:
            raise SandboxNotFoundError(f"no tool named {name!r}: GET tools lists them")
        return self._stored()[name]

    def list_json(self) -> list[dict[str, Any]]:
        tools = [t.to_json() for t in BASE_TOOLS.values()]
        return tools + [p.to_json() for _, p in sorted(self.presets().items())]

    # --- the preset chokepoint (every authoring door)

    def author(
        self,
        definition: Any,
        *,
        principal: Principal,
        name: str | None = None,
        replace: bool = False,
    ) -> Preset:
        """Validate, fence and persist a preset (a config preset is kept in memory, not stored)."""
        source = "config" if principal == OPERATOR_CONFIG else "store"
        base_name = definition.get("base", "sandbox_exec") if isinstance(definition, Mapping) else None
        base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
        # fence before validation: a refused principal learns nothing about the definition
        if base is None or base.fenced:
            fence(principal, "write", f"author a preset over {base_name or 'sandbox_exec'}")
        if source == "store":
            self._check_size(definition)
        preset = parse_preset(definition, name=name, source=source)
        if preset.name in BASE_TOOLS:
            raise PresetConflictError(f"{preset.name!r} is a base tool: give the preset another name")
        if source == "config":
            self.config[preset.name] = preset
            return preset
        if preset.name in self.config:
            raise PresetConflictError(
                f"preset {preset.name!r} is defined by the server's config (SandboxApp.presets): change it there"
            )
        with self.store.locked():
            stored = self.store.load()
            if preset.name in stored and not replace:
                raise PresetConflictError(
                    f"a preset named {preset.name!r} exists: remove it first, or replace it "
                    "(REST: PUT ...?replace=1, CLI: preset add --replace)"
                )
            if preset.name in stored:
                # replacing needs the fence of the definition it replaces, too
                if _fenced_base(stored[preset.name]):
                    fence(principal, "write", f"replace the tool {preset.name!r}")
            elif self.max_presets and len(stored) >= self.max_presets:
                raise PresetInvalidError(
                    f"the preset store holds {len(stored)} presets, the most allowed "
                    "(SandboxApp.max_presets): remove one first"
                )
            stored[preset.name] = preset.definition()
            self.store.save(stored)
        return preset

    def _check_size(self, definition: Any) -> None:
        try:
            size = len(json.dumps(definition))
        except (TypeError, ValueError):
            return  # parse_preset says what is wrong with it
        if self.max_preset_bytes and size > self.max_preset_bytes:
            raise PresetInvalidError(
                f"the preset definition is {size} bytes of JSON; the limit is {self.max_preset_bytes} "
                "(SandboxApp.max_preset_bytes)"
            )

    def remove(self, name: str, *, principal: Principal) -> None:
        """Delete a stored preset (the authoring chokepoint, so the fence applies)."""
        with self.store.locked():
            stored = self.store.load()
            target = self.config.get(name) or stored.get(name) or BASE_TOOLS.get(name)
            if target is None:
                raise SandboxNotFoundError(f"no stored preset named {name!r}")
            if isinstance(target, (Preset, BaseTool)):
                base_name = target.base if isinstance(target, Preset) else target.name
            else:
                base_name = target.get("base", "sandbox_exec") if isinstance(target, dict) else None
            base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
            if base is None or base.fenced:
                fence(principal, "write", f"remove the tool {name!r}")
            if name in BASE_TOOLS:
                raise PresetConflictError(f"{name!r} is a base tool; it cannot be removed")
            if name in self.config:
                raise PresetConflictError(
                    f"preset {name!r} is defined by the server's config (SandboxApp.presets): remove it there"
                )
            del stored[name]
            self.store.save(stored)

    def apply_manifest(self, presets: Mapping[str, Any]) -> list[Preset]:
        """The config door (SandboxApp.presets): every entry through the chokepoint, as the operator."""
        applied, before = [], dict(self.config)
        for name, definition in presets.items():
            try:
                applied.append(self.author(definition, principal=OPERATOR_CONFIG, name=name))
            except SandboxError as e:
                self.config = before  # all or nothing
                raise PresetInvalidError(f"SandboxApp.presets[{name!r}]: {e}") from None
        return applied

    # --- the tool-run chokepoint (every run door)

    async def run(self, name: str, inputs: Any, *, principal: Principal) -> dict[str, Any]:
        """Fence, validate the input against the tool's schema, bind, and run the base tool."""
        tool = self.get(name)
        base = BASE_TOOLS[tool.base] if isinstance(tool, Preset) else tool
        if base.fenced:
            fence(principal, "execute", f"run the tool {name!r}")
        if isinstance(tool, Preset):
            data = validate_input(tool.schema(), inputs)
            bound = base.bind(tool, data)
        else:
            bound = inputs
        try:
            base_input = validate_input(base.input_schema, bound)
        except ToolInputError as e:
            if isinstance(tool, Preset):
                raise ToolInputError(e.field, f"preset {name!r} bound an invalid {base.name} input: {e}") from None
            raise
        return await base.run(
            base_input, consumer=name, owner=principal.owner, output_limit=self.max_output_bytes or None
        )
