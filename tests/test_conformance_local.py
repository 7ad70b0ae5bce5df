"""The local provider through the conformance suite's pytest face: one test per check."""

from __future__ import annotations

from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.testing import SandboxConformance


class TestLocalConformance(SandboxConformance):
    def make_sandbox(self, tmp_path):
        return LocalSandbox(root=str(tmp_path))
