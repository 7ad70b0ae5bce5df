"""The conformance suite's pytest face, for provider authors: each check is its own test.

Subclass :class:`SandboxConformance` in a test module (a class named
``Test...``) and tell it how to make your provider; pytest then collects one
test per conformance check (``test_lifecycle``, ``test_pty_ctrl_c``...), and
they run the very check functions :func:`~jupyter_tai_sandbox.conformance.run_sandbox_conformance`
runs. Every test passing is the suite passing; ``run_sandbox_conformance``
stays the one call whose empty return certifies a provider::

    # tests/test_my_provider_conformance.py
    from jupyter_tai_sandbox.testing import SandboxConformance
    from my_provider import MySandbox

    class TestMySandbox(SandboxConformance):
        image = "my/image:1"          # optional: the session image to ask for

        def make_sandbox(self, tmp_path):
            return MySandbox(root=str(tmp_path))

``make_sandbox`` is called inside each test's event loop and the provider it
returns is closed in that loop after the check. To hand the suite a provider
you set up (and close) yourself, override the ``sandbox`` fixture in your
subclass instead. Coroutines run through :func:`asyncio.run`: no async pytest
plugin is needed. Mark or skip one check the usual way, by overriding its test
method in your subclass.

This module imports pytest; the rest of the package does not.
"""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import pytest

from .conformance import check_doc, check_names, run_checks, weakenings
from .contract import Sandbox

__all__ = ["ConformanceWeakenedWarning", "SandboxConformance"]


class ConformanceWeakenedWarning(UserWarning):
    """The class runs the checks weaker than a certification does (smaller payloads, stretched deadlines)."""


class SandboxConformance:
    """Base class of a provider's conformance tests: one test method per check."""

    #: The session image the checks ask for (None: the provider's default).
    image: str | None = None
    #: Stretches every deadline and wait of the checks, for a slow provider.
    timeout_scale: float = 1.0
    #: Further options of the suite (``check_timeout``, ``big_stdin_bytes``, ``big_output_bytes``).
    conformance_options: dict[str, Any] = {}

    def make_sandbox(self, tmp_path: Path) -> Sandbox:
        """A fresh provider for one check (called in the check's event loop; the suite closes it)."""
        raise NotImplementedError(
            f"{type(self).__name__}: implement make_sandbox(self, tmp_path), or override the sandbox fixture"
        )

    @pytest.fixture
    def sandbox(self) -> Sandbox | None:
        """The provider under test, when you make and close it yourself; None: make_sandbox makes one."""
        return None

    def run_conformance_check(self, name: str, sandbox: Sandbox | None, tmp_path: Path) -> None:
        """Run the conformance check ``name``; fail the test with what it saw."""
        reasons = weakenings(timeout_scale=self.timeout_scale, **self.conformance_options)
        if reasons:
            warnings.warn(ConformanceWeakenedWarning("; ".join(reasons)), stacklevel=2)

        async def check() -> list[str]:
            provider = self.make_sandbox(tmp_path) if sandbox is None else sandbox
            try:
                return await run_checks(
                    provider,
                    [name],
                    image=self.image,
                    timeout_scale=self.timeout_scale,
                    **self.conformance_options,
                )
            finally:
                if sandbox is None:
                    await provider.close()

        failures = asyncio.run(check())
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)


def _conformance_test(name: str) -> Any:
    def test(self: SandboxConformance, sandbox: Sandbox | None, tmp_path: Path) -> None:
        self.run_conformance_check(name, sandbox, tmp_path)

    test.__name__ = test.__qualname__ = f"test_{name}"
    test.__doc__ = check_doc(name)
    return test


for _name in check_names():
    setattr(SandboxConformance, f"test_{_name}", _conformance_test(_name))
del _name
