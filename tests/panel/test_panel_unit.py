"""The panel's TypeScript unit tests (vitest), run as part of the one test command."""

import os
import shutil
import subprocess

import pytest

from tests.support import REPO

LABEXTENSION = REPO / "labextension"


def test_panel_unit_tests_pass():
    ready = (LABEXTENSION / "node_modules").is_dir() and shutil.which("jlpm")
    if not ready:
        message = "the panel's npm packages are not installed: run `bash .ci/ui-up` (or `cd labextension && jlpm install`)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run(["jlpm", "test"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert " passed" in result.stdout
