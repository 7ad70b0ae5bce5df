"""With permessage-deflate negotiated, output frames go compressed and still carry every byte."""

import json

import pytest

from tests.support.server import call, read_all, server_config


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes", ServerApp={"websocket_compression_options": {}})


async def test_output_is_compressed_when_the_connection_negotiated_it(jp_ws_fetch, jp_fetch):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    assert status == 201, info
    size = 8 << 20
    ws = await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws", compression_options={})
    assert "permessage-deflate" in ws.headers.get("Sec-WebSocket-Extensions", ""), (
        "compression not negotiated"
    )
    argv = ["sh", "-c", f"head -c {size} /dev/zero; echo done >&2"]
    await ws.write_message(json.dumps({"type": "start", "argv": argv, "timeout_seconds": 60}))
    out, err, final, notes = await read_all(ws, seconds=60)
    assert [n["type"] for n in notes] == ["started"]
    assert (final, err, out) == ({"type": "exit", "exit_code": 0}, b"done\n", bytes(size))
    assert ws.protocol._wire_bytes_in < size // 20, "output frames were not compressed"
