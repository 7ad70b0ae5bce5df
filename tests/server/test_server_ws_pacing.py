"""A websocket client that reads, only slower than its command writes, pushes back on the command (the local
provider paces it: its output is not spilled to the server's disk), and still gets every byte."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox import spool as spool_module
from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import ExitItem, OutputChunk
from jupyter_tai_sandbox.providers.local import command as command_module
from jupyter_tai_sandbox.providers.local.command import LocalCommand
from tests.support.server import sandbox_app, server_config

TOTAL = 48 << 20
MEMORY = 1 << 20


@pytest.fixture
def jp_server_config(tmp_path):
    config = server_config("local", tmp_path / "sandboxes")
    config["LocalSandbox"]["output_memory_bytes"] = MEMORY
    return config


def _local_command(handle):
    while not isinstance(handle, LocalCommand):
        handle = handle.handle  # the gate's wrappers keep the provider's handle as .handle
    return handle


async def test_a_slow_websocket_client_paces_its_command_without_spilling(
    jp_fetch, jp_serverapp, jp_http_port, jp_base_url, monkeypatch
):
    # a loaded machine may hold the client back longer than the pacing waits: not what this test is about
    monkeypatch.setattr(command_module, "PACE_IDLE_SECONDS", 60.0)
    monkeypatch.setattr(spool_module, "PACE_IDLE_SECONDS", 60.0)
    client = SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    )
    info = await client.create(ttl_seconds=120)
    remote = await client.exec_start(info["id"], ["head", "-c", str(TOTAL), "/dev/zero"], timeout_seconds=60)
    command = _local_command(sandbox_app(jp_serverapp).execs._commands[remote.exec_id].handle)
    received, items = 0, []
    async for item in remote.output:
        if isinstance(item, OutputChunk):
            received += len(item.data)
            assert command._spool._file is None  # never spilled: the command waited for the client
            await asyncio.sleep(0.002)  # slower than head writes
        else:
            items.append(item)
    assert items == [ExitItem(0)] and received == TOTAL
    await client.destroy(info["id"])
    await client.aclose()
