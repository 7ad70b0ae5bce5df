"""The Python codec's constants are agent/frames.json's (the one table of the protocol's types, limits and
error codes; agent/table_test.go checks the Go agent against the same file), and every error code the
package compares an agent error with is one the agent sends."""

from __future__ import annotations

import json
import re
from pathlib import Path

from jupyter_tai_sandbox.agent import client, protocol

REPO = Path(__file__).resolve().parents[2]
TABLE = json.loads((REPO / "agent" / "frames.json").read_text())


def test_the_codecs_frame_types_are_the_tables():
    for side in ("client_types", "agent_types"):
        for name, value in TABLE[side].items():
            assert getattr(protocol, name) == value, (side, name)
    assert frozenset(TABLE["agent_types"].values()) == protocol.AGENT_TYPES


def test_the_codecs_limits_are_the_tables():
    limits = TABLE["limits"]
    assert (TABLE["version"], TABLE["header"]["size"]) == (protocol.PROTOCOL_VERSION, protocol.HEADER_SIZE)
    assert limits["max_frame_body"] == protocol.MAX_FRAME_BODY
    assert limits["max_start_payload"] == protocol.MAX_START_PAYLOAD
    assert limits["max_read_chunk"] == protocol.MAX_READ_CHUNK
    assert limits["max_list_entries"] == client.MAX_LIST_ENTRIES
    assert protocol.U64.size == limits["credit_size"] == limits["offset_size"]


#: ``code == "ENOENT"``, ``code in ("EXDEV", "ELOOP")``: where the package reads an agent error's code
COMPARED = re.compile(r"""code (?:==|!=) "(E[A-Z0-9]+)"|code in \(((?:"E[A-Z0-9]+",? ?)+)\)""")


def test_every_code_the_package_compares_with_is_one_the_agent_sends():
    compared = set()
    for path in (REPO / "jupyter_tai_sandbox").rglob("*.py"):
        for single, several in COMPARED.findall(path.read_text()):
            compared |= {single} if single else set(re.findall(r"E[A-Z0-9]+", several))
    assert len(compared) > 8  # the scan found the comparisons
    assert compared <= set(TABLE["error_codes"]), compared - set(TABLE["error_codes"])
