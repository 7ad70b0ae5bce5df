"""Python cross-references under nitpicky mode: every one must name a real object.

The API reference documents the package root's names, the contract and the client; their signatures and
docstrings also name private modules' classes (``jupyter_tai_sandbox.contract.spec.SessionSpec``, the
module a class is defined in), the standard library and third-party types. A ``py:`` reference that Sphinx
cannot resolve is looked up here:

- a name documented on the site under another path (the same object re-exported) links there;
- a name that imports (from the reference's own module and class context too) is real but not documented
  here: it is shown as code, no link, no warning;
- anything else is left to Sphinx, which warns (an error under ``-W -n``): a dangling name fails the build.
"""

from __future__ import annotations

import builtins
import importlib
import sys
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.nodes import make_refnode


def lookup(dotted: str) -> Any:
    """The object a dotted name stands for, importing modules as needed; raises LookupError."""
    if not dotted:
        raise LookupError(dotted)
    parts = dotted.split(".")
    if len(parts) == 1 and hasattr(builtins, dotted):
        return getattr(builtins, dotted)
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    raise LookupError(dotted)


def _candidates(node: pending_xref) -> list[str]:
    # a subscripted annotation split at its commas ("typing.Literal['none'"): the name before the bracket
    target = node["reftarget"].lstrip(".~").split("[")[0].strip()
    if target.startswith("t."):  # traitlets' and others' `import typing as t`
        target = "typing." + target[2:]
    module = node.get("py:module") or ""
    cls = node.get("py:class") or ""
    out = [target]
    if cls:
        out.append(f"{module}.{cls}.{target}" if module else f"{cls}.{target}")
    if module:
        out.append(f"{module}.{target}")
        parts = module.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            out.append(".".join([*parts[:cut], target]))
    out += [f"typing.{target}", f"collections.abc.{target}"]
    # a bare name of the package's, defined in a module the reference's own does not import
    if "." not in target:
        out += [
            f"{name}.{target}"
            for name, module in sorted(sys.modules.items())
            if name.startswith("jupyter_tai_sandbox") and module is not None and target in vars(module)
        ]
    return out


def _documented(env: BuildEnvironment) -> dict[int, tuple[str, str, str]]:
    """id(object) -> (docname, node id, objtype) of every Python object the site documents."""
    cache = getattr(env, "_tai_documented", None)
    if cache is not None:
        return cache
    cache = {}
    for name, entry in env.domains.python_domain.objects.items():
        try:
            obj = lookup(name)
        except LookupError:
            continue
        cache.setdefault(id(obj), (entry.docname, entry.node_id, entry.objtype))
    env._tai_documented = cache  # type: ignore[attr-defined]
    return cache


def missing_reference(app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element) -> Any:
    if node.get("refdomain") != "py":
        return None
    for candidate in _candidates(node):
        try:
            obj = lookup(candidate)
        except LookupError:
            continue
        where = _documented(env).get(id(obj))
        if where is not None:
            docname, node_id, _objtype = where
            return make_refnode(app.builder, node["refdoc"], docname, node_id, contnode, candidate)
        return contnode  # real, not documented here: plain code
    return None


def _forget(app: Sphinx, env: BuildEnvironment, *args: Any) -> None:
    if hasattr(env, "_tai_documented"):
        del env._tai_documented


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", missing_reference)
    app.connect("env-updated", _forget)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
