"""The local provider through the conformance suite's pytest face: one test per check.

After every check the provider's root holds no session and no ephemeral workspace (this was a
separate whole-suite run, tests/test_local_conformance.py, that ran every check a second time).
"""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.testing import SandboxConformance

pytestmark = [pytest.mark.slow(46)]


class TestLocalConformance(SandboxConformance):
    def make_sandbox(self, tmp_path):
        return LocalSandbox(root=str(tmp_path))

    @pytest.fixture(autouse=True)
    def nothing_is_left_in_the_root(self, tmp_path):
        yield
        assert asyncio.run(LocalSandbox(root=str(tmp_path)).list()) == []
        ephemeral = tmp_path / ".ephemeral"
        assert not ephemeral.exists() or sorted(p.name for p in ephemeral.iterdir()) == []
