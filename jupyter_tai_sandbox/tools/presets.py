"""Presets: a named tool over a base tool, and :func:`parse_preset`, which validates a definition."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from ..contract import SandboxSpecRejectedError, SessionSpec
from ..errors import PresetInvalidError
from .base_tools import BASE_TOOLS

NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
#: Session settings a preset may fix (the consumer is always the tool's name).
SESSION_FIELDS = ("image", "isolation", "network", "durability", "workspace_key", "cpu", "memory_mb")
_PRESET_FIELDS = {"name", "description", "base", "input_schema", "session", "binding"}


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
