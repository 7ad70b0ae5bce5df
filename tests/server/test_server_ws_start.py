"""A websocket start reads its command from the first byte, however much the command wrote before the start
answered: more than the server's output ring holds is not cut from the head."""

from __future__ import annotations

import json

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from tests.support.server import call, read_all, server_config

RING = 1 << 16
SIZE = 4 << 20


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "tests.support.late_start:LateStartSandbox", tmp_path / "sandboxes",
        SandboxApp={"live_command_buffer_bytes": RING},
    )  # fmt: skip


async def test_a_command_that_wrote_past_the_ring_before_its_start_answered_loses_no_byte(
    jp_fetch, jp_ws_fetch
):
    _, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120})
    ws = await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws")
    script = f"head -c {SIZE} /dev/zero; echo done >&2"
    await ws.write_message(json.dumps({"type": "start", "argv": ["sh", "-c", script], "timeout_seconds": 60}))
    out, err, final, notes = await read_all(ws, seconds=60)
    assert [n["type"] for n in notes] == ["started"]
    assert (len(out), err, final) == (SIZE, b"done\n", {"type": "exit", "exit_code": 0})


async def test_the_python_clients_one_shot_over_the_websocket_gets_every_byte(
    jp_fetch, jp_serverapp, jp_http_port, jp_base_url
):
    _, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 120})
    url = f"http://localhost:{jp_http_port}{jp_base_url}"
    client = SandboxClient(url, token=jp_serverapp.identity_provider.token)
    try:
        remote = await client.exec_start(
            info["id"], ["head", "-c", str(SIZE), "/dev/zero"], timeout_seconds=60
        )
        got = 0
        async for item in remote.output:
            got += len(getattr(item, "data", b""))
        assert got == SIZE and remote.offsets["stdout"] == SIZE
    finally:
        client.close()
