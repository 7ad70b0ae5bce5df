"""The tools package's layout: one idea a module, each small, and the old module's names still at the top."""

import ast
import importlib
from pathlib import Path

import pytest

from jupyter_tai_sandbox import tools

PACKAGE = Path(tools.__file__).parent
MAX_LINES = 600

#: module -> the names it defines (the seams the package is cut along)
MODULES = {
    "fence": {"Principal", "Operator", "Decided", "OPERATOR_CLI", "OPERATOR_CONFIG", "fence"},
    "base_tools": {"BaseTool", "SandboxExecTool", "SandboxStatusTool", "BASE_TOOLS", "_workspace_lease"},
    "binding": {
        "check_binding",
        "binding_problems",
        "preset_invalid",
        "_bind_list",
        "_bind_value",
        "validate_input",
        "_field_of",
    },
    "presets": {"Preset", "parse_preset", "NAME_PATTERN", "SESSION_FIELDS"},
    "store": {"PresetStore", "default_store_path", "STORE_VERSION"},
    "registry": {"ToolRegistry"},
}

#: every public name the single-module jupyter_tai_sandbox.tools had (its own, and the project's it re-exported)
PUBLIC = {
    "ADMIN_RESOURCE",
    "BASE_TOOLS",
    "NAME_PATTERN",
    "OPERATOR_CLI",
    "OPERATOR_CONFIG",
    "SESSION_FIELDS",
    "STORE_VERSION",
    "BaseTool",
    "Decided",
    "ExecRequest",
    "Operator",
    "Preset",
    "PresetConflictError",
    "PresetInvalidError",
    "PresetStore",
    "PresetStoreError",
    "Principal",
    "SandboxError",
    "SandboxExecTool",
    "SandboxNotFoundError",
    "SandboxSpecRejectedError",
    "SandboxStatusTool",
    "SessionSpec",
    "ToolAccessDeniedError",
    "ToolInputError",
    "ToolRegistry",
    "check_binding",
    "default_store_path",
    "fence",
    "parse_preset",
    "validate_input",
}


def test_the_package_has_exactly_its_modules():
    assert {p.stem for p in PACKAGE.glob("*.py")} == {"__init__", *MODULES}


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_each_module_is_small_and_documented(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"{path.name}: one idea a module, {MAX_LINES} lines at most"
    assert ast.get_docstring(ast.parse(text)), f"{path.name} has no module docstring"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_name_lives_in_its_module(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    own = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    own |= {
        t.id
        for n in tree.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Name)
    }
    assert MODULES[module] <= own, MODULES[module] - own


def test_every_old_public_name_is_re_exported():
    assert set(tools.__all__) == PUBLIC
    for name in PUBLIC:
        assert hasattr(tools, name), name
    # the same objects, not copies: a check against one is a check against the other
    assert (
        tools.PresetInvalidError is importlib.import_module("jupyter_tai_sandbox.errors").PresetInvalidError
    )
    assert (
        tools.SandboxSpecRejectedError
        is importlib.import_module("jupyter_tai_sandbox.contract").SandboxSpecRejectedError
    )
    assert tools.ADMIN_RESOURCE == importlib.import_module("jupyter_tai_sandbox.sessions").ADMIN_RESOURCE
    assert tools.BASE_TOOLS is importlib.import_module("jupyter_tai_sandbox.tools.base_tools").BASE_TOOLS


def test_the_package_face_defines_nothing():
    """__init__.py only hands names on: the code lives in the modules."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    defs = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    assert not defs


def _imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from .x import ...``, type-only imports included)."""
    graph = {}
    for module in MODULES:
        graph[module] = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module, f"{module}.py imports from the package face"
                graph[module].add(node.module)
    return graph


def test_the_modules_import_each_other_without_a_circle():
    graph, done = _imports(), []
    while graph:
        ready = sorted(m for m, deps in graph.items() if deps <= set(done))
        assert ready, f"an import circle among {sorted(graph)}"
        done += ready
        for m in ready:
            del graph[m]
    assert done.index("presets") > done.index("base_tools")  # a preset knows its base tool, not the reverse
