"""The configuration and environment-variable references, generated from the code at build time.

``{tai-configuration}`` renders every configurable trait of the classes the server configures (found as
tests/contract/test_setting_names.py finds them: ``jupyter_tai_sandbox.app._provider_classes()`` plus
SandboxApp and SandboxProvisioner) with its help, type, default and environment variable, one entry per
``Class.trait``. Each entry is a ``confval`` of Sphinx's standard domain whose HTML id is the name itself
(``configuration.html#SandboxPolicy.isolation``), and a ``{ref}`` label of the same name.

``{tai-environment}`` renders every environment variable the package reads (an AST walk of its modules:
``os.environ.get``, ``os.environ[...]``, ``os.getenv``, the policy's ``_env_*`` readers), where it is read
and what it sets; each is an ``envvar`` of the standard domain with the variable's name as its HTML id.

And on every page: inline code, text or a code block that names a setting of one of those classes
(``SandboxPolicy.max_ttl_seconds``, ``--SandboxApp.provider=local``, ``c.DockerSandbox.max_cpu``) is
checked: a name that is neither a setting nor another attribute of its class is a warning (an error under
``-W``); inline code that is exactly a setting, or exactly an environment variable the package reads,
becomes a link to its entry, and so does a setting named in plain text; so does inline code that is exactly an error class of the error table (to its
row in the errors reference).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import re
import socket
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from tai_nodes import first_sentence, literal_text, paragraphs, section, table
from traitlets import Enum, TraitType
from traitlets.traitlets import DefaultHandler

import jupyter_tai_sandbox

logger = logging.getLogger(__name__)

PACKAGE = Path(jupyter_tai_sandbox.__file__).resolve().parent
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")


# ----------------------------------------------------------------- the model


def configurable_classes() -> list[type]:
    """The classes whose traits the server reads from config, as the setting-name test finds them."""
    from jupyter_tai_sandbox.app import SandboxApp, _provider_classes
    from jupyter_tai_sandbox.kernels.provisioner import SandboxProvisioner

    return [SandboxApp, *_provider_classes(), SandboxProvisioner]


def _is_ours(klass: type) -> bool:
    return klass.__module__.split(".")[0] == "jupyter_tai_sandbox"


@dataclass
class Setting:
    cls: type
    name: str
    trait: TraitType[Any, Any]
    defined_by: type
    env: list[str] = field(default_factory=list)
    default: str = ""
    default_method: str = ""  # the @default method's qualname, when there is one

    @property
    def qualname(self) -> str:
        return f"{self.cls.__name__}.{self.name}"

    @property
    def ours(self) -> bool:
        return _is_ours(self.defined_by)

    @property
    def help(self) -> str:
        return (self.trait.help or "").strip()


def _default_handler(cls: type, name: str) -> DefaultHandler | None:
    for klass in cls.__mro__:
        for value in vars(klass).values():
            if isinstance(value, DefaultHandler) and value.trait_name == name:
                return value
    return None


def _strings_read(func: Any) -> list[str]:
    """Environment variable names a function reads (string constants, or module constants, given to an
    environ/getenv/_env_* call)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return []
    module_globals = getattr(func, "__globals__", {})
    found: list[str] = []
    for node in ast.walk(tree):
        for arg in _env_args(node):
            value = _constant(arg, module_globals)
            if value and ENV_NAME.match(value) and value not in found:
                found.append(value)
    return found


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return f"{_call_name(func.value)}.{func.attr}"
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _env_args(node: ast.AST) -> Iterator[ast.expr]:
    """The variable-name argument of an environment read: environ.get(X), environ[X], getenv(X), _env_*(X)."""
    if isinstance(node, ast.Call) and node.args:
        name = _call_name(node.func)
        if name.endswith(("environ.get", "getenv", "environ.pop")) or name.split(".")[-1].startswith("_env_"):
            yield node.args[0]
    elif isinstance(node, ast.Subscript) and _call_name(node.value).endswith("environ"):
        yield node.slice


def _constant(node: ast.expr, module_globals: dict[str, Any]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and isinstance(module_globals.get(node.id), str):
        return module_globals[node.id]
    return None


def _machine_specific(text: str) -> bool:
    home = os.path.expanduser("~")
    marks = [socket.gethostname()]
    with contextlib.suppress(Exception):
        import getpass

        marks.append(getpass.getuser())
    return (home not in ("", "/") and home in text) or any(m and len(m) > 2 and m in text for m in marks)


def _return_expression(func: Any) -> str:
    """The expression a @default method returns (its last return), as source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return "computed at start-up"
    returns = [n for n in ast.walk(tree) if isinstance(n, ast.Return) and n.value is not None]
    return ast.unparse(returns[-1].value) if returns else "computed at start-up"


def _dynamic_default(cls: type, name: str, handler: DefaultHandler, env: list[str]) -> str:
    """A dynamic default as the server computes it with none of its environment variables set; the
    expression instead when the value depends on this machine (a home folder, a user, a host name)."""
    saved = {k: os.environ.pop(k) for k in env if k in os.environ}
    try:
        instance = cls.__new__(cls)
        value = handler.func(instance)
        shown = repr(value)
    except Exception:
        shown = ""
    finally:
        os.environ.update(saved)
    if not shown or _machine_specific(shown):
        return _return_expression(handler.func)
    return shown


def _type_text(trait: TraitType[Any, Any]) -> str:
    kind = type(trait).__name__
    if isinstance(trait, Enum):
        kind += ": one of " + ", ".join(repr(v) for v in trait.values or ())
    if trait.allow_none:
        kind += " or None"
    return kind


@functools.cache
def settings() -> tuple[Setting, ...]:
    out = []
    for cls in configurable_classes():
        for name, trait in sorted(cls.class_traits(config=True).items()):
            defined_by = trait.this_class or cls
            handler = _default_handler(cls, name)
            env = _strings_read(handler.func) if handler and _is_ours(defined_by) else []
            if handler is not None:
                default = (
                    _dynamic_default(cls, name, handler, env)
                    if _is_ours(defined_by)
                    else "computed by Jupyter"
                )
            else:
                default = trait.default_value_repr()
            method = handler.func.__qualname__ if handler is not None else ""
            out.append(Setting(cls, name, trait, defined_by, env, default, method))
    return tuple(out)


@functools.cache
def settings_by_name() -> dict[str, Setting]:
    return {s.qualname: s for s in settings()}


@functools.cache
def class_names() -> dict[str, type]:
    return {cls.__name__: cls for cls in configurable_classes()}


@dataclass
class EnvRead:
    name: str
    module: str
    where: str  # the enclosing class.function, or "" at module level
    settings: list[str]  # the Class.trait settings whose default it is (a shared base's: each class's)
    doc: str  # what the enclosing function (or module) says it does


def _module_constants(tree: ast.Module) -> dict[str, str]:
    return {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }


@functools.cache
def _package_constants() -> dict[str, str]:
    """Every module-level string constant of the package by name (one imported elsewhere is found too)."""
    out: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, value in _module_constants(ast.parse(path.read_text(encoding="utf-8"))).items():
            out.setdefault(name, value)
    return out


def _walk_reads(path: Path) -> Iterator[tuple[str, str, str]]:
    """(variable, enclosing qualname, enclosing docstring) for each environment read in a module."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    module_constants = {**_package_constants(), **_module_constants(tree)}

    def visit(node: ast.AST, scope: list[str], doc: str) -> Iterator[tuple[str, str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from visit(child, [*scope, child.name], ast.get_docstring(child) or doc)
                continue
            for arg in _env_args(child):
                value = _constant(arg, module_constants)
                if value and ENV_NAME.match(value):
                    yield value, ".".join(scope), doc
            yield from visit(child, scope, doc)

    yield from visit(tree, [], ast.get_docstring(tree) or "")


@functools.cache
def environment() -> dict[str, list[EnvRead]]:
    """Every environment variable the package reads, in name order, with each place that reads it."""
    by_default = {}
    for s in settings():
        for name in s.env:
            by_default.setdefault(name, []).append(s)
    reads: dict[str, list[EnvRead]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for name, where, doc in _walk_reads(path):
            owners = [s for s in by_default.get(name, []) if s.default_method == where]
            entry = EnvRead(name, module, where, [o.qualname for o in owners], doc)
            places = reads.setdefault(name, [])
            if not any((p.module, p.where) == (module, where) for p in places):
                places.append(entry)
    return dict(sorted(reads.items()))


# --------------------------------------------------------------- rendering


def setting_ref(name: str) -> addnodes.pending_xref:
    ref = addnodes.pending_xref(
        "", refdomain="std", reftype="confval", reftarget=name, refexplicit=True, refwarn=True
    )
    ref += literal_text(name)
    return ref


def envvar_ref(name: str) -> addnodes.pending_xref:
    ref = addnodes.pending_xref(
        "", refdomain="std", reftype="envvar", reftarget=name, refexplicit=True, refwarn=True
    )
    ref += literal_text(name)
    return ref


def _field(name: str, *body: nodes.Node) -> nodes.field:
    f = nodes.field()
    f += nodes.field_name(name, name)
    fb = nodes.field_body()
    para = nodes.paragraph()
    for b in body:
        para += b
    fb += para
    f += fb
    return f


def _register(
    directive: SphinxDirective, objtype: str, name: str, anchor: str, title: str, node: nodes.Node
) -> None:
    std = directive.env.domains.standard_domain
    std.note_object(objtype, name, anchor, location=node)
    if objtype == "confval":
        docname = directive.env.current_document.docname
        std.anonlabels[name.lower()] = (docname, anchor)
        std.labels[name.lower()] = (docname, anchor, title)


def _setting_entry(directive: SphinxDirective, s: Setting) -> list[nodes.Node]:
    anchor = s.qualname
    index = addnodes.index(entries=[("single", f"{s.qualname} (setting)", anchor, "", None)])
    desc = addnodes.desc(
        domain="std",
        objtype="confval",
        desctype="confval",
        classes=["std", "confval", "tai-setting"],
        no_index=False,
    )
    sig = addnodes.desc_signature("", "", ids=[anchor], classes=["sig", "sig-object"])
    sig += addnodes.desc_name(s.qualname, s.qualname)
    desc += sig
    content = addnodes.desc_content()
    fields = nodes.field_list()
    fields += _field("Type", literal_text(_type_text(s.trait)))
    fields += _field("Default", literal_text(s.default))
    if s.env:
        body: list[nodes.Node] = []
        for i, name in enumerate(s.env):
            if i:
                body.append(nodes.Text(", else "))
            body.append(envvar_ref(name))
        body.append(nodes.Text(" (when set, in place of the default; explicit config wins)"))
        fields += _field("Environment", *body)
    if s.defined_by is not s.cls:
        fields += _field("Defined by", literal_text(f"{s.defined_by.__module__}.{s.defined_by.__qualname__}"))
    content += fields
    help_nodes = paragraphs(s.help)
    content += help_nodes or [nodes.paragraph("", "(no help text)")]
    desc += content
    directive.state.document.set_id(sig)
    _register(directive, "confval", s.qualname, anchor, s.qualname, sig)
    return [index, desc]


class ConfigurationDirective(SphinxDirective):
    """Every configurable trait, class by class."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        self.env.note_dependency(str(PACKAGE / "app.py"))
        out: list[nodes.Node] = []
        document = self.state.document
        summary_rows = []
        for cls in configurable_classes():
            own = [s for s in settings() if s.cls is cls]
            summary_rows.append(
                (
                    [_class_ref(cls)],
                    f"`{cls.__module__}`",
                    str(sum(1 for s in own if s.ours)),
                )
            )
        out.append(
            table(["class", "module", "settings"], summary_rows, widths=[2, 4, 1], classes=["tai-summary"])
        )
        for cls in configurable_classes():
            sec = section(cls.__name__, cls.__name__, document)
            sec += paragraphs(cls.__doc__)[:1]
            sec += nodes.paragraph(
                "",
                "",
                nodes.Text("In a config file: "),
                literal_text(f"c.{cls.__name__}.<setting> = <value>"),
                nodes.Text("; on the command line: "),
                literal_text(f"--{cls.__name__}.<setting>=<value>"),
                nodes.Text("."),
            )
            own = [s for s in settings() if s.cls is cls]
            for s in (s for s in own if s.ours):
                sec += _setting_entry(self, s)
            inherited = [s for s in own if not s.ours]
            if inherited:
                sub = section(
                    f"Inherited by {cls.__name__} from Jupyter", f"{cls.__name__}-inherited", document
                )
                sub += nodes.paragraph(
                    "",
                    "These come from jupyter_server's ExtensionApp, jupyter_core's JupyterApp and traitlets' "
                    "Application; their own documentation says more.",
                )
                for s in inherited:
                    sub += _setting_entry(self, s)
                sec += sub
            out.append(sec)
        return out


def _class_ref(cls: type) -> nodes.reference:
    ref = nodes.reference("", "", internal=True, refid=cls.__name__)
    ref += literal_text(cls.__name__)
    return ref


class EnvironmentDirective(SphinxDirective):
    """Every environment variable the package reads, a table row each."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        rows = []
        ids = []
        for name, places in environment().items():
            ids.append(name)
            where: list[nodes.Node] = []
            what = ""
            for i, place in enumerate(places):
                if i:
                    where.append(nodes.Text("; "))
                if place.settings:
                    for j, qualname in enumerate(place.settings):
                        if j:
                            where.append(nodes.Text(", "))
                        where.append(setting_ref(qualname))
                    where.append(nodes.Text(" (the default)"))
                    what = what or first_sentence(settings_by_name()[place.settings[0]].help)
                else:
                    dotted = f"{place.module}.{place.where}" if place.where else place.module
                    where.append(literal_text(dotted))
                    what = what or first_sentence(place.doc)
            rows.append(([literal_text(name)], where, what))
        tab = table(["variable", "read by", "what it is for"], rows, widths=[2, 3, 5], ids=ids)
        std = self.env.domains.standard_domain
        for name in ids:
            std.note_object("envvar", name, name, location=tab)
        index = addnodes.index(entries=[("single", f"{n} (environment variable)", n, "", None) for n in ids])
        return [index, tab]


# ------------------------------------------------------------------ the check


#: Class.attr, alone or after a config file's `c.` (not after another name's dot: module.Class.attr is Python)
SETTING_MENTION = re.compile(r"(?:(?<=\bc\.)|(?<![\w.]))(?P<cls>[A-Z][A-Za-z]+)\.(?P<attr>[A-Za-z_]\w*)")
EXACT_SETTING = re.compile(r"^(?:--|c\.)?(?P<name>[A-Z][A-Za-z]+\.[A-Za-z_]\w*)(?:\s*=.*)?$", re.S)


def unknown_mentions(text: str) -> list[str]:
    """``Class.attr`` mentions in text whose class is a configured one and whose attr it does not have."""
    known = class_names()
    bad = []
    for match in SETTING_MENTION.finditer(text):
        cls = known.get(match["cls"])
        if cls is None:
            continue
        attr = match["attr"]
        if f"{cls.__name__}.{attr}" in settings_by_name() or hasattr(cls, attr):
            continue
        bad.append(f"{cls.__name__}.{attr}")
    return bad


class CheckSettingNames(SphinxTransform):
    """Each page's mentions of ``Class.setting``: unknown ones warn, exact inline ones become links."""

    default_priority = 400

    #: pages that name settings as they were (the changelog's history of renames)
    HISTORY = ("changelog",)

    def apply(self, **kwargs: Any) -> None:
        env_names = set(environment())
        from jupyter_tai_sandbox.errors import ERROR_CLASSES

        error_names = set(ERROR_CLASSES)
        if self.env.current_document.docname in self.HISTORY:
            return
        for node in list(self.document.findall(lambda n: isinstance(n, (nodes.Text, nodes.literal_block)))):
            if isinstance(node, nodes.Text) and isinstance(node.parent, nodes.literal_block):
                continue  # checked as the block
            text = node.astext()
            for name in unknown_mentions(text):
                logger.warning(
                    "%s is no setting (nor attribute) of %s: see the configuration reference",
                    name,
                    name.split(".")[0],
                    location=node if not isinstance(node, nodes.Text) else node.parent,
                    type="tai",
                    subtype="setting",
                )
        for literal in list(self.document.findall(nodes.literal)):
            if literal.next_node(nodes.reference) or _inside_link(literal):
                continue
            text = literal.astext()
            exact = EXACT_SETTING.match(text)
            if exact and exact["name"] in settings_by_name():
                ref = setting_ref(exact["name"])
                ref.children = [literal.deepcopy()]
                literal.replace_self(ref)
            elif text.lstrip("$") in env_names:
                ref = envvar_ref(text.lstrip("$"))
                ref.children = [literal.deepcopy()]
                literal.replace_self(ref)
            elif text in error_names:
                ref = addnodes.pending_xref(
                    "", refdomain="std", reftype="ref", reftarget=f"error-{text.lower()}", refexplicit=True
                )
                ref += literal.deepcopy()
                literal.replace_self(ref)
        for text_node in list(self.document.findall(nodes.Text)):
            if _inside(text_node, SKIP_TEXT) or _inside_link(text_node):
                continue
            _link_mentions(text_node)


#: where a setting named in plain text stays plain: code, titles, a signature
SKIP_TEXT = (nodes.literal, nodes.FixedTextElement, nodes.title, nodes.rubric, nodes.field_name, nodes.raw)


def _inside(node: nodes.Node, kinds: tuple[type, ...]) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, kinds):
            return True
        parent = parent.parent
    return False


def _link_mentions(text_node: nodes.Text) -> None:
    """A setting named in plain text (``... than SandboxPolicy.max_sessions_per_user is 429``) links to its entry."""
    text = str(text_node)
    pieces: list[nodes.Node] = []
    at = 0
    for match in SETTING_MENTION.finditer(text):
        name = f"{match['cls']}.{match['attr']}"
        if name not in settings_by_name():
            continue
        pieces.append(nodes.Text(text[at : match.start()]))
        ref = addnodes.pending_xref(
            "", refdomain="std", reftype="confval", reftarget=name, refexplicit=True, refwarn=True
        )
        ref += nodes.inline(name, name)
        pieces.append(ref)
        at = match.end()
    if pieces and text_node.parent is not None:
        pieces.append(nodes.Text(text[at:]))
        text_node.parent.replace(text_node, pieces)


def _inside_link(node: nodes.Node) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, (nodes.reference, addnodes.pending_xref, addnodes.desc_signature)):
            return True
        parent = parent.parent
    return False


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("tai-configuration", ConfigurationDirective)
    app.add_directive("tai-environment", EnvironmentDirective)
    app.add_transform(CheckSettingNames)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
