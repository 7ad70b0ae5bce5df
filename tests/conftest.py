"""Shared fixtures. Coroutines run through ``asyncio.run`` (no pytest-asyncio: pytest-jupyter
brings its own loop for the server tests)."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox import sandboxes

# server_support is a plugin: its fixtures (``provider``) reach every test module without an import
pytest_plugins = ["pytest_jupyter.jupyter_server", "server_support"]

_POLICY_ENV = (
    "TAI_MCP_SANDBOX",
    "TAI_MCP_SANDBOX_ISOLATION",
    "TAI_MCP_SANDBOX_EGRESS",
    "TAI_MCP_SANDBOX_DURABLE",
    "TAI_MCP_SANDBOX_SCRUB_TRANSCRIPT",
    "TAI_MCP_SANDBOX_CREDENTIALS",
    "SANDBOX_LOCAL_ROOT",
)


@pytest.fixture(autouse=True)
def clean_sandbox_slot(monkeypatch):
    """Every test starts with no provider installed and no policy environment."""
    for name in _POLICY_ENV:
        monkeypatch.delenv(name, raising=False)
    sandboxes.unregister_sandbox()
    yield
    sandboxes.unregister_sandbox()
