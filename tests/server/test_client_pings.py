"""A command that prints nothing for a while keeps its websocket: the client answers the server's pings."""

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import ExitItem, OutputChunk
from tests.support.server import server_config


@pytest.fixture
def jp_server_config(tmp_path):
    # the server pings every 100 ms and drops a client that has not answered within 1 s
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"tornado_settings": {"ws_ping_interval": 100, "ws_ping_timeout": 1000}},
    )


async def test_the_servers_pings_are_answered_so_a_quiet_command_keeps_its_connection(
    jp_fetch, jp_serverapp, jp_http_port, jp_base_url
):
    assert jp_serverapp.web_app.settings["ws_ping_interval"] == 100
    client = SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    )
    info = await client.create(ttl_seconds=60)
    remote = await client.exec_start(info["id"], ["sh", "-c", "sleep 3; echo still-here"], timeout_seconds=30)
    items = [item async for item in remote.output]
    assert items == [OutputChunk("stdout", b"still-here\n"), ExitItem(0)]
    await client.destroy(info["id"])
    client.close()
