"""``GET /api/sandbox/sessions/{id}/ports``: a session's listening TCP ports, read inside it (network ``none``).

A real jupyter_server with the docker provider: a session of the Python image runs ``python3 -m http.server
8000`` and an IPv6-only listener; the listing shows both with their preview URLs; another user gets 404; a
``local`` session (whose /proc/net is the host's) is refused, typed. The parser is checked on kernel text.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import SandboxUnsupportedError
from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.previews.listening import ListeningPort, parse_proc_net_tcp
from jupyter_tai_sandbox.previews.urls import port_path
from tests.support.api_spec import check
from tests.support.server import call, exec_call, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

ROUTE = "/sessions/{session_id}/ports"
USERS = {"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin}

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 101 1 0 100 0 0 10 0
   1: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 102 1 0 100 0 0 10 0
   2: 0100007F:A1B2 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 103 1 0 100 0 0 10 0
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 104 1
   1: 00000000000000000000000001000000:2329 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 105 1
   2: 0000000000000000FFFF00000A00020F:232A 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 106 1
   3: garbage line
"""


def test_the_parser_keeps_listeners_one_per_port_with_decoded_addresses():
    assert parse_proc_net_tcp(PROC_NET_TCP) == [
        ListeningPort(3306, "127.0.0.1"),
        ListeningPort(8000, "0.0.0.0"),  # also on :: (tcp6): the address 127.0.0.1 reaches is kept
        ListeningPort(9001, "::1"),
        ListeningPort(9002, "15.2.0.10"),  # an IPv4-mapped IPv6 address, shown as IPv4
    ]
    assert parse_proc_net_tcp("") == []


def test_port_path_has_no_token_and_checks_the_port():
    assert port_path("sbx-1", 8000) == "/api/sandbox/sessions/sbx-1/ports/8000/"
    assert (
        port_path("sbx-1", 8000, "/a/b?x=1", absolute=True)
        == "/api/sandbox/sessions/sbx-1/absolute-ports/8000/a/b?x=1"
    )
    for bad in (0, -1, 65536):
        with pytest.raises(ValueError):
            port_path("sbx-1", bad)


async def _ports(jp_fetch, sid, user="alice"):
    status, body = await call(jp_fetch, "sessions", sid, "ports", headers=as_user(user))
    check(ROUTE, "get", status, body)
    return status, body


@pytest.mark.docker
class TestDocker:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        from tests.support.docker import python_image

        python_image().close()
        return server_config(
            "docker",
            tmp_path / "sandboxes",
            ServerApp=USERS,
            DockerSandbox={"allowed_images": [PYTHON_IMAGE]},
        )

    async def test_a_network_none_sessions_listeners_are_listed_with_their_preview_urls(
        self, jp_fetch, jp_base_url
    ):
        status, info = await call(
            jp_fetch,
            "sessions",
            method="POST",
            body={"ttl_seconds": 300, "network": "none", "image": PYTHON_IMAGE},
            headers=as_user("alice"),
        )
        assert status == 201, info
        sid = info["id"]
        try:
            status, body = await _ports(jp_fetch, sid)
            assert status == 200 and 8000 not in [p["port"] for p in body["ports"]], body
            v6 = (
                "import socket, time; s = socket.socket(socket.AF_INET6); "
                "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1); s.bind(('::', 9001)); s.listen(); "
                "time.sleep(600)"
            )
            start = (
                "setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null & "
                f'setsid python3 -c "{v6}" >/dev/null 2>&1 </dev/null &'
            )
            status, result = await exec_call(jp_fetch, sid, ["sh", "-c", start], headers=as_user("alice"))
            assert status == 200 and result["exit_code"] == 0, result
            give_up = time.monotonic() + 30
            while True:
                status, body = await _ports(jp_fetch, sid)
                assert status == 200, body
                ports = {p["port"]: p for p in body["ports"]}
                if {8000, 9001} <= set(ports) or time.monotonic() > give_up:
                    break
                await asyncio.sleep(0.3)
            base = jp_base_url.rstrip("/")
            assert ports[8000] == {
                "port": 8000,
                "address": "0.0.0.0",
                "url": f"{base}/api/sandbox/sessions/{sid}/ports/8000/",
            }, body
            assert ports[9001]["address"] == "::" and ports[9001]["url"].endswith(f"/{sid}/ports/9001/"), body
            assert "token" not in str(body)
            # another user: 404 like an unknown id, no existence oracle
            status, refused = await _ports(jp_fetch, sid, user="bob")
            assert (status, refused["error"]) == (404, "SandboxNotFoundError"), refused
            unknown = await _ports(jp_fetch, "sbx-0000000000000000", user="bob")
            assert unknown[0] == 404 and unknown[1]["error"] == refused["error"]
        finally:
            await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))
        status, gone = await _ports(jp_fetch, sid)
        assert status == 404, gone


@pytest.mark.docker
class TestClientDocker:
    """The Python client on a server of the default identity (the token's one user)."""

    @pytest.fixture
    def jp_server_config(self, tmp_path):
        from tests.support.docker import python_image

        python_image().close()
        return server_config(
            "docker", tmp_path / "sandboxes", DockerSandbox={"allowed_images": [PYTHON_IMAGE]}
        )

    async def test_the_python_client_lists_the_ports_and_builds_a_full_preview_url_without_the_token(
        self, client
    ):
        info = await client.create(ttl_seconds=300, network="none", image=PYTHON_IMAGE)
        sid = info["id"]
        try:
            await client.exec(
                sid,
                ["sh", "-c", "setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &"],
                timeout_seconds=30,
            )
            give_up = time.monotonic() + 30
            while not (ports := await client.listening_ports(sid)) and time.monotonic() < give_up:
                await asyncio.sleep(0.3)
            assert [(p["port"], p["address"]) for p in ports] == [(8000, "0.0.0.0")], ports
            url = client.port_url(sid, 8000)
            assert url == f"{client.url}api/sandbox/sessions/{sid}/ports/8000/"
            assert client.url.endswith(
                ports[0]["url"].split("api/sandbox/")[0]
            )  # same base_url as the server's
            assert client.token not in url and "token" not in url
            assert client.port_url(sid, 8000, "/static/a.js?v=1", absolute=True) == (
                f"{client.url}api/sandbox/sessions/{sid}/absolute-ports/8000/static/a.js?v=1"
            )
        finally:
            await client.destroy(sid)


@pytest.fixture
def client(jp_fetch, jp_serverapp, jp_http_port, jp_base_url):
    # jp_fetch starts the HTTP server the client talks to; the token alone names the server's own user
    sandbox_client = SandboxClient(
        f"http://localhost:{jp_http_port}{jp_base_url}", jp_serverapp.identity_provider.token
    )
    yield sandbox_client
    sandbox_client.close()


class TestLocal:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("local", tmp_path / "sandboxes", ServerApp=USERS)

    async def test_a_local_session_is_refused_saying_its_ports_would_be_the_hosts(self, jp_fetch):
        status, info = await call(
            jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60}, headers=as_user("alice")
        )
        assert status == 201, info
        status, refused = await _ports(jp_fetch, info["id"])
        assert (status, refused["error"], refused["operation"]) == (400, "SandboxUnsupportedError", "ports")
        assert "host" in refused["message"], refused
        assert (await _ports(jp_fetch, info["id"], user="bob"))[0] == 404


class TestClientLocal:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("local", tmp_path / "sandboxes")

    async def test_the_client_raises_the_typed_refusal(self, client):
        info = await client.create(ttl_seconds=60)
        with pytest.raises(SandboxUnsupportedError, match="host"):
            await client.listening_ports(info["id"])
        await client.destroy(info["id"])
