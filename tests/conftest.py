"""Shared fixtures. Coroutines run through ``asyncio.run`` (no pytest-asyncio: pytest-jupyter
brings its own loop for the server tests)."""

from __future__ import annotations

import os
import secrets

import pytest

from jupyter_tai_sandbox import sandboxes

# The run's own deployment scope (DockerSandbox.deployment), inherited by every server it starts:
# the suite never sees, reaps or touches sessions of anyone else on a shared engine.
os.environ["TAI_SANDBOX_DEPLOYMENT"] = f"pytest-{secrets.token_hex(6)}"

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


@pytest.fixture(scope="session", autouse=True)
def foreign_deployment():
    """Another deployment's sessions, workspace and network, planted past their TTL before the
    run: every test, reaper and server of ours must leave them exactly as they are."""
    import docker_support

    planted = docker_support.plant_foreign_sessions()
    yield planted
    if planted is None:
        return
    try:
        gone = docker_support.foreign_survivors(planted)
    finally:
        docker_support.remove_foreign_sessions()
    assert gone == [], f"the test run touched another deployment's things: {gone}"
