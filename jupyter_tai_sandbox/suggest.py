""" "Did you mean ...?": the one helper for a mistyped name (a provider, a magic's option or subcommand)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice nearest to ``word`` (compared without case), or None when none is close."""
    options = {choice.lower(): choice for choice in choices}
    found = difflib.get_close_matches(word.strip().lower(), list(options), n=1, cutoff=cutoff)
    return options[found[0]] if found else None


def did_you_mean(word: str, choices: Iterable[str], quote: str = "'") -> str:
    """``"did you mean 'docker'? "`` for the closest choice, or ``""`` when none is close."""
    found = closest(word, choices)
    return f"did you mean {quote}{found}{quote}? " if found else ""
