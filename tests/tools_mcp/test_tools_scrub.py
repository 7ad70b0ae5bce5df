"""Credentials reach sessions through spec.env only; scrub_transcript hides their values everywhere.

Tool results, REST exec results and websocket output (a value split across two
chunks included), on every provider, with scrubbing on and off.
"""

import asyncio
import base64
import json
import os
import time

import pytest

from tests.support.server import call, exec_call, server_config

SECRET = "s3cr3t-Value-42"
LEAK = {
    "description": "Print the credential it was given.",
    "input_schema": {"type": "object", "properties": {}},
    "binding": {"script": 'echo "out:$TAI_TOOL_SECRET"; echo "err:$TAI_TOOL_SECRET" >&2'},
}


@pytest.fixture(params=[True, False], ids=["scrub", "noscrub"])
def scrub(request) -> bool:
    return request.param


@pytest.fixture
def jp_server_config(provider, scrub, tmp_path, monkeypatch):
    monkeypatch.setenv("TAI_TOOL_SECRET", SECRET)
    return server_config(
        provider,
        tmp_path / "sandboxes",
        SandboxApp={"presets_path": str(tmp_path / "presets.json"), "presets": {"leak": LEAK, "other": LEAK}},
        # only the consumer "tool:leak" (the tool's label) and sessions labelled "tool:ws" get it
        SandboxPolicy={
            "credentials": {"tool:leak": ["TAI_TOOL_SECRET"], "tool:ws": ["TAI_TOOL_SECRET"]},
            "scrub_transcript": scrub,
        },
    )


def shown(scrub: bool) -> str:
    return "[scrubbed]" if scrub else SECRET


async def test_tool_results_are_scrubbed(jp_fetch, scrub):
    status, result = await call(jp_fetch, "tools", "leak", "run", method="POST", body={})
    assert status == 200, result
    assert (result["stdout"], result["stderr"]) == (f"out:{shown(scrub)}\n", f"err:{shown(scrub)}\n")
    # credentials are per consumer: the same code under another tool's name gets nothing
    status, result = await call(jp_fetch, "tools", "other", "run", method="POST", body={})
    assert result["stdout"] == "out:\n"


async def test_rest_exec_results_are_scrubbed(jp_fetch, scrub):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"consumer": "tool:ws"})
    assert status == 201 and info["spec"]["env"] == ["TAI_TOOL_SECRET"]  # injected into spec.env
    status, result = await exec_call(
        jp_fetch, info["id"], ["sh", "-c", 'echo "$TAI_TOOL_SECRET" >&2; echo "$TAI_TOOL_SECRET"'], 10
    )
    assert (result["stdout"], result["stderr"]) == (f"{shown(scrub)}\n", f"{shown(scrub)}\n")
    # exact bytes (base64) are scrubbed too, and stay exact otherwise
    status, result = await exec_call(
        jp_fetch, info["id"], ["sh", "-c", 'printf "\\377$TAI_TOOL_SECRET\\000"'], 10, encoding="base64"
    )
    assert base64.b64decode(result["stdout"]) == b"\xff" + shown(scrub).encode() + b"\x00"


async def ws_run(jp_ws_fetch, session_id, argv, stdin_frames=(), env=None):
    ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws")
    await ws.write_message(
        json.dumps({"type": "start", "argv": argv, "timeout_seconds": 60, "env": env or {}})
    )

    async def feed():
        for frame in stdin_frames:
            await ws.write_message(frame, binary=True)
        await ws.write_message(json.dumps({"type": "close_stdin"}))

    feeder = asyncio.create_task(feed())
    frames = {1: [], 2: []}
    deadline = time.monotonic() + 60
    while True:
        message = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
        assert message is not None, "closed without a final message"
        if isinstance(message, bytes):
            frames[message[0]].append(message[1:])
            continue
        data = json.loads(message)
        if data["type"] in ("exit", "error"):
            await feeder
            return frames, data


async def test_websocket_output_split_across_chunks_is_scrubbed(jp_fetch, jp_ws_fetch, scrub):
    _status, info = await call(jp_fetch, "sessions", method="POST", body={"consumer": "tool:ws"})
    head, tail = SECRET[:6], SECRET[6:]
    frames, final = await ws_run(
        jp_ws_fetch,
        info["id"],
        [
            "sh",
            "-c",
            'printf %s "$A"; sleep 0.5; printf "%s\\n" "$B"; printf %s "$A" >&2; sleep 0.5; echo "$B" >&2',
        ],
        env={"A": head, "B": tail},
    )
    assert final == {"type": "exit", "exit_code": 0}
    assert b"".join(frames[1]) == b"".join(frames[2]) == f"{shown(scrub)}\n".encode()
    if not scrub:
        assert len(frames[1]) >= 2, "the value did not arrive split: the test proves nothing"


async def test_websocket_stays_binary_safe_with_scrubbing(jp_fetch, jp_ws_fetch, scrub):
    _status, info = await call(jp_fetch, "sessions", method="POST", body={"consumer": "tool:ws"})
    data = bytearray(os.urandom(2 << 20))
    for offset in (0, 65535, 65536 - 3, 1 << 20, len(data) - len(SECRET)):
        data[offset : offset + len(SECRET)] = SECRET.encode()
    data = bytes(data)
    frames, final = await ws_run(
        jp_ws_fetch,
        info["id"],
        ["cat"],
        stdin_frames=[data[i : i + 100_000] for i in range(0, len(data), 100_000)],
    )
    assert final == {"type": "exit", "exit_code": 0}
    expected = data.replace(SECRET.encode(), b"[scrubbed]") if scrub else data
    assert b"".join(frames[1]) == expected
