"""The Python API reference: autodoc of the package root's public names, the contract and the client.

``.. tai-api::`` (in reference/api.rst) writes the autodoc directives from the code at build time: the root
module, a table of every name in ``jupyter_tai_sandbox.__all__`` with where it is documented, the names only
the root exports (the policy, the providers, the chokepoint functions), then ``jupyter_tai_sandbox.contract``
and ``jupyter_tai_sandbox.client`` with their ``__all__``. Traits are left out of class members: the
configuration reference has them, with their help and defaults.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles
from traitlets import TraitType

SUBMODULES = ("contract", "client")


def _where(name: str) -> str:
    import importlib

    for sub in SUBMODULES:
        module = importlib.import_module(f"jupyter_tai_sandbox.{sub}")
        if name in getattr(module, "__all__", ()):
            return f"jupyter_tai_sandbox.{sub}.{name}"
    return f"jupyter_tai_sandbox.{name}"


def api_lines() -> list[str]:
    import importlib

    import jupyter_tai_sandbox

    public = [n for n in jupyter_tai_sandbox.__all__ if not n.startswith("_")]
    lines = [
        "The package root",
        "----------------",
        "",
        ".. automodule:: jupyter_tai_sandbox",
        "",
        "Every public name of the root (``jupyter_tai_sandbox.__all__``) and where it is documented:",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - name",
        "     - documented as",
    ]
    for name in public:
        lines += [f"   * - ``{name}``", f"     - :py:obj:`{_where(name)}`"]
    lines += [""]
    for name in public:
        if _where(name) != f"jupyter_tai_sandbox.{name}":
            continue
        obj = getattr(jupyter_tai_sandbox, name)
        if isinstance(obj, type):
            lines += [f".. autoclass:: jupyter_tai_sandbox.{name}"]
            if not name.endswith("Sandbox"):
                lines += ["   :members:"]
            else:
                lines += ["", "   Its settings are in :ref:`configuration-reference`."]
        else:
            lines += [f".. autofunction:: jupyter_tai_sandbox.{name}"]
        lines += [""]
    for sub in SUBMODULES:
        module = importlib.import_module(f"jupyter_tai_sandbox.{sub}")
        title = f"``jupyter_tai_sandbox.{sub}``"
        lines += [
            title,
            "-" * len(title),
            "",
            f".. automodule:: jupyter_tai_sandbox.{sub}",
            "   :members:",
            "",
        ]
        del module
    return lines


class ApiDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(api_lines(), source="<tai-api>"), container)
        return container.children


def skip_traits(app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any) -> bool | None:
    if isinstance(obj, TraitType):
        return True
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("tai-api", ApiDirective)
    app.connect("autodoc-skip-member", skip_traits)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
