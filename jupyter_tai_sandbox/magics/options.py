"""The options of ``%%sandbox`` / ``%sandbox``, declared once, and what turns them into requests.

``session_options`` bundles the options that apply when a session starts (the
way IPython's ``script.py`` bundles ``%%script``'s shared options in
``script_args``): the cell magic wears it as a decorator, ``%sandbox new``
adds the same ``argument`` objects to its own parser with
``add_session_options``. ``parse`` parses a magic's words and, for an unknown
option, suggests the closest known one (``--netwrok`` -> ``--network``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import posixpath
import shlex
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser, argument, argument_group

from ..contract import SessionSpec
from ..contract.durations import duration_type, format_duration
from ..suggest import closest

F = TypeVar("F", bound=Callable[..., Any])

#: where --in values and long cell bodies are written in the workspace
HANDOFF_DIR = ".sandbox"
DEFAULT_TIMEOUT = 3600.0
#: sessions the magics start live this long unless --ttl says otherwise (a reaped one is restarted)
DEFAULT_TTL = 8 * 3600.0
#: the options that shape a session (compared when a named session is reused)
SPEC_OPTIONS = ("image", "persistent", "network", "cpu", "memory", "ttl")

_C_INTERPRETERS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "python", "pypy")
_INLINE_MAX = 64 << 10


class SandboxMagicError(Exception):
    """A failure shown as one line in the cell (the kernel carries on)."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31msandbox:\x1b[0m {self}"]


# ------------------------------------------------------------------ value parsers


def memory_mb(text: str) -> int:
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    if value.endswith("g"):
        value, scale = value[:-1], 1024
    elif value.endswith("m"):
        value = value[:-1]
    try:
        mb = int(float(value) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--memory takes MiB (512) or a size like 512m or 1g, not {text!r}"
        ) from None
    if mb <= 0:
        raise argparse.ArgumentTypeError("--memory must be positive")
    return mb


def cpus(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpu takes a number of CPUs, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("--cpu must be positive")
    return value


# ------------------------------------------------------------------ the shared options

#: the session options, declared once: the cell magic and ``%sandbox new`` both take them
SESSION_ARGUMENTS: tuple[argument, ...] = (
    argument("--image", help="the session's image (docker provider)"),
    argument("--persistent", metavar="KEY", help="a persistent workspace named KEY, kept after the session"),
    argument("--network", choices=["egress", "internal", "none"], help="the session's network"),
    argument("--cpu", type=cpus, help="CPU cap, in CPUs"),
    argument("--memory", type=memory_mb, help="memory cap: MiB, or 512m / 1g"),
    argument(
        "--ttl",
        type=duration_type("--ttl"),
        help=f"session lifetime: seconds or 5s, 10m, 1h, 1h30m (default {format_duration(DEFAULT_TTL)})",
    ),
    argument(
        "--timeout",
        type=duration_type("--timeout"),
        help=f"command deadline: seconds or 5s, 10m, 1h (default {format_duration(DEFAULT_TIMEOUT)}; with "
        "`%%sandbox new`, the session's default)",
    ),
)
_GROUP = "session options (apply when a session starts)"


def session_options(func: F) -> F:
    """Add the session options to a magic (place it innermost, right above the ``def``)."""
    for arg in reversed(SESSION_ARGUMENTS):
        func = arg(func)
    return argument_group(_GROUP)(func)


def add_session_options(parser: argparse.ArgumentParser) -> None:
    """The same options on a line magic's own parser (``%sandbox new``)."""
    group = parser.add_argument_group(_GROUP)
    for arg in SESSION_ARGUMENTS:
        arg.add_to_parser(parser, group)


def subparser(prog: str, *positionals: tuple[str, dict[str, Any]]) -> MagicArgumentParser:
    parser = MagicArgumentParser(prog=f"%sandbox {prog}")
    for name, options in positionals:
        parser.add_argument(name, **options)
    return parser


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({o for action in parser._actions for o in action.option_strings if o.startswith("--")})


def closest_option(parser: argparse.ArgumentParser, word: str) -> str | None:
    """The known long option nearest to a mistyped one (``--netwrok`` -> ``--network``), if any is close."""
    name = word.split("=", 1)[0]
    if not name.startswith("-"):
        return None
    name = "--" + name.lstrip("-")
    return closest(name, _option_strings(parser))


def parse(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(words)``, naming the closest known option for each unknown one."""
    args, extra = parser.parse_known_args(list(words))
    if extra:
        message = f"unrecognized arguments: {' '.join(extra)}"
        hints = [f"{w.split('=', 1)[0]} -> {s}" for w in extra if (s := closest_option(parser, w))]
        if len(hints) == 1:
            message += f" (did you mean {hints[0].split(' -> ')[1]}?)"
        elif hints:
            message += f" (did you mean: {', '.join(hints)}?)"
        raise UsageError(message)
    return args


def split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as e:
        raise SandboxMagicError(f"cannot parse {line!r}: {e}") from None


# ------------------------------------------------------------------ options -> requests


def spec_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options given that shape a session, by name (not ``timeout``: a cell's deadline picks no session)."""
    return {name: getattr(args, name) for name in SPEC_OPTIONS if getattr(args, name, None) is not None}


def spec_only(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in SPEC_OPTIONS}


def options_differ(started: dict[str, Any], given: dict[str, Any]) -> bool:
    return spec_only(started) != spec_only(given)


def options_label(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(options.items()))


def spec_body(options: dict[str, Any]) -> dict[str, Any]:
    """The POST /sessions body for magic options, validated here first (a bad spec creates nothing)."""
    options = spec_only(options)
    body: dict[str, Any] = {"ttl_seconds": options.get("ttl", DEFAULT_TTL)}
    if "image" in options:
        body["image"] = options["image"]
    if "persistent" in options:
        body.update(durability="persistent", workspace_key=options["persistent"])
    if "network" in options:
        body["network"] = options["network"]
    if "cpu" in options:
        body["cpu"] = options["cpu"]
    if "memory" in options:
        body["memory_mb"] = options["memory"]
    SessionSpec(**body)  # raises SandboxSpecRejectedError with the contract's message
    return body


def identifier(name: str, option: str) -> str:
    if not name.isidentifier():
        raise SandboxMagicError(f"{option} takes a Python variable name, not {name!r}")
    return name


def env_pairs(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise SandboxMagicError(f"--env takes NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


def serialise(name: str, value: Any) -> tuple[str, bytes]:
    """(file extension, bytes) of a value handed to the session: JSON when it is JSON, else a pickle."""
    try:
        return "json", json.dumps(value, allow_nan=False).encode()
    except (TypeError, ValueError):
        pass
    try:
        return "pkl", pickle.dumps(value)
    except Exception as e:
        raise SandboxMagicError(f"--in {name}: the value is neither JSON nor picklable ({e})") from None


def command(interpreter: list[str], body: str, script_path: str) -> tuple[list[str], bool]:
    """The command for a cell, and whether the body must be uploaded to ``script_path`` first."""
    base = posixpath.basename(interpreter[0])
    if len(body.encode()) <= _INLINE_MAX and any(
        base == name or (name in ("python", "pypy") and base.startswith(name)) for name in _C_INTERPRETERS
    ):
        return [*interpreter, "-c", body], False
    return [*interpreter, script_path], True


def workspace_path(path: str, workspace: str, session_name: str) -> str:
    """``path`` relative to the workspace; a path leading out of it is refused here, before any request."""
    normal = posixpath.normpath(path)
    if posixpath.isabs(normal):
        root = workspace.rstrip("/")
        if not root or not (normal == root or normal.startswith(root + "/")):
            raise SandboxMagicError(
                f"path {path!r} is outside the workspace of session {session_name!r} ({workspace or '?'}): "
                "give a path relative to it"
            )
        normal = posixpath.relpath(normal, root)
    if normal == ".." or normal.startswith("../"):
        raise SandboxMagicError(f"path {path!r} leads outside the workspace of session {session_name!r}")
    return normal


def describe(info: dict[str, Any]) -> str:
    """One line about a session, from its ``GET /sessions/{id}`` answer."""
    workspace = info.get("durability", "")
    if info.get("workspace_key"):
        workspace += f" workspace {info['workspace_key']!r}"
    return (
        f"{info['id']}  ({info.get('kind')}, isolation {info.get('isolation')}, network {info.get('network')}, "
        f"{workspace}; {info.get('seconds_left', 0):.0f} s left; workspace {info.get('workspace')})"
    )
