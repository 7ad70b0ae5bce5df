"""Every built-in provider is named where a user picks one, and every provider's traits are in --help-all."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.app import SandboxApp
from jupyter_tai_sandbox.errors import SandboxUnavailableError


def test_an_unknown_provider_names_every_built_in_provider():
    with pytest.raises(SandboxUnavailableError) as caught:
        sandboxes.load_provider_class("swram")
    for name in ["off", *sandboxes.BUILTIN_PROVIDERS, "module:Class"]:
        assert name in str(caught.value), (name, str(caught.value))


def test_the_provider_help_names_every_built_in_provider():
    text = SandboxApp.class_traits()["provider"].help
    for name in sandboxes.BUILTIN_PROVIDERS:
        assert f"'{name}'" in text, name


def test_help_all_lists_the_traits_of_every_built_in_provider():
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_tai_sandbox.app", "--help-all"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for cls in ("LocalSandbox", "DockerSandbox", "SwarmSandbox", "RemoteSandbox"):
        assert f"--{cls}." in out, cls


def test_the_no_provider_messages_name_every_built_in_provider():
    sandboxes.disable_sandbox()
    try:
        with pytest.raises(SandboxUnavailableError) as caught:
            sandboxes.require_sandbox()
        message = sandboxes.status_info()["message"]
    finally:
        sandboxes.unregister_sandbox()
    for name in sandboxes.BUILTIN_PROVIDERS:
        assert name in str(caught.value) and name in message, name
