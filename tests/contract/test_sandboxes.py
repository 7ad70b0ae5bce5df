import asyncio
import subprocess
import sys

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import (
    SandboxError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionSpec,
)
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox


def test_nothing_installed_reads_off_and_require_raises_naming_the_setting():
    assert sandboxes.status() == "off"
    with pytest.raises(SandboxUnavailableError) as raised:
        sandboxes.require_sandbox()
    assert "TAI_MCP_SANDBOX" in str(raised.value) and "sandbox_module" in str(raised.value)
    assert "TAI_MCP_SANDBOX" in sandboxes.status_info()["message"]


def test_status_prints_off_in_a_fresh_interpreter():
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", "import jupyter_tai_sandbox.sandboxes as s; print(s.status())"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert out == "off\n"


def test_registered_provider_is_handed_out_behind_the_policy(tmp_path):
    provider = LocalSandbox(root=str(tmp_path))
    sandboxes.register_sandbox(provider)
    assert sandboxes.status() == "local"
    gated = sandboxes.require_sandbox()
    assert gated is not provider and gated.provider is provider
    # the default floor is container, which the local provider cannot give: rejected at the gate
    with pytest.raises(SandboxSpecRejectedError, match="isolation"):
        asyncio.run(gated.create(SessionSpec()))


def test_policy_is_applied_once_at_create_for_every_consumer(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_TOKEN", "tok-nb")
    policy = SandboxPolicy(isolation="none", credentials={"user:notebook": ["NOTEBOOK_TOKEN"]})
    sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path)), policy=policy)

    async def scenario():
        gated = sandboxes.require_sandbox()
        session = await gated.create(SessionSpec(consumer="user:notebook"))
        try:
            info = await session.info()
            assert info.spec.isolation == "none"
            result = await session.exec(["sh", "-c", 'printf %s "$NOTEBOOK_TOKEN"'], timeout_seconds=10)
            assert result.stdout == b"tok-nb"
            assert [i.id for i in await gated.list()] == [session.id]
        finally:
            await session.destroy()

    asyncio.run(scenario())


def test_the_slot_holds_a_single_provider(tmp_path):
    sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path)))
    with pytest.raises(SandboxError, match="already installed"):
        sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path)))
    sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path)), replace=True)
    with pytest.raises(SandboxError, match="needs a Sandbox provider"):
        sandboxes.register_sandbox(object())  # type: ignore[arg-type]


def test_env_names_the_provider(monkeypatch, tmp_path):
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path))
    monkeypatch.setenv("TAI_MCP_SANDBOX", "local")
    assert sandboxes.status() == "local"
    assert sandboxes.require_sandbox().provider.root == str(tmp_path)


def test_sandbox_module_loads_an_external_provider_class(monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX", "jupyter_tai_sandbox.providers.local:LocalSandbox")
    assert sandboxes.status() == "local"


@pytest.mark.parametrize(
    "name", ["nonexistent_module:Thing", "jupyter_tai_sandbox.policy:SandboxPolicy", "bogus"]
)
def test_a_bad_sandbox_module_is_a_loud_unavailable_error(monkeypatch, name):
    monkeypatch.setenv("TAI_MCP_SANDBOX", name)
    with pytest.raises(SandboxUnavailableError, match="TAI_MCP_SANDBOX"):
        sandboxes.require_sandbox()
    assert sandboxes.status() == "off"
