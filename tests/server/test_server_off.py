"""A server whose provider is off: the kind row reads off and every other route says how to turn it on."""

import pytest

from tests.support.server import call, server_config


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TAI_MCP_SANDBOX", "local")  # explicit config wins over the environment
    return server_config("off", tmp_path / "sandboxes")


async def test_status_reads_off_with_how_to_turn_it_on(jp_fetch):
    status, body = await call(jp_fetch, "status")
    assert status == 200 and body["kind"] == "off" and "TAI_MCP_SANDBOX" in body["message"]


@pytest.mark.parametrize(
    ("method", "parts", "body"),
    [
        ("GET", ("sessions",), None),
        ("POST", ("sessions",), {}),
        ("GET", ("sessions", "sbx-1"), None),
        ("POST", ("sessions", "sbx-1", "exec"), {"argv": ["true"], "timeout_seconds": 1}),
    ],
)
async def test_routes_answer_503_naming_the_setting(jp_fetch, method, parts, body):
    status, reply = await call(jp_fetch, *parts, method=method, body=body)
    assert status == 503
    assert reply["error"] == "SandboxUnavailableError"
    assert "TAI_MCP_SANDBOX" in reply["message"] and "sandbox_module" in reply["message"]
