"""The errors reference, generated from the one error table (jupyter_tai_sandbox/errors.py) at build time.

``{tai-errors}`` renders every class a JSON error body may name (``ERROR_CLASSES``) with the HTTP status the
table gives it (``STATUS_TABLE``: the first class an error is an instance of), its base class and its
docstring; then the table itself, most specific first. Each class's row has the class name as its HTML id
(``errors.html#SandboxQuotaError``).
"""

from __future__ import annotations

from http.client import responses
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from tai_nodes import first_sentence, inline, literal_text, paragraphs, table


def error_rows() -> list[tuple[type, int]]:
    """(class, status) for each class of ERROR_CLASSES, by status then name."""
    from jupyter_tai_sandbox.errors import ERROR_CLASSES, STATUS_TABLE

    def status(cls: type) -> int:
        for kind, code in STATUS_TABLE:
            if issubclass(cls, kind):
                return code
        return 500

    return sorted(((cls, status(cls)) for cls in ERROR_CLASSES.values()), key=lambda r: (r[1], r[0].__name__))


def _base(cls: type) -> str:
    for base in cls.__mro__[1:]:
        if base.__name__.startswith(("Sandbox", "Output", "Tool", "Preset", "Upload")):
            return base.__name__
    return cls.__mro__[1].__name__


class ErrorsDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from jupyter_tai_sandbox import errors

        self.env.note_dependency(errors.__file__)
        rows = []
        ids = []
        for cls, status in error_rows():
            ids.append(cls.__name__)
            meaning = paragraphs(cls.__doc__) or [nodes.paragraph("", "(no docstring)")]
            entry: list[nodes.Node] = []
            for para in meaning:
                entry.extend(para.children)
                entry.append(nodes.Text(" "))
            rows.append(
                (
                    [literal_text(cls.__name__)],
                    f"{status} {responses.get(status, '')}",
                    [literal_text(_base(cls))] if cls.__mro__[1] is not Exception else "",
                    entry,
                )
            )
        out: list[nodes.Node] = [
            table(["error", "HTTP status", "a kind of", "meaning"], rows, widths=[3, 2, 3, 8], ids=ids)
        ]
        std = self.env.domains.standard_domain
        docname = self.env.current_document.docname
        for name in ids:
            std.anonlabels[f"error-{name.lower()}"] = (docname, name)
            std.labels[f"error-{name.lower()}"] = (docname, name, name)
        out.append(
            nodes.paragraph(
                "",
                "",
                *inline(
                    "The table itself (`STATUS_TABLE`), in the order it is read: the first row an error is an "
                    "instance of gives its status; a subclass not listed takes its base's."
                ),
            )
        )
        out.append(
            table(
                ["class", "status"],
                [([literal_text(kind.__name__)], str(code)) for kind, code in errors.STATUS_TABLE],
                widths=[3, 1],
            )
        )
        out.append(
            nodes.paragraph(
                "",
                "",
                *inline(
                    first_sentence(errors.error_body.__doc__)
                    + " Anything else a door answers is `HTTPError` (the Authorizer's refusals, tornado's "
                    "errors) or `InternalError` (a 500, which is a bug)."
                ),
            )
        )
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("tai-errors", ErrorsDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
