"""Helpers for the MCP door tests: a real `mcp` client over Streamable HTTP to the test server."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

httpx2 = pytest.importorskip("httpx2")
pytest.importorskip("mcp")

from mcp.client import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from tests.support.users import AdminOnlyAdmin, HeaderUsers  # noqa: E402

__all__ = ["AdminOnlyAdmin", "HeaderUsers", "MCPError", "httpx2"]

WORD_COUNT = {
    "description": "Count the words in a text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}


#: what a raw HTTP request to the MCP door sends
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def initialize(request_id: int = 1, client: str = "t") -> dict[str, Any]:
    """A JSON-RPC ``initialize`` request of MCP client ``client``, as a raw HTTP request's body."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": client, "version": "0"},
        },
    }


def mcp_url(port: int, base_url: str) -> str:
    return f"http://localhost:{port}{base_url.rstrip('/')}/api/sandbox/mcp"


@contextlib.asynccontextmanager
async def mcp_client(url: str, headers: dict[str, str], **kwargs: Any) -> AsyncIterator[Client]:
    """An initialized MCP client (legacy handshake, as Claude Code / Cursor / the Inspector speak it)."""
    kwargs.setdefault("mode", "legacy")
    timeout = httpx2.Timeout(30.0, read=120.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        Client(streamable_http_client(url, http_client=http), **kwargs) as client,
    ):
        yield client


def data(result: Any) -> dict[str, Any]:
    """A successful tool result's structured content (asserting it is one)."""
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def refusal(result: Any) -> dict[str, Any]:
    """A refused tool call's error body (asserting it is one)."""
    assert result.is_error, result.structured_content
    body = result.structured_content
    assert "Traceback" not in json.dumps(body)
    assert result.content[0].text.startswith(f"{body['error']}: ")
    return body
