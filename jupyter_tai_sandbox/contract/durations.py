"""Durations a person types (a TTL, a deadline): ``90``, ``5s``, ``10m``, ``1h``, ``1h30m``, ``1.5d``.

One parser for every place a person types one (the magics' ``--ttl``/``--timeout`` and
``%sandbox extend``, the CLI's ``--ttl``); REST, MCP and the Python API stay numbers of seconds.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from .errors import SandboxRequestError

#: seconds per unit, largest first (the order the parts of a duration are written in)
UNITS: dict[str, int] = {"d": 86400, "h": 3600, "m": 60, "s": 1}
#: what a duration may look like, for error messages and help texts
DURATION_FORMS = (
    "seconds (90, 1.5), or numbers with units d, h, m, s, largest first (5s, 10m, 1h, 1h30m, 1.5d)"
)

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})\s*([dhms])")
_WHOLE = re.compile(rf"\s*(?:{_NUMBER}\s*[dhms]\s*)+")


def parse_duration(
    text: str | float | int, what: str = "the duration", *, field: str | None = None, allow_zero: bool = False
) -> float:
    """Seconds from a duration a person typed; a bare number is seconds.

    Raises :class:`SandboxRequestError` (its message starts ``"{what}: "``) naming the value and the
    accepted forms for anything else, for a unit given twice or out of order (``30m1h``), for a negative
    or infinite value and for zero (unless ``allow_zero``).
    """
    if isinstance(text, bool):
        raise _not_a_duration(text, what, field)
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        word = str(text).strip().lower()
        if re.fullmatch(rf"[-+]?{_NUMBER}", word):  # a sign: refused below as not more than 0, when it is
            seconds = float(word)
        elif _WHOLE.fullmatch(word):
            seconds, previous = 0.0, -1
            for number, unit in _PART.findall(word):
                order = list(UNITS).index(unit)
                if order <= previous:
                    raise SandboxRequestError(
                        f"{what}: {text!r} gives its units out of order or twice: write each once, largest "
                        "first (1h30m, 2d12h)",
                        field=field,
                    )
                previous = order
                seconds += float(number) * UNITS[unit]
        else:
            raise _not_a_duration(text, what, field)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise SandboxRequestError(f"{what}: {_shown(text)} is not a duration of {least} seconds", field=field)
    return seconds


def duration_type(what: str) -> Callable[[str], float]:
    """An argparse ``type`` for a duration option (the CLI's, the magics'): :func:`parse_duration`, its
    refusal shown the argparse way (``argument --ttl: '5x' is not a duration: give ...``)."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, what)
        except SandboxRequestError as e:  # argparse says "argument --ttl: " itself
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{what}: ")) from None

    parse.__name__ = "duration"  # argparse names the type in its fallback message
    return parse


def format_duration(seconds: float) -> str:
    """``28800`` -> ``8h``, ``5400`` -> ``1h30m``, ``2.5`` -> ``2.5s``: the shortest form parse_duration reads back."""
    if seconds <= 0 or seconds != int(seconds):
        return f"{seconds:g}s"
    left, parts = int(seconds), []
    for unit, size in UNITS.items():
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _shown(text: object) -> str:
    """``text`` as a refusal quotes it: its repr, cut to 40 characters (a refusal never echoes a flood)."""
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _not_a_duration(text: object, what: str, field: str | None) -> SandboxRequestError:
    return SandboxRequestError(
        f"{what}: {_shown(text)} is not a duration: give {DURATION_FORMS}", field=field
    )
