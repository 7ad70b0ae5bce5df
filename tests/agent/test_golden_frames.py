"""The Python codec (``jupyter_tai_sandbox/agent/protocol.py``) decodes and encodes the golden frames of
``agent/testdata/golden_frames.json`` byte for byte; ``agent/golden_test.go`` checks the Go agent against the
same file, so a frame type, a header field or a payload layout that drifts on either side fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_tai_sandbox.agent import protocol

GOLDEN = json.loads(
    (Path(__file__).resolve().parents[2] / "agent" / "testdata" / "golden_frames.json").read_text()
)
FRAMES = GOLDEN["frames"]
# the agent's HELLO and LIST replies share their names with the client's frames in PROTOCOL.md
AGENT_NAMES = {"HELLO": "HELLO_REPLY", "LIST": "LIST_REPLY"}


def constant(g: dict) -> int:
    name = AGENT_NAMES.get(g["type_name"], g["type_name"]) if g["direction"] == "agent" else g["type_name"]
    return getattr(protocol, name)


def payload(g: dict) -> bytes:
    if "json" in g:
        return protocol.json_payload(g["json"])
    if "offset" in g:
        return protocol.U64.pack(g["offset"]) + bytes.fromhex(g["data_hex"])
    if "u64" in g:
        return protocol.U64.pack(g["u64"])
    return bytes.fromhex(g["payload_hex"])


@pytest.mark.parametrize("g", FRAMES, ids=[g["name"] for g in FRAMES])
def test_golden_frame_decodes(g):
    assert constant(g) == g["type"]
    assert (g["type"] in protocol.AGENT_TYPES) == (g["direction"] == "agent")
    wire = bytes.fromhex(g["hex"])
    decoder = protocol.FrameDecoder()
    # byte by byte first: a frame split anywhere decodes the same
    frames = [f for i in range(len(wire)) for f in decoder.feed(wire[i : i + 1])]
    assert len(frames) == 1 and decoder.pending == 0
    (frame,) = frames
    assert (frame.type, frame.id) == (g["type"], g["id"])
    if "json" in g:
        assert frame.json() == g["json"]
    elif "offset" in g:
        assert frame.data() == (g["offset"], bytes.fromhex(g["data_hex"]))
    elif "u64" in g:
        assert frame.u64() == g["u64"]
    else:
        assert frame.payload == bytes.fromhex(g["payload_hex"])


@pytest.mark.parametrize("g", FRAMES, ids=[g["name"] for g in FRAMES])
def test_golden_frame_encodes(g):
    wire = bytes.fromhex(g["hex"])
    assert protocol.encode(g["type"], g["id"], payload(g)) == wire
    if "json" in g:
        assert protocol.encode_json(g["type"], g["id"], g["json"]) == wire
    if "u64" in g:
        assert protocol.encode_u64(g["type"], g["id"], g["u64"]) == wire


@pytest.mark.parametrize("g", GOLDEN["invalid"], ids=[g["name"] for g in GOLDEN["invalid"]])
def test_golden_invalid_frame_is_refused_for_its_length(g):
    with pytest.raises(protocol.ProtocolError, match="out of bounds"):
        protocol.FrameDecoder().feed(bytes.fromhex(g["hex"]))


def test_golden_file_covers_both_directions_and_every_payload_kind():
    kinds = {k for g in FRAMES for k in ("json", "offset", "u64", "payload_hex") if k in g}
    assert kinds == {"json", "offset", "u64", "payload_hex"}
    assert {g["direction"] for g in FRAMES} == {"client", "agent"}
