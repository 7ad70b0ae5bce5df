"""The bind kernel: a preset's binding checked at authoring, and the caller's fields bound at run time.

A binding routes the caller's validated fields into ``sandbox_exec``'s input as
argv elements, stdin or environment values -- never spliced into shell text.
:func:`validate_input` is the schema check every run goes through.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from ..errors import PresetInvalidError, ToolInputError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BINDING_FIELDS = {"argv", "script", "args", "stdin", "env", "timeout_seconds"}
_REF_FIELDS = {"field", "spread"}


def preset_invalid(problems: list[str], *, where: str = "") -> PresetInvalidError:
    """One PresetInvalidError naming every problem of a definition (``problems``; also in the JSON body).

    One problem is the message itself; several are counted, one a line. ``where`` prefixes the message.
    """
    if len(problems) == 1:
        message = problems[0]
    else:
        message = f"the preset definition has {len(problems)} problems:\n" + "\n".join(
            f"- {p}" for p in problems
        )
    return PresetInvalidError(where + message, problems=problems)


def _is_ref(value: Any) -> bool:
    return isinstance(value, dict)


def _ref_problems(
    ref: Any, where: str, properties: Mapping[str, Any] | None, *, spread_ok: bool
) -> list[str]:
    """What is wrong with one binding element (``properties`` None: the schema is unusable, names unchecked)."""
    if isinstance(ref, str):
        return []
    if not isinstance(ref, dict) or "field" not in ref or set(ref) - _REF_FIELDS:
        return [
            f"binding.{where}: each element is fixed text or a field reference "
            '{"field": NAME} (+ "spread": true for an array in argv/args)'
        ]
    problems = []
    name = ref["field"]
    if not isinstance(name, str) or (properties is not None and name not in properties):
        declared = ", ".join(sorted(properties or {})) or "none"
        problems.append(
            f"binding.{where} references field {name!r}, which input_schema does not declare "
            f"(declared properties: {declared})"
        )
    if ref.get("spread") and not spread_ok:
        problems.append(f"binding.{where}: spread is only allowed in argv and args")
    if "spread" in ref and not isinstance(ref["spread"], bool):
        problems.append(f"binding.{where}: spread is true or false")
    return problems


def _properties(schema: Any) -> Mapping[str, Any] | None:
    """The declared properties a binding may reference, or None where the schema cannot tell."""
    if not isinstance(schema, Mapping):
        return None
    properties = schema.get("properties") or {}
    return properties if isinstance(properties, Mapping) else None


def binding_problems(binding: Any, schema: Any) -> list[str]:
    """Everything malformed in a binding, and every field it names that the schema does not declare."""
    if not isinstance(binding, Mapping) or not binding:
        return [
            'a preset over sandbox_exec needs a binding, e.g. {"argv": ["wc", "-w"], "stdin": {"field": "text"}}'
        ]
    problems = []
    unknown = sorted(set(binding) - _BINDING_FIELDS)
    if unknown:
        problems.append(
            f"unknown binding field(s): {', '.join(unknown)}; known: {', '.join(sorted(_BINDING_FIELDS))}"
        )
    properties = _properties(schema)
    if ("argv" in binding) == ("script" in binding):
        problems.append("binding needs exactly one of argv (a list) or script (fixed shell text)")
    if "argv" in binding:
        argv = binding["argv"]
        if not isinstance(argv, list) or not argv:
            problems.append("binding.argv is a non-empty list of fixed strings and field references")
            argv = []
        if "args" in binding and "script" not in binding:
            problems.append("binding.args (the script's positional parameters) needs binding.script")
        if argv and not isinstance(argv[0], str):
            problems.append("binding.argv[0], the program, is fixed text, never caller input")
        for i, item in enumerate(argv):
            problems += _ref_problems(item, f"argv[{i}]", properties, spread_ok=True)
    if "script" in binding:
        if not isinstance(binding["script"], str) or not binding["script"].strip():
            problems.append(
                "binding.script is fixed shell text; caller input reaches it only as $1.. (args), stdin or env"
            )
        args = binding.get("args", [])
        if not isinstance(args, list):
            problems.append("binding.args is a list of fixed strings and field references")
            args = []
        for i, item in enumerate(args):
            problems += _ref_problems(item, f"args[{i}]", properties, spread_ok=True)
    if "stdin" in binding:
        problems += _ref_problems(binding["stdin"], "stdin", properties, spread_ok=False)
    env = binding.get("env", {})
    if not isinstance(env, dict):
        problems.append("binding.env maps variable names to fixed strings or field references")
        env = {}
    for name, ref in env.items():
        if not _ENV_NAME.match(name):
            problems.append(f"binding.env: invalid environment variable name {name!r}")
        problems += _ref_problems(ref, f"env.{name}", properties, spread_ok=False)
    if "timeout_seconds" in binding:
        timeout = binding["timeout_seconds"]
        if _is_ref(timeout):
            problems += _ref_problems(timeout, "timeout_seconds", properties, spread_ok=False)
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            problems.append("binding.timeout_seconds is a positive number or a field reference")
    return problems


def check_binding(binding: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Refuse a binding that is malformed or names a field the schema does not declare (all at once)."""
    problems = binding_problems(binding, schema)
    if problems:
        raise preset_invalid(problems)


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
