"""The Python package and the panel carry one version: `_version.py` (hatch's version source, the wheel's) and
`labextension/package.json` (the panel's, which JupyterLab shows) must agree, so a release bumps both."""

from __future__ import annotations

import json
import re

from jupyter_tai_sandbox import __version__
from tests.support import REPO


def test_the_python_package_and_the_panel_have_the_same_version():
    panel = json.loads((REPO / "labextension" / "package.json").read_text())["version"]
    source = (REPO / "jupyter_tai_sandbox" / "_version.py").read_text()
    declared = re.search(r'^__version__ = "([^"]+)"$', source, re.M)
    assert declared, source
    assert declared.group(1) == __version__ == panel, (
        f"jupyter_tai_sandbox/_version.py says {declared.group(1)}, labextension/package.json says {panel}: "
        "set both to the release's version"
    )


def test_hatch_reads_the_version_from_version_py():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^\[tool\.hatch\.version\]\npath = "jupyter_tai_sandbox/_version.py"$', pyproject, re.M)
    assert 'dynamic = ["version"]' in pyproject
