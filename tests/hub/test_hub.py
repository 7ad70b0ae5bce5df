"""A real JupyterHub with the sandbox service: alice and bob, each through their own server.

The hub runs examples/jupyterhub_config.py (README's config) with only ports, paths and the
deployment name changed: configurable-http-proxy from npm, the dummy authenticator,
SimpleLocalProcessSpawner, the service (``jupyter tai-sandbox serve``) on the docker provider,
and each user's server on the remote provider with its own hub token. A test-only hub service
holds an admin token to start and stop servers and to mint tokens for alice and bob.

Everything runs on 127.0.0.1 free ports with its state in a tmp dir, and is killed at the end,
failures included. Outside CI it skips without docker, configurable-http-proxy (.ci/hub-up) or
jupyterhub, and the browser test (bob's panel and Sandbox drive, logged in through the hub's form)
without the panel browser tests' chromium, Playwright or built labextension; with CI=true it fails
instead. The browser test's screenshots go to tests/artifacts/hub-bob-*.png.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse

import pytest

from tests.support import browser_network
from tests.support.hub import (
    EXAMPLE,
    REPO,
    SERVICE,
    Hub,
    UserServer,
    install_sandboxed_kernelspec,
    missing,
    new_sessions,
    remove_hub,
    require_hub,
    require_python_image,
)
from tests.support.hub import engine_sessions as _engine_sessions
from tests.support.lab import missing_prerequisites, open_panel_tab, shot

ROOT = REPO

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow(86)]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    require_hub()
    hub = Hub(tmp_path_factory.mktemp("hub"))
    try:
        hub.start()
        for user in ("alice", "bob"):
            hub.token_for(user)
        yield hub
    finally:
        remove_hub(hub)  # what the hub's servers left, ours only


def test_the_docs_show_the_config_the_test_runs():
    """The operators' JupyterHub page includes the example file itself (literalinclude), so it cannot drift."""
    page = (ROOT / "docs" / "operators" / "jupyterhub.md").read_text()
    assert "```{literalinclude} ../../examples/jupyterhub_config.py\n" in page
    assert EXAMPLE == ROOT / "examples" / "jupyterhub_config.py"


def test_serve_binds_where_the_hub_says():
    from jupyter_tai_sandbox.hub import server_argv

    argv = server_argv(
        {"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:10101", "JUPYTERHUB_SERVICE_PREFIX": "/services/x/"}
    )
    assert {"--ServerApp.ip=127.0.0.1", "--ServerApp.port=10101", "--ServerApp.base_url=/services/x/"} <= set(
        argv
    )
    assert any(a.endswith("hub.HubServiceIdentityProvider") for a in argv)


def test_the_authorizer_grants_sandbox_resources_and_admin_only_by_scope():
    pytest.importorskip("jupyterhub")
    from jupyter_server.auth.identity import User

    from jupyter_tai_sandbox.hub import HubServiceAuthorizer, HubUser
    from jupyter_tai_sandbox.sessions import ADMIN_RESOURCE, AUTH_RESOURCE

    authorizer = HubServiceAuthorizer()
    user = HubUser(username="alice", hub_scopes=frozenset({f"access:services!service={SERVICE}"}))
    admin = HubUser(username="carol", hub_scopes=frozenset({"custom:tai-sandbox:admin"}))
    filtered = HubUser(username="dave", hub_scopes=frozenset({"custom:tai-sandbox:admin!user=dave"}))
    assert authorizer.is_authorized(None, user, "execute", AUTH_RESOURCE)
    assert not authorizer.is_authorized(None, user, "read", ADMIN_RESOURCE)
    assert all(authorizer.is_authorized(None, admin, a, ADMIN_RESOURCE) for a in ("read", "write", "execute"))
    assert not authorizer.is_authorized(None, filtered, "read", ADMIN_RESOURCE)
    for resource in ("kernels", "contents", "terminals", "sessions", "kernelspecs"):
        assert not authorizer.is_authorized(None, admin, "read", resource)
    assert not authorizer.is_authorized(
        None, User(username="alice"), "read", AUTH_RESOURCE
    )  # not from the hub
    assert not HubServiceAuthorizer(admin_scope="").is_authorized(None, admin, "read", ADMIN_RESOURCE)


def test_the_service_will_not_start_without_a_hub_token_or_an_access_scope(monkeypatch):
    pytest.importorskip("jupyterhub")
    from jupyter_tai_sandbox.hub import HubServiceIdentityProvider

    for name in (
        "JUPYTERHUB_API_TOKEN",
        "JUPYTERHUB_SERVICE_NAME",
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES",
        "JUPYTERHUB_OAUTH_SCOPES",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="JUPYTERHUB_API_TOKEN"):
        HubServiceIdentityProvider().validate_security(None)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    with pytest.raises(SystemExit, match="access scope"):
        HubServiceIdentityProvider().validate_security(None)
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", SERVICE)
    provider = HubServiceIdentityProvider()
    provider.validate_security(None)
    assert provider.hub_auth.access_scopes == {f"access:services!service={SERVICE}"}
    assert provider.token == "" and not provider.login_available and provider.get_handlers() == []


# ---------------------------------------------------------------------- the service itself


def test_the_service_takes_only_hub_users_with_its_access_scope(hub):
    # no token, a bad token, the driver service's token (a service, not a user): all refused
    assert hub.service("GET", "sessions")[0] == 403
    assert hub.service("GET", "sessions", token="not-a-hub-token")[0] == 403
    assert hub.service("GET", "sessions", token=hub.driver_token)[0] == 403
    # a token of alice's without the service's access scope
    status, body = hub.api(
        "POST", "users/alice/tokens", {"note": "no service", "scopes": ["read:users!user=alice"]}
    )
    assert status == 201, body
    assert hub.service("GET", "sessions", token=body["token"])[0] == 403
    # alice's token with the scope: her (empty) listing
    status, body = hub.service("GET", "sessions", token=hub.tokens["alice"])
    assert status == 200 and body["sessions"] == []
    # the websocket refuses the same way
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    async def connect(token: str | None):
        url = (
            f"ws://127.0.0.1:{hub.port}/services/{SERVICE}/api/sandbox/sessions/sbx-0000000000000000/exec/ws"
        )
        headers = {"Authorization": f"token {token}"} if token else {}
        with pytest.raises(HTTPClientError) as refused:
            await websocket_connect(HTTPRequest(url, headers=headers))
        return refused.value.code

    assert asyncio.run(connect(None)) == 403
    assert asyncio.run(connect("not-a-hub-token")) == 403
    assert asyncio.run(connect(hub.tokens["alice"])) == 404  # let in: no such session


def test_the_services_metrics_take_only_a_hub_users_token(hub):
    """The service's /metrics (jupyter_server's, under its prefix) serves the sandbox series to a hub user's token
    with the service's access scope (ServerApp.authenticate_prometheus), to no token and no service's token."""
    url = f"{hub.service_url}metrics"
    assert hub._call("GET", url, None)[0] == 403
    assert hub._call("GET", url, hub.driver_token)[0] == 403
    status, text = hub._call("GET", url, hub.tokens["alice"])
    assert status == 200 and b"# TYPE jupyter_tai_sandbox_sessions gauge" in text, text[:300]
    assert b'jupyter_tai_sandbox_sessions{provider="docker",state="running"}' in text


def test_admin_is_the_operators_custom_scope(servers, alices):
    hub = servers
    admin = hub.token_for("carol", "custom:tai-sandbox:admin", key="carol-admin")
    plain = hub.token_for("carol", key="carol")
    # carol's token with the admin scope sees and manages alice's sessions; without it, nothing of hers
    status, listed = hub.service("GET", "sessions", token=admin)
    assert status == 200 and alices["ephemeral"] in {s["id"] for s in listed["sessions"]}, listed
    status, result = hub.service(
        "POST",
        f"sessions/{alices['ephemeral']}/exec",
        token=admin,
        body={"argv": ["echo", "admin"], "timeout_seconds": 30},
    )
    assert (status, result.get("stdout")) == (200, "admin\n"), result
    status, listed = hub.service("GET", "sessions", token=plain)
    assert status == 200 and listed["sessions"] == [], listed
    assert hub.service("GET", f"sessions/{alices['ephemeral']}", token=plain)[0] == 404
    # bob's server token carries no admin scope (he does not hold it): his server sees only his
    status, listed = hub.sandbox("bob", "GET", "sessions")
    assert {s["owner"] for s in listed["sessions"]} <= {"bob"}
    # nor does the admin scope open the service's own kernels
    assert hub._call("GET", f"{hub.service_url}api/kernels", admin)[0] == 403


def test_the_service_refuses_the_servers_own_kernels_contents_and_terminals(hub):
    token = hub.tokens["alice"]
    for path in ("api/kernels", "api/contents", "api/kernelspecs", "api/sessions", "api/terminals"):
        status, _ = hub._call("GET", f"{hub.service_url}{path}", token)
        assert status in (403, 404), (path, status)
    status, _ = hub._call("POST", f"{hub.service_url}api/kernels", token, body={})
    assert status in (403, 404)


# ---------------------------------------------------------------------- through users' servers


@pytest.fixture(scope="module")
def servers(hub):
    """alice's and bob's servers, started through the hub API."""
    for user in ("alice", "bob"):
        hub.start_server(user)
    return hub


def _create(hub, user: str, **spec) -> dict:
    status, info = hub.sandbox(user, "POST", "sessions", body={"ttl_seconds": 600, **spec})
    assert status == 201, info
    assert info["owner"] == user and info["consumer"] == f"user:{user}", info
    return info


def _client(hub, user: str, base: str | None = None):
    from jupyter_tai_sandbox.client import SandboxClient

    return SandboxClient(base or f"{hub.url}/user/{user}/", hub.tokens[user], request_timeout=60)


def _start_detached(hub, user: str, session_id: str) -> str:
    """A running command of ``user``'s, detached: it runs on for the server's grace period (60 s),
    attachable by the id this returns."""

    async def start_command():
        client = _client(hub, user)
        try:
            remote = await client.exec_start(session_id, ["sleep", "120"], timeout_seconds=180)
            exec_id = remote.exec_id
            remote.disconnect()
            return exec_id
        finally:
            await client.aclose()

    return asyncio.run(start_command())


@pytest.fixture(scope="module")
def alices(servers):
    """alice's things: an ephemeral session, a persistent workspace with a secret, a running command."""
    hub = servers
    ephemeral = _create(hub, "alice")
    persistent = _create(hub, "alice", durability="persistent", workspace_key="alice-data")
    status, _ = hub.sandbox("alice", "PUT", f"sessions/{persistent['id']}/files/secret.txt", raw=b"alice's")
    assert status in (200, 201)

    exec_id = _start_detached(hub, "alice", ephemeral["id"])
    status, listed = hub.service("GET", f"sessions/{ephemeral['id']}/execs", token=hub.tokens["alice"])
    assert status == 200, listed
    service_exec_ids = [e["id"] for e in listed["execs"]]
    return {
        "ephemeral": ephemeral["id"],
        "persistent": persistent["id"],
        "exec_id": exec_id,
        "service_exec_ids": service_exec_ids,
    }


def test_exec_works_for_each_user_through_their_own_server(servers):
    for user in ("alice", "bob"):
        info = _create(servers, user)
        status, result = servers.sandbox(
            user,
            "POST",
            f"sessions/{info['id']}/exec",
            body={"argv": ["sh", "-c", "echo hi $0", user], "timeout_seconds": 30},
        )
        assert (status, result.get("stdout")) == (200, f"hi {user}\n"), result
        assert servers.sandbox(user, "DELETE", f"sessions/{info['id']}")[0] == 204


def test_a_terminal_through_each_users_server(servers):
    """The panel's terminal: a pty command over the exec websocket, through /user/NAME/ and the service."""
    from jupyter_tai_sandbox.contract import ExitItem

    hub = servers

    async def terminal(user: str, sid: str) -> tuple[bytes, int]:
        client = _client(hub, user)
        try:
            remote = await client.exec_start(
                sid,
                ["sh", "-c", "[ -t 0 ] && echo tty; stty size; read line; echo got $line"],
                timeout_seconds=30,
                pty=True,
                rows=30,
                cols=100,
            )
            await remote.write(b"hello\r")
            out, code = b"", None
            async for item in remote.output:
                if isinstance(item, ExitItem):
                    code = item.exit_code
                else:
                    out += item.data
            return out, code
        finally:
            await client.aclose()

    for user in ("alice", "bob"):
        sid = _create(hub, user)["id"]
        out, code = asyncio.run(terminal(user, sid))
        lines = out.decode().replace("\r", "").split("\n")
        assert code == 0 and "tty" in lines and "30 100" in lines and "got hello" in lines, out
        assert hub.sandbox(user, "DELETE", f"sessions/{sid}")[0] == 204


def _routes(sid: str, exec_ids: list[str]) -> list[tuple[str, str, dict]]:
    exec_body = {"argv": ["echo", "planted"], "timeout_seconds": 10}
    routes = [
        ("GET", f"sessions/{sid}", {}),
        ("PATCH", f"sessions/{sid}", {"body": {"ttl_seconds": 60}}),
        ("POST", f"sessions/{sid}/exec", {"body": exec_body}),
        ("GET", f"sessions/{sid}/execs", {}),
        ("GET", f"sessions/{sid}/resolve?path=secret.txt", {}),
        ("GET", f"sessions/{sid}/files/", {}),
        ("GET", f"sessions/{sid}/files/secret.txt", {}),
        ("PUT", f"sessions/{sid}/files/planted.txt", {"raw": b"bob's"}),
        ("POST", f"sessions/{sid}/files/planted-dir", {"body": {"type": "directory"}}),
        ("PATCH", f"sessions/{sid}/files/secret.txt", {"body": {"path": "moved.txt"}}),
        ("DELETE", f"sessions/{sid}/files/secret.txt", {}),
        ("DELETE", f"sessions/{sid}?remove_workspace=1", {}),
    ]
    routes += [("DELETE", f"sessions/{sid}/execs/{exec_id}", {}) for exec_id in exec_ids]
    return routes


def test_bob_reaches_none_of_alices_sessions_execs_or_files(servers, alices):
    hub = servers
    exec_ids = [alices["exec_id"], *alices["service_exec_ids"]]
    for sid in (alices["ephemeral"], alices["persistent"]):
        for method, path, kw in _routes(sid, exec_ids):
            # through bob's own server, and straight at the service with bob's token
            answers = {
                "server": hub.sandbox("bob", method, path, **kw),
                "service": hub.service(method, path, token=hub.tokens["bob"], **kw),
            }
            for door, (status, body) in answers.items():
                # exactly what an unknown id gets: 404, so ids leak nothing
                assert (status, body.get("error")) == (404, "SandboxNotFoundError"), (
                    door,
                    method,
                    path,
                    body,
                )
    # bob's token on alice's server is refused by the hub's own auth
    assert hub.sandbox("alice", "GET", "sessions", as_user="bob")[0] == 403
    # nothing changed: alice's secret is where it was, nothing planted, her command still runs
    status, body = hub.sandbox("alice", "GET", f"sessions/{alices['persistent']}/files/secret.txt")
    assert (status, body) == (200, b"alice's")
    status, listing = hub.sandbox("alice", "GET", f"sessions/{alices['persistent']}/files/")
    assert sorted(e["name"] for e in listing["entries"]) == ["secret.txt"], listing
    status, listed = hub.sandbox("alice", "GET", f"sessions/{alices['ephemeral']}/execs")
    assert alices["exec_id"] in [e["id"] for e in listed["execs"]], listed


def test_bobs_websocket_reaches_none_of_alices(servers, alices):
    from jupyter_tai_sandbox.contract import SandboxError, SandboxNotFoundError

    hub = servers
    mine = _create(hub, "bob")

    async def attempts():
        for base in (f"{hub.url}/user/bob/", hub.service_url):
            client = _client(hub, "bob", base)
            try:
                # a command in alice's session, an attach to her command's id from his own session
                with pytest.raises(SandboxNotFoundError):
                    await client.exec_start(alices["ephemeral"], ["echo", "planted"], timeout_seconds=10)
                for exec_id in (alices["exec_id"], *alices["service_exec_ids"]):
                    with pytest.raises(SandboxError):
                        await client.attach(alices["ephemeral"], exec_id)
                    with pytest.raises(SandboxError) as refused:
                        await client.attach(mine["id"], exec_id)
                    assert "planted" not in str(refused.value)
            finally:
                await client.aclose()

    asyncio.run(attempts())
    assert hub.sandbox("bob", "DELETE", f"sessions/{mine['id']}")[0] == 204


def test_bob_cannot_take_alices_workspace_key_or_consumer(servers, alices):
    hub = servers
    # workspace keys are per owner: bob's "alice-data" is his own, new and empty, never alice's, and his
    # removal of it neither waits on nor says anything about her live session on hers
    status, body = hub.sandbox(
        "bob", "POST", "sessions", body={"durability": "persistent", "workspace_key": "alice-data"}
    )
    assert (status, body.get("owner")) == (201, "bob"), body
    status, _ = hub.sandbox("bob", "GET", f"sessions/{body['id']}/files/secret.txt?type=file")
    assert status == 404
    status, _ = hub.sandbox("bob", "DELETE", f"sessions/{body['id']}?remove_workspace=1")
    assert status == 204
    status, secret = hub.sandbox(
        "alice", "GET", f"sessions/{alices['persistent']}/files/secret.txt?type=file"
    )
    assert (status, secret) == (200, b"alice's")
    status, body = hub.service("POST", "sessions", token=hub.tokens["bob"], body={"consumer": "user:alice"})
    assert (status, body.get("error")) == (403, "SandboxForbiddenError"), body
    # bob is admin of his own server, which labels its sessions as it likes; at the service the label
    # is one under bob's name, so it can never pick alice's credentials there
    status, body = hub.sandbox("bob", "POST", "sessions", body={"consumer": "user:alice"})
    assert status == 201, body
    _, at_service = hub.service("GET", f"sessions/{body['id']}", token=hub.tokens["bob"])
    assert (body["consumer"], at_service["consumer"]) == ("user:alice", "user:bob/user:alice"), at_service
    hub.sandbox("bob", "DELETE", f"sessions/{body['id']}")
    status, body = hub.service("POST", "sessions", token=hub.tokens["bob"], body={"owner": "alice"})
    assert (status, body.get("error")) == (403, "SandboxForbiddenError"), body
    # whatever bob's server sends, a session it makes is bob's: never alice's
    status, body = hub.sandbox("bob", "POST", "sessions", body={"owner": "alice"})
    if status == 201:
        assert body["owner"] == "bob", body
        hub.sandbox("bob", "DELETE", f"sessions/{body['id']}")
    else:
        assert status == 403, body
    alice_ids = {s["id"] for s in hub.sandbox("alice", "GET", "sessions")[1]["sessions"]}
    assert {s.id for s in _engine_sessions(hub.deployment) if s.owner == "alice"} == alice_ids


def test_each_listing_shows_only_its_users_sessions(servers, alices):
    hub = servers
    mine = _create(hub, "bob")
    listed = {user: hub.sandbox(user, "GET", "sessions")[1]["sessions"] for user in ("alice", "bob")}
    assert {s["owner"] for s in listed["alice"]} == {"alice"}
    assert {s["owner"] for s in listed["bob"]} == {"bob"}
    assert {alices["ephemeral"], alices["persistent"]} <= {s["id"] for s in listed["alice"]}
    assert mine["id"] in {s["id"] for s in listed["bob"]}
    # the service answers the same for bob's own token
    status, direct = hub.service("GET", "sessions", token=hub.tokens["bob"])
    assert status == 200, direct
    assert {s["id"] for s in direct["sessions"]} == {s["id"] for s in listed["bob"]}
    assert hub.sandbox("bob", "DELETE", f"sessions/{mine['id']}")[0] == 204


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_sandbox_magic_in_a_users_kernel_runs_in_the_service_as_that_user(servers, user):
    hub = servers
    other = {"alice": "bob", "bob": "alice"}[user]
    before = {s["id"] for s in hub.sandbox(user, "GET", "sessions")[1]["sessions"]}
    kernel = UserServer(hub, user).start_kernel()
    try:
        kernel.ok("%load_ext jupyter_tai_sandbox")
        run = kernel.ok("%%sandbox --timeout 30\necho magic $((6 * 7)) in $(pwd)", timeout=90)
        assert run.stdout.strip() == "magic 42 in /workspace", run.streams
        made = new_sessions(hub, user, before)
        assert [s["owner"] for s in made] == [user], made
        theirs = {s["id"] for s in hub.sandbox(other, "GET", "sessions")[1]["sessions"]}
        assert not theirs & {s["id"] for s in made}
    finally:
        kernel.shutdown()


def test_a_code_tool_through_a_users_server(servers):
    # under JupyterHub a user is admin of their own server, so the fenced tier is theirs there
    status, body = servers.sandbox(
        "alice", "POST", "tools/sandbox_exec/run", body={"argv": ["echo", "tool"], "timeout_seconds": 30}
    )
    assert (status, body.get("stdout")) == (200, "tool\n"), body


def test_a_sandboxed_kernel_through_a_users_server(servers):
    from jupyter_tai_sandbox.images import PYTHON_IMAGE

    hub = servers
    require_python_image()
    name = install_sandboxed_kernelspec(hub, "alice")
    before = {s["id"] for s in hub.sandbox("alice", "GET", "sessions")[1]["sessions"]}
    kernel = UserServer(hub, "alice").start_kernel(name)
    try:
        run = kernel.ok("import os, socket; print(os.getcwd(), os.path.exists('/.dockerenv'))", timeout=90)
        assert run.stdout.split() == ["/workspace", "True"], run.streams
        made = new_sessions(hub, "alice", before)
        assert [(s["owner"], s["spec"]["image"]) for s in made] == [("alice", PYTHON_IMAGE)], made
        sid = made[0]["id"]
    finally:
        kernel.shutdown()
    # the kernel's shutdown destroyed its session, at the service
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sid in {s.id for s in _engine_sessions(hub.deployment)}:
        time.sleep(0.5)
    assert sid not in {s.id for s in _engine_sessions(hub.deployment)}


def test_the_mcp_door_through_each_users_server(servers, alices):
    """The official MCP client at /user/NAME/api/sandbox/mcp with NAME's token: tools, a session, a
    command; bob's calls naming alice's session ids or her command handle are not-found tool errors."""
    from tests.support.mcp import data, mcp_client, refusal

    hub = servers
    url = {user: f"{hub.url}/user/{user}/api/sandbox/mcp" for user in ("alice", "bob")}
    auth = {user: {"Authorization": f"token {hub.tokens[user]}"} for user in ("alice", "bob")}
    secret = "alice's mcp secret"

    async def run():
        async with (
            mcp_client(url["alice"], auth["alice"]) as alice,
            mcp_client(url["bob"], auth["bob"]) as bob,
        ):
            made = {}
            for user, client in (("alice", alice), ("bob", bob)):
                tools = {tool.name for tool in (await client.list_tools()).tools}
                assert {
                    "session_create",
                    "session_exec",
                    "session_exec_start",
                    "session_exec_poll",
                    "session_read_file",
                    "sandbox_exec",
                } <= tools, tools
                info = data(await client.call_tool("session_create", {"ttl_seconds": 600}))
                assert info["owner"] == user, info
                made[user] = info["id"]
                ran = data(
                    await client.call_tool(
                        "session_exec", {"session_id": info["id"], "script": f"echo mcp {user} $((6 * 7))"}
                    )
                )
                assert (ran["exit_code"], ran["stdout"]) == (0, f"mcp {user} 42\n"), ran
                tool = data(await client.call_tool("sandbox_exec", {"argv": ["echo", f"tool {user}"]}))
                assert tool["stdout"] == f"tool {user}\n", tool
            # the door's sessions are the user's at the service too
            assert (
                hub.service("GET", f"sessions/{made['alice']}", token=hub.tokens["alice"])[1]["owner"]
                == "alice"
            )
            data(
                await alice.call_tool(
                    "session_write_file", {"session_id": made["alice"], "path": "s.txt", "content": secret}
                )
            )
            started = data(
                await alice.call_tool(
                    "session_exec_start",
                    {"session_id": made["alice"], "script": "echo started; sleep 60", "timeout_seconds": 120},
                )
            )
            for sid in (made["alice"], alices["ephemeral"], alices["persistent"]):
                for tool, args in (
                    ("session_exec", {"argv": ["echo", "planted"]}),
                    ("session_exec_start", {"argv": ["echo", "planted"]}),
                    ("session_read_file", {"path": "s.txt"}),
                    ("session_read_file", {"path": "secret.txt"}),
                    ("session_write_file", {"path": "planted.txt", "content": "bob's"}),
                    ("session_list_files", {}),
                    ("session_status", {}),
                    ("session_destroy", {}),
                ):
                    refused = refusal(await bob.call_tool(tool, {"session_id": sid, **args}))
                    assert refused["error"] == "SandboxNotFoundError", (tool, sid, refused)
                    assert secret not in json.dumps(refused) and "alice's" not in json.dumps(refused)
            for tool in ("session_exec_poll", "session_exec_kill"):
                refused = refusal(await bob.call_tool(tool, {"handle": started["handle"]}))
                assert refused["error"] == "SandboxNotFoundError", (tool, refused)
            listed = {s["id"] for s in data(await bob.call_tool("session_status", {}))["sessions"]}
            assert made["bob"] in listed and not listed & {
                made["alice"],
                alices["ephemeral"],
                alices["persistent"],
            }
            # alice's command ran on, untouched; her file is hers
            polled = data(
                await alice.call_tool("session_exec_poll", {"handle": started["handle"], "wait_seconds": 5})
            )
            assert polled["running"] and polled["output"] == [{"stream": "stdout", "text": "started\n"}], (
                polled
            )
            read = data(
                await alice.call_tool("session_read_file", {"session_id": made["alice"], "path": "s.txt"})
            )
            assert read["content"] == secret
            assert not data(await alice.call_tool("session_exec_kill", {"handle": started["handle"]}))[
                "running"
            ]
            for user, client in (("alice", alice), ("bob", bob)):
                assert data(await client.call_tool("session_destroy", {"session_id": made[user]}))[
                    "destroyed"
                ]

    asyncio.run(run())
    _, listing = hub.sandbox("alice", "GET", f"sessions/{alices['persistent']}/files/")
    assert sorted(e["name"] for e in listing["entries"]) == ["secret.txt"], listing


DRIVE_FILE = b"bob's notes, read through the drive\n"


@pytest.fixture(scope="module")
def bobs(servers):
    """bob's session with a file he uploaded through his server (for the drive and the panel)."""
    info = _create(servers, "bob")
    status, body = servers.sandbox(
        "bob", "PUT", f"sessions/{info['id']}/files/docs/notes.txt", raw=DRIVE_FILE
    )
    assert status in (200, 201), body
    return info["id"]


def test_the_sandbox_drive_requests_through_bobs_server(servers, alices, bobs):
    """What the Sandbox drive asks bob's server for (the drive is the panel's: it calls the files API
    under /api/sandbox, there is no server-side contents manager): his sessions as its top level, his
    workspace listed, his file read; alice's session's paths 404 as unknown ones do."""
    hub = servers
    status, top = hub.sandbox("bob", "GET", "sessions")
    assert status == 200 and bobs in {s["id"] for s in top["sessions"]}, top
    assert not {s["id"] for s in top["sessions"]} & {alices["ephemeral"], alices["persistent"]}
    status, listing = hub.sandbox("bob", "GET", f"sessions/{bobs}/files/")
    assert (
        status == 200
        and {"name": "docs", "type": "directory"}.items()
        <= next(e for e in listing["entries"] if e["name"] == "docs").items()
    ), listing
    status, listing = hub.sandbox("bob", "GET", f"sessions/{bobs}/files/docs")
    assert status == 200 and [(e["name"], e["size"]) for e in listing["entries"]] == [
        ("notes.txt", len(DRIVE_FILE))
    ]
    assert hub.sandbox("bob", "GET", f"sessions/{bobs}/files/docs/notes.txt") == (200, DRIVE_FILE)
    for path in ("files/", "files/secret.txt", "files/docs/notes.txt"):
        for sid in (alices["persistent"], "sbx-0000000000000000"):
            status, body = hub.sandbox("bob", "GET", f"sessions/{sid}/{path}")
            assert (status, body.get("error")) == (404, "SandboxNotFoundError"), (sid, path, body)


@pytest.fixture
def chromium_ready():
    """The panel browser tests' prerequisites: skip outside CI when missing, fail under CI=true
    (asked for before ``page``, so chromium is never launched when it is missing)."""
    absent = missing_prerequisites()
    if absent:
        missing("for its browser test: " + "; ".join(absent))


@pytest.mark.browser
def test_bobs_panel_and_drive_in_a_browser_through_the_hub(chromium_ready, servers, alices, bobs, page):
    """bob logs in through the hub's form and opens /user/bob/lab: the Sandbox panel lists his session
    and none of alice's; the Sandbox drive shows his workspace and file, and 404s her session's path."""
    from playwright.sync_api import expect

    hub = servers
    # no "official news?" toast over the panel (bob's own lab settings, in his home)
    settings = (
        hub.tmp
        / "homes"
        / "bob"
        / ".jupyter"
        / "lab"
        / "user-settings"
        / "@jupyterlab"
        / "apputils-extension"
    )
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    browser_network.forward(urllib.parse.urlsplit(hub.url).port)
    page.goto(f"{hub.url}/user/bob/lab")
    page.locator("#username_input").fill("bob")  # the hub's login form (the dummy authenticator)
    page.locator("#password_input").fill("any password")
    page.locator("#login_submit").click()
    page.locator('.lm-TabBar-tab[data-id="jp-tai-sandbox-panel"]').wait_for(timeout=60_000)
    assert page.url.startswith(f"{hub.url}/user/bob/lab"), page.url
    panel = open_panel_tab(page)
    status = panel.locator(".jp-TaiSandbox-status")
    expect(status).to_have_attribute("data-connection", "ok")
    # the remote provider reports the kind of what it fronts: the service's docker
    expect(status).to_contain_text("Provider docker")
    expect(panel.locator(f'.jp-TaiSandbox-session[data-session-id="{bobs}"]')).to_have_count(1)
    shown = {item.get_attribute("data-session-id") for item in panel.locator(".jp-TaiSandbox-session").all()}
    theirs = {s["id"] for s in hub.sandbox("bob", "GET", "sessions")[1]["sessions"]}
    assert bobs in shown and shown <= theirs, (shown, theirs)
    assert not shown & {alices["ephemeral"], alices["persistent"]}, shown
    assert "alice" not in panel.inner_text()
    shot(page, "hub-bob-panel")

    # the Sandbox drive: bob's session is a folder, his uploaded file opens in the editor
    page.locator('.lm-TabBar-tab[data-id="tai-sandbox-filebrowser"]').click()
    drive = page.locator("#tai-sandbox-filebrowser")
    expect(drive).to_be_visible()
    for sid in (alices["ephemeral"], alices["persistent"]):
        expect(drive.locator(".jp-DirListing-item", has_text=sid)).to_have_count(0)
    drive.locator(".jp-DirListing-item", has_text=bobs).dblclick()
    drive.locator(".jp-DirListing-item", has_text="docs").dblclick()
    drive.locator(".jp-DirListing-item", has_text="notes.txt").dblclick()
    expect(page.locator(".jp-FileEditor .cm-content")).to_contain_text("bob's notes, read through the drive")
    shot(page, "hub-bob-drive")
    # the drive's own contents calls, as the file browser makes them: his file; her session's path is 404
    answers = page.evaluate(
        """async ([mine, ...hers]) => {
            const contents = window.jupyterapp.serviceManager.contents;
            const status = async path => {
                try { await contents.get(path, {content: true}); return 200; }
                catch (e) { return e.status ?? String(e); }
            };
            const top = await contents.get('Sandbox:', {content: true});
            const file = await contents.get(`Sandbox:${mine}/docs/notes.txt`, {content: true, format: 'text'});
            const refused = {};
            for (const sid of hers) {
                for (const path of [sid, `${sid}/secret.txt`]) { refused[path] = await status(`Sandbox:${path}`); }
            }
            return {top: top.content.map(m => m.name), file: file.content, refused};
        }""",
        [bobs, alices["ephemeral"], alices["persistent"]],
    )
    assert bobs in answers["top"] and not set(answers["top"]) & {alices["ephemeral"], alices["persistent"]}, (
        answers
    )
    assert answers["file"] == DRIVE_FILE.decode(), answers
    assert set(answers["refused"].values()) == {404}, answers


def test_stopping_bobs_server_destroys_his_sessions_and_never_alices(servers, alices):
    hub = servers
    ephemeral = _create(hub, "bob")
    persistent = _create(hub, "bob", durability="persistent", workspace_key="bob-data")
    before = {s.id: s.owner for s in _engine_sessions(hub.deployment)}
    assert {ephemeral["id"], persistent["id"], alices["ephemeral"], alices["persistent"]} <= set(before)
    # alice's command started now: the module's own (the alices fixture) may be past its 60 s detach grace
    # by the time this test runs on a loaded machine, and gone for that reason alone
    running = _start_detached(hub, "alice", alices["ephemeral"])
    hub.stop_server("bob")  # the hub stops it as it stops any server: SIGINT, then SIGTERM after a while
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        owners = {s.id: s.owner for s in _engine_sessions(hub.deployment)}
        if "bob" not in owners.values():
            break
        time.sleep(0.5)
    assert "bob" not in owners.values(), f"bob's sessions outlived his server: {owners}"
    assert {alices["ephemeral"], alices["persistent"]} <= set(owners), owners
    # bob's persistent workspace outlives the session, as it should; alice's command still runs
    status, body = hub.sandbox(
        "alice",
        "POST",
        f"sessions/{alices['ephemeral']}/exec",
        body={"argv": ["echo", "still here"], "timeout_seconds": 30},
    )
    assert (status, body.get("stdout")) == (200, "still here\n"), body
    status, listed = hub.sandbox("alice", "GET", f"sessions/{alices['ephemeral']}/execs")
    assert running in [e["id"] for e in listed["execs"]], listed
