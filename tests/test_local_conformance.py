import asyncio

from jupyter_tai_sandbox.conformance import run_sandbox_conformance
from jupyter_tai_sandbox.providers.local import LocalSandbox


def test_local_provider_passes_the_conformance_suite(tmp_path):
    sandbox = LocalSandbox(root=str(tmp_path))
    assert asyncio.run(run_sandbox_conformance(sandbox)) == []
    assert asyncio.run(sandbox.list()) == []
    assert sorted(p.name for p in (tmp_path / ".ephemeral").iterdir()) == []
