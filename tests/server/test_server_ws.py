"""Interactive exec over the websocket, for every provider."""

import asyncio
import json
import os
import time

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import ExitItem, OutputChunk, SandboxExecTimeoutError, SandboxNotFoundError
from jupyter_tai_sandbox.server.output_frames import FRAME_BYTES
from tests.support.server import call, exec_call, read_all, server_config


@pytest.fixture
def jp_server_config(provider, tmp_path):
    # a grace of 0 keeps the kill on disconnect these tests pin (test_server_reattach covers the grace)
    return server_config(provider, tmp_path / "sandboxes", SandboxApp={"live_command_grace_seconds": 0})


async def new_session(jp_fetch) -> str:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    assert status == 201, info
    return info["id"]


async def open_exec(jp_ws_fetch, session_id, **start):
    ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws")
    await ws.write_message(json.dumps({"type": "start", "timeout_seconds": 60, **start}))
    return ws


async def test_exec_streams_stdout_and_stderr_apart_then_one_exit(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    ws = await open_exec(jp_ws_fetch, session_id, argv=["sh", "-c", "echo out; echo err >&2; exit 4"])
    out, err, final, notes = await read_all(ws)
    assert [n["type"] for n in notes] == ["started"]
    assert (out, err, final) == (b"out\n", b"err\n", {"type": "exit", "exit_code": 4})


async def test_sixteen_mib_both_ways_through_cat(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    data = os.urandom(16 << 20)
    ws = await open_exec(jp_ws_fetch, session_id, argv=["cat"])

    async def feed():
        for i in range(0, len(data), 1 << 20):
            await ws.write_message(data[i : i + (1 << 20)], binary=True)
        await ws.write_message(json.dumps({"type": "close_stdin"}))

    feeder = asyncio.create_task(feed())
    out, err, final, _ = await read_all(ws, seconds=120)
    await feeder
    assert final == {"type": "exit", "exit_code": 0}
    assert len(out) == len(data) and out == data and err == b""


async def test_no_frame_carries_more_than_a_frames_bytes_so_a_client_limited_to_one_reads_it_all(
    jp_ws_fetch, jp_fetch
):
    """Whatever the size of the chunks the server reads (a local command that fills its stdout pipe is read
    1 MiB at a time), output goes in frames of at most FRAME_BYTES: a client whose message limit is one frame
    (tornado's closes a connection past it) reads the whole stream."""
    session_id = await new_session(jp_fetch)
    ws = await jp_ws_fetch(
        "api", "sandbox", "sessions", session_id, "exec", "ws", max_message_size=FRAME_BYTES + 1
    )
    argv = ["dd", "if=/dev/zero", "bs=4194304", "count=4"]  # 4 MiB writes: the pipe is full at each read
    await ws.write_message(json.dumps({"type": "start", "timeout_seconds": 60, "argv": argv}))
    out, _err, final, _ = await read_all(ws, seconds=120)
    assert final == {"type": "exit", "exit_code": 0}
    assert out == bytes(16 << 20)


async def test_a_reader_that_pauses_gets_every_byte_in_order(jp_ws_fetch, jp_fetch):
    """While the client does not read, the socket fills: the frames the socket did not take are queued whole
    or in part, behind each other, and every byte still arrives once, in order."""
    session_id = await new_session(jp_fetch)
    script = "dd if=/dev/urandom of=d bs=1048576 count=12 2>/dev/null && dd if=d bs=4194304 2>/dev/null"
    ws = await open_exec(jp_ws_fetch, session_id, argv=["sh", "-c", script])
    assert json.loads(await ws.read_message())["type"] == "started"
    await asyncio.sleep(2)  # the command writes on; the server's sends find the socket full
    out, _err, final, _ = await read_all(ws, seconds=120)
    assert final == {"type": "exit", "exit_code": 0}
    _status, written = await call(jp_fetch, "sessions", session_id, "files", "d")
    assert len(out) == 12 << 20 and out == written


async def test_kill_over_the_websocket(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    ws = await open_exec(jp_ws_fetch, session_id, argv=["sh", "-c", "echo ready; exec sleep 60"])
    assert json.loads(await ws.read_message())["type"] == "started"
    assert await ws.read_message() == b"\x01ready\n"
    await ws.write_message(json.dumps({"type": "kill"}))
    _out, _, final, _ = await read_all(ws, seconds=10)
    assert final == {"type": "exit", "exit_code": 137}


async def test_without_a_grace_a_disconnect_kills_the_command(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    ws = await open_exec(
        jp_ws_fetch, session_id, argv=["sh", "-c", "echo $$ > ws.pid; echo ready; exec sleep 60"]
    )
    assert json.loads(await ws.read_message())["type"] == "started"
    assert await ws.read_message() == b"\x01ready\n"
    _status, pid = await call(jp_fetch, "sessions", session_id, "files", "ws.pid")
    pid = pid.decode().strip()
    ws.close()
    deadline = time.monotonic() + 10
    while True:
        _, result = await exec_call(
            jp_fetch, session_id, ["sh", "-c", f"cat /proc/{pid}/stat 2>/dev/null | cut -d' ' -f3"], 10
        )
        if result["stdout"].strip() in ("", "Z"):
            break
        assert time.monotonic() < deadline, f"process {pid} still runs after the client left"
        await asyncio.sleep(0.2)


async def test_timeout_ends_with_one_error_message_carrying_byte_counts(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    ws = await open_exec(
        jp_ws_fetch, session_id, argv=["sh", "-c", "head -c 7 /dev/zero; exec sleep 60"], timeout_seconds=1
    )
    _, _, final, _ = await read_all(ws, seconds=15)
    assert final["type"] == "error" and final["error"] == "SandboxExecTimeoutError"
    assert final["stdout_bytes"] == 7 and final["stderr_bytes"] == 0


async def test_pty_start_with_size_and_resize(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    ws = await open_exec(
        jp_ws_fetch,
        session_id,
        argv=["sh", "-c", "read line; stty size; exit 0"],
        pty=True,
        rows=30,
        cols=100,
    )
    assert json.loads(await ws.read_message())["type"] == "started"
    await ws.write_message(json.dumps({"type": "resize", "rows": 33, "cols": 111}))
    await ws.write_message(json.dumps({"type": "stdin", "data": "go\n"}))
    out, err, final, notes = await read_all(ws)
    assert b"33 111" in out and err == b"" and final == {"type": "exit", "exit_code": 0}, (out, notes)


async def test_requests_the_command_cannot_take_are_rejected_without_ending_it(jp_ws_fetch, jp_fetch):
    session_id = await new_session(jp_fetch)
    ws = await open_exec(jp_ws_fetch, session_id, argv=["cat"])
    assert json.loads(await ws.read_message())["type"] == "started"
    await ws.write_message(json.dumps({"type": "resize", "rows": 10, "cols": 10}))  # no pty
    await ws.write_message(json.dumps({"type": "dance"}))
    await ws.write_message(b"still here", binary=True)
    await ws.write_message(json.dumps({"type": "close_stdin"}))
    out, _, final, notes = await read_all(ws)
    assert [n["request"] for n in notes if n["type"] == "rejected"] == ["resize", "dance"]
    assert out == b"still here" and final == {"type": "exit", "exit_code": 0}


@pytest.mark.parametrize(
    "first",
    [
        b"binary before start",
        "not json",
        json.dumps({"type": "kill"}),
        json.dumps({"type": "start", "argv": []}),
        json.dumps({"type": "start", "argv": ["true"]}),
        json.dumps({"type": "start", "argv": ["true"], "timeout_seconds": 5, "shell": True}),
    ],
)
async def test_a_bad_first_message_ends_with_one_error(jp_ws_fetch, jp_fetch, first):
    session_id = await new_session(jp_fetch)
    ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws")
    await ws.write_message(first, binary=isinstance(first, bytes))
    _, _, final, notes = await read_all(ws)
    assert notes == [] and final["type"] == "error" and final["error"] == "SandboxRequestError"


async def test_unknown_session_refuses_the_upgrade(jp_ws_fetch):
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("api", "sandbox", "sessions", "sbx-0000000000000000", "exec", "ws")
    assert refused.value.code == 404


async def test_the_python_client_drives_rest_and_websocket(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    # jp_fetch starts the HTTP server the client talks to
    client = SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    )
    info = await client.create(ttl_seconds=120, consumer="client-test")
    sid = info["id"]
    try:
        result = await client.exec(sid, ["cat"], stdin=b"\x00raw", timeout_seconds=10)
        assert (result.exit_code, result.stdout) == (0, b"\x00raw")
        await client.upload(sid, "up.txt", b"uploaded")
        assert await client.download(sid, "up.txt") == b"uploaded"
        assert [e["name"] for e in await client.list_files(sid)] == ["up.txt"]
        remote = await client.exec_start(sid, ["sh", "-c", "cat; exit 2"], timeout_seconds=10)
        await remote.write(b"via ws")
        await remote.close_stdin()
        items = [item async for item in remote.output]
        assert items == [OutputChunk("stdout", b"via ws"), ExitItem(2)]
        await remote.kill()  # after the end: never raises
        with pytest.raises(SandboxExecTimeoutError) as timeout:
            await client.exec(sid, ["sh", "-c", "echo x; exec sleep 30"], timeout_seconds=1)
        assert timeout.value.stdout_bytes == 2
        with pytest.raises(SandboxNotFoundError):
            await client.info("sbx-0000000000000000")
    finally:
        await client.destroy(sid)
