"""The Python client's egress calls against a real server (local provider): set_egress reaches the gate and
comes back with the provider's typed refusal, egress_audit reads the audit lines."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import SandboxSpecRejectedError
from tests.support.server import sandbox_app, server_config


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes", SandboxPolicy={"egress_audit_path": ""})


async def test_the_python_client_sets_egress_and_reads_the_audit(
    jp_fetch, jp_serverapp, jp_http_port, jp_base_url
):
    client = SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    )
    try:
        sid = (await client.create(ttl_seconds=60))["id"]
        with pytest.raises(SandboxSpecRejectedError, match="local provider cannot change"):
            await client.set_egress(sid, allow=["pypi.org"], deny=["x.pypi.org"])
        sandbox_app(jp_serverapp).policy.egress_audit.audit(
            {
                "time": "2026-12-05T10:00:00Z",
                "owner": "someone",
                "session": sid,
                "kind": "dns",
                "host": "a.org",
            }
        )
        lines = await client.egress_audit(session=sid, since="2026-12-05T09:00:00Z", limit=5)
        assert [line["host"] for line in lines] == ["a.org"]
        await client.destroy(sid)
    finally:
        await client.aclose()
