"""Small docutils helpers shared by the reference generators: help text to nodes, tables, sections.

Help strings and docstrings are shown as text, not parsed as reStructuredText (a stray ``*`` or a
trailing ``_`` in a trait's help must not break the build): only ``code`` in single or double backticks
becomes inline code, which the settings check then links when it names a setting.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Sequence

from docutils import nodes

#: ``code``, `code`, or a reStructuredText role (:data:`name`, :class:`~module.Name`) shown as its name
_CODE = re.compile(r"``(.+?)``|(?::[\w:.-]+:)?`([^`]+)`")


def inline(text: str) -> list[nodes.Node]:
    """One line or paragraph of text: backticked spans become inline code, the rest stays text."""
    out: list[nodes.Node] = []
    at = 0
    for match in _CODE.finditer(text):
        if match.start() > at:
            out.append(nodes.Text(text[at : match.start()]))
        code = match.group(1) or match.group(2)
        if match.group(2) and code.startswith("~"):
            code = code.rsplit(".", 1)[-1]
        out.append(nodes.literal(code, code))
        at = match.end()
    if at < len(text):
        out.append(nodes.Text(text[at:]))
    return out


def paragraphs(text: str | None) -> list[nodes.Node]:
    """A help string or docstring as paragraphs (blank lines split them; lines within one are joined)."""
    if not text:
        return []
    body = inspect.cleandoc(text)
    out: list[nodes.Node] = []
    for block in re.split(r"\n\s*\n", body):
        joined = " ".join(line.strip() for line in block.splitlines()).strip()
        if joined:
            out.append(nodes.paragraph("", "", *inline(joined)))
    return out


def first_sentence(text: str | None) -> str:
    """The first sentence of a help string or docstring, on one line."""
    if not text:
        return ""
    flat = " ".join(inspect.cleandoc(text).split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    return match.group(1) if match else flat


def cell(content: str | Iterable[nodes.Node] | nodes.Node) -> nodes.entry:
    entry = nodes.entry()
    if isinstance(content, str):
        entry += nodes.paragraph("", "", *inline(content))
    elif isinstance(content, nodes.Node):
        entry += content if isinstance(content, nodes.Body) else nodes.paragraph("", "", content)
    else:
        para = nodes.paragraph()
        for child in content:
            para += child
        entry += para
    return entry


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str | Iterable[nodes.Node] | nodes.Node]],
    widths: Sequence[int] | None = None,
    ids: Sequence[str] | None = None,
    classes: Sequence[str] = (),
) -> nodes.table:
    """A table; ``ids``, when given, is one HTML id per row (a row's anchor)."""
    tab = nodes.table(classes=["tai-table", *classes])
    group = nodes.tgroup(cols=len(headers))
    tab += group
    for width in widths or [1] * len(headers):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for header in headers:
        row += cell(header)
    head += row
    body = nodes.tbody()
    group += body
    for index, values in enumerate(rows):
        row = nodes.row(ids=[ids[index]] if ids else [])
        for value in values:
            row += cell(value)
        body += row
    return tab


def section(title: str, anchor: str, document: nodes.document) -> nodes.section:
    """A section with a title and an HTML id of our choosing (kept as it is: dots and case too)."""
    sec = nodes.section(ids=[anchor])
    sec += nodes.title(title, "", *inline(title))
    document.set_id(sec)
    return sec


def literal_text(text: str) -> nodes.literal:
    return nodes.literal(text, text)
