"""`jupyter tai-sandbox serve` needs the `hub` extra, and says so in one line when it is missing.

The CLI runs in a real subprocess whose Python cannot import jupyterhub: a sitecustomize on its PYTHONPATH
puts a finder first on ``sys.meta_path`` that answers every ``jupyterhub`` import as a missing module would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from jupyter_tai_sandbox.cli import HUB_MISSING
from tests.support import REPO

NO_JUPYTERHUB = '''
import sys

class NoJupyterHub:
    """As if jupyterhub were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "jupyterhub" or name.startswith("jupyterhub."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoJupyterHub())
'''


def _jupyter() -> str:
    found = Path(sys.executable).parent / "jupyter"
    assert found.is_file(), f"no jupyter command beside {sys.executable}"
    return str(found)


def test_serve_without_jupyterhub_says_to_install_the_hub_extra_in_one_line(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_JUPYTERHUB)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    blocked = subprocess.run(
        [sys.executable, "-c", "import jupyterhub"], env=env, capture_output=True, text=True
    )
    assert "ModuleNotFoundError" in blocked.stderr, blocked  # the shim works: jupyterhub cannot be imported

    done = subprocess.run(
        [_jupyter(), "tai-sandbox", "serve", "--SandboxApp.provider=local"],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [HUB_MISSING], done.stderr
    assert 'pip install "jupyter-tai-sandbox[hub]"' in HUB_MISSING
    assert done.stdout == ""


def test_the_hub_extra_holds_jupyterhub_and_the_test_extra_uses_it():
    pyproject = (REPO / "pyproject.toml").read_text()
    extras = pyproject[pyproject.index("[project.optional-dependencies]\n") :]
    extras = extras[: extras.index("\n[")]
    assert re.search(r'^hub = \["jupyterhub>=6\.1,<7"\]$', extras, re.M), extras
    test_extra = extras[extras.index("\ntest = [") :]
    assert re.search(
        r'^    "jupyter-tai-sandbox\[[a-z,]*\bhub\b[a-z,]*\]",$', test_extra[: test_extra.index("\n]")], re.M
    )
