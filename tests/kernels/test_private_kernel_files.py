"""A local kernel's key is readable by the server's account only (issue 24, point 15).

The connection file in the session holds the kernel's HMAC key: mode 0600 in a
0700 folder (as Jupyter keeps its own), in a local root of mode 0700 (an existing
root of this account is tightened).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.kernels.provisioner import KERNEL_DIR
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.kernels import install_spec, started_kernel

pytestmark = pytest.mark.timeout(180)


def mode(path: str | os.PathLike[str]) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_local_kernels_connection_file_is_0600_in_0700_folders(tmp_path, monkeypatch):

    name = install_spec(tmp_path, monkeypatch)
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)  # an existing root, open to others: the provider tightens it
    sandboxes.register_sandbox(LocalSandbox(root=str(root)), policy=SandboxPolicy(isolation="none"))

    async def main() -> dict[str, int]:
        async with started_kernel(name) as (km, _):
            session = km.provisioner.session
            connection_file = session.resolve(f"{KERNEL_DIR}/kernel-{km.kernel_id}.json")
            with open(connection_file) as f:
                assert json.load(f)["key"]  # the file that holds the key
            return {
                "connection file": mode(connection_file),
                "its folder": mode(os.path.dirname(connection_file)),
                "local root": mode(root),
                "host connection file": mode(km.connection_file),
            }

    modes = asyncio.run(main())
    assert modes == {
        "connection file": 0o600,
        "its folder": 0o700,
        "local root": 0o700,
        "host connection file": 0o600,
    }


def test_a_new_local_root_is_0700(tmp_path):
    root = tmp_path / "made" / "root"

    async def main() -> None:
        sandbox = LocalSandbox(root=str(root))
        session = await sandbox.create(SessionSpec(isolation="none", consumer="modes"))
        try:
            assert mode(root) == 0o700
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())
