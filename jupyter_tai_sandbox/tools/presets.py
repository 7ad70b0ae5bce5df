"""Presets: a named tool over a base tool, and :func:`parse_preset`, which validates a definition."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from ..contract import SandboxSpecRejectedError, SessionSpec
from .base_tools import BASE_TOOLS
from .binding import preset_invalid

NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
#: Session settings a preset may fix (the consumer is always the tool's label, ``tool:NAME``).
SESSION_FIELDS = ("image", "isolation", "network", "durability", "workspace_key", "cpu", "memory_mb")
_PRESET_FIELDS = {"name", "description", "base", "input_schema", "session", "binding"}
#: Checks a declared input_schema against the JSON Schema meta-schema, every error at once.
_META = Draft202012Validator(
    Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
)


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
    """Validate a preset definition completely, before anything is stored.

    Every problem found is named at once, in one PresetInvalidError (its ``problems``).
    """
    if not isinstance(definition, Mapping):
        raise preset_invalid(
            ["a preset is a JSON object: name, description, base, input_schema, session, binding"]
        )
    problems: list[str] = []
    data = dict(definition)
    if name is not None and data.setdefault("name", name) != name:
        problems.append(f"the preset's name {data['name']!r} differs from {name!r} in the path/key")
    unknown = sorted(set(data) - _PRESET_FIELDS)
    if unknown:
        problems.append(
            f"unknown preset field(s): {', '.join(unknown)}; known: {', '.join(sorted(_PRESET_FIELDS))}"
        )
    preset_name = data.get("name")
    if not isinstance(preset_name, str) or not NAME_PATTERN.match(preset_name):
        problems.append(
            f"invalid preset name {preset_name!r}: 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    description = data.get("description")
    if not isinstance(description, str) or not description.strip():
        problems.append("a preset needs a description: the text a caller (or a model) reads")
    base_name = data.get("base", "sandbox_exec")
    base = BASE_TOOLS.get(base_name) if isinstance(base_name, str) else None
    if base is None:
        problems.append(f"unknown base tool {base_name!r}: known base tools are {', '.join(BASE_TOOLS)}")
    schema = data.get("input_schema")
    problems += _schema_problems(schema)
    session = data.get("session") or {}
    problems += _session_problems(session)
    binding = data.get("binding") or {}
    preset = Preset(
        name=preset_name,  # type: ignore[arg-type]  # checked above; a bad one is only reported
        description=description,  # type: ignore[arg-type]  # as name
        base=base_name,
        input_schema=copy.deepcopy(schema),
        session=dict(session) if isinstance(session, dict) else {},
        binding=copy.deepcopy(binding) if isinstance(binding, dict) else binding,
        source=source,
    )
    if base is not None:
        problems += base.preset_problems(preset)
    if problems:
        raise preset_invalid(problems)
    return preset


def _schema_problems(schema: Any) -> list[str]:
    """What is wrong with a declared input_schema (None: none declared, which the base tool judges)."""
    if schema is None:
        return []
    if not isinstance(schema, dict):
        return ["input_schema must be a JSON Schema object"]
    problems, wrong = [], set()
    try:
        for e in _META.iter_errors(schema):
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            problems.append(f"input_schema is not valid JSON Schema at {where}: {e.message}")
            wrong.add(where)
    except RecursionError:
        return ["input_schema is nested too deeply to check"]
    if schema.get("type") != "object" and "type" not in wrong:
        problems.append('input_schema describes the input object: it needs "type": "object"')
    if not isinstance(schema.get("properties", {}), dict) and "properties" not in wrong:
        problems.append("input_schema.properties must be an object")
    return problems


def _session_problems(session: Any) -> list[str]:
    """What is wrong with the fixed session settings: unknown ones, and what SessionSpec refuses of the rest."""
    if not isinstance(session, dict):
        return [f"session is an object of fixed session settings: {', '.join(SESSION_FIELDS)}"]
    problems = []
    unknown = sorted(set(session) - set(SESSION_FIELDS))
    if unknown:
        problems.append(
            f"unknown session setting(s): {', '.join(unknown)}; a preset may fix {', '.join(SESSION_FIELDS)}"
        )
    settings = {k: v for k, v in session.items() if k in SESSION_FIELDS}
    if settings:
        if settings.get("workspace_key") and "durability" not in settings:
            settings["durability"] = "persistent"
        try:
            SessionSpec(
                **settings, consumer="preset"
            )  # the consumer label is the preset's name, checked apart
        except SandboxSpecRejectedError as e:
            problems.append(f"session: {e}")
    return problems
