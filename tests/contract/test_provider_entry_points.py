"""Providers by name through the ``jupyter_tai_sandbox.providers`` entry-point group: a provider that another
installed distribution registers there is found by its name, as the built-in ones are, and runs sessions;
``module:Class`` keeps working beside it."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.errors import SandboxUnavailableError
from jupyter_tai_sandbox.providers.local import LocalSandbox

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

MODULE = "tai_entry_point_provider"


@pytest.fixture
def installed_distribution(tmp_path, monkeypatch):
    """A separately installed distribution: its module and its ``.dist-info`` (METADATA, entry_points.txt)
    in a folder on sys.path, registering ``elsewhere`` in the providers' group."""
    (tmp_path / f"{MODULE}.py").write_text(
        textwrap.dedent(
            '''
            from jupyter_tai_sandbox.providers.local import LocalSandbox


            class ElsewhereSandbox(LocalSandbox):
                """Another distribution's provider: host subprocesses under a name of its own."""
            '''
        )
    )
    info = tmp_path / "tai_entry_point_provider-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tai-entry-point-provider\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{sandboxes.PROVIDER_ENTRY_POINTS}]\nelsewhere = {MODULE}:ElsewhereSandbox\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(MODULE, None)


def test_a_provider_another_distribution_registers_is_found_by_its_name(installed_distribution):
    assert sandboxes.registered_providers()["elsewhere"] == f"{MODULE}:ElsewhereSandbox"
    cls = sandboxes.load_provider_class("elsewhere")
    assert cls.__module__ == MODULE and cls.__name__ == "ElsewhereSandbox"
    assert issubclass(cls, LocalSandbox)
    assert sandboxes.load_provider_class(f"{MODULE}:ElsewhereSandbox") is cls


def test_the_registered_name_in_tai_mcp_sandbox_runs_a_session(installed_distribution, monkeypatch, tmp_path):
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("TAI_MCP_SANDBOX", "elsewhere")
    monkeypatch.setenv("TAI_MCP_SANDBOX_ISOLATION", "none")  # host subprocesses: below the default floor
    gate = sandboxes.require_sandbox()
    assert type(gate.provider).__name__ == "ElsewhereSandbox"

    async def run() -> str:
        session = await gate.create(SessionSpec())
        try:
            result = await session.exec(["sh", "-c", "echo from elsewhere"], timeout_seconds=10)
            return result.stdout.decode()
        finally:
            await session.destroy()

    assert asyncio.run(run()) == "from elsewhere\n"


def test_a_name_no_distribution_registers_is_still_a_loud_unavailable_error(installed_distribution):
    with pytest.raises(SandboxUnavailableError) as caught:
        sandboxes.load_provider_class("elsewher")
    assert "elsewhere" in str(caught.value)  # the registered names are among the suggestions


def test_the_package_registers_its_built_in_providers_by_the_names_it_falls_back_to():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert (
        pyproject["project"]["entry-points"][sandboxes.PROVIDER_ENTRY_POINTS] == sandboxes.BUILTIN_PROVIDERS
    )
    for name, target in sandboxes.BUILTIN_PROVIDERS.items():
        cls = sandboxes.load_provider_class(name)
        assert (cls.__name__, sandboxes.load_provider_class(target)) == (target.partition(":")[2], cls), name
