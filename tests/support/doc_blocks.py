"""Blocks of the docs pages (and README) found by a label, never by heading text.

A page marks what a test reads with an HTML comment, which MyST and GitHub both render as nothing:

- ``<!-- example: NAME -->`` on the line before a fenced code block: :func:`block` returns the block's
  text (without its fences);
- ``<!-- begin: NAME -->`` ... ``<!-- end: NAME -->`` around a passage: :func:`passage` returns the text
  between them.

Each label is unique in its page; a missing or doubled label fails loudly, naming the page and the label,
so a test never silently reads the wrong text after the page is rewritten.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"

_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)


def page(path: str | Path) -> Path:
    """A docs page by its path under docs/ (``"users/mcp.md"``), or any path (README)."""
    path = Path(path)
    return path if path.is_absolute() else DOCS / path


def _one(text: str, marker: str, where: Path) -> int:
    """Where the single occurrence of ``marker`` ends in ``text``."""
    count = text.count(marker)
    assert count == 1, f"{where}: {marker!r} occurs {count} times (each label once)"
    return text.index(marker) + len(marker)


def block(path: str | Path, name: str) -> str:
    """The fenced code block right after ``<!-- example: NAME -->`` in the page."""
    where = page(path)
    text = where.read_text()
    after = text[_one(text, f"<!-- example: {name} -->", where) :].lstrip("\n")
    match = _FENCE.match(after)
    assert match, f"{where}: no fenced code block right after the label {name!r}"
    return match.group("body")


def block_info(path: str | Path, name: str) -> str:
    """The info string (the language, or a MyST directive) of the labelled block's opening fence."""
    where = page(path)
    text = where.read_text()
    after = text[_one(text, f"<!-- example: {name} -->", where) :].lstrip("\n")
    match = _FENCE.match(after)
    assert match, f"{where}: no fenced code block right after the label {name!r}"
    return match.group("info").strip()


def passage(path: str | Path, name: str) -> str:
    """The text between ``<!-- begin: NAME -->`` and ``<!-- end: NAME -->`` in the page."""
    where = page(path)
    text = where.read_text()
    start = _one(text, f"<!-- begin: {name} -->", where)
    end = text.index(f"<!-- end: {name} -->", start)
    return text[start:end].strip("\n")


def pages() -> list[Path]:
    """Every hand-written Markdown page: README and docs/ (the build's output and generated pages aside)."""
    found = [README, *sorted(DOCS.rglob("*.md"))]
    return [p for p in found if "_build" not in p.parts and p.exists()]


def fenced_blocks(path: str | Path, language: str) -> list[str]:
    """Every fenced block of one language in the page, labelled or not."""
    return [
        m.group("body")
        for m in _FENCE.finditer(page(path).read_text())
        if m.group("info").strip() == language
    ]
