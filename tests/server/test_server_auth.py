"""Auth: every route needs a user and an authorization; exec is its own action."""

import pytest
from jupyter_server.auth.authorizer import Authorizer
from tornado.httpclient import HTTPClientError

from tests.support.server import call, server_config

SID = "sbx-0000000000000000"
ROUTES = [
    ("GET", ("status",), None),
    ("GET", ("sessions",), None),
    ("POST", ("sessions",), {}),
    ("GET", ("sessions", SID), None),
    ("DELETE", ("sessions", SID), None),
    ("POST", ("sessions", SID, "exec"), {"argv": ["true"], "timeout_seconds": 5}),
    ("GET", ("sessions", SID, "files", ""), None),
    ("PUT", ("sessions", SID, "files", "x.txt"), None),
    ("GET", ("sessions", SID, "resolve"), None),
    ("DELETE", ("sessions", SID, "execs", "exe-0000000000000000"), None),
]


class NoExecute(Authorizer):
    """Lets a user use sessions (read, write) but never execute anything, nor write a file named ``denied.txt``."""

    def is_authorized(self, handler, user, action, resource):
        if action == "write" and handler.request.path.endswith("/denied.txt"):
            return False
        return action != "execute"


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes", ServerApp={"authorizer_class": NoExecute})


@pytest.mark.parametrize(("method", "parts", "body"), ROUTES)
async def test_every_route_refuses_an_unauthenticated_request(jp_fetch, method, parts, body):
    status, reply = await call(jp_fetch, *parts, method=method, body=body, headers={"Authorization": ""})
    assert status == 403, reply


@pytest.mark.parametrize("authorization", ["", "token not-the-token"])
async def test_a_missing_or_wrong_token_says_so_and_how_to_pass_it(jp_fetch, authorization):
    for method, parts, body in (ROUTES[0], ROUTES[2]):
        status, reply = await call(
            jp_fetch, *parts, method=method, body=body, headers={"Authorization": authorization}
        )
        assert status == 403 and reply["error"] == "SandboxAuthenticationError", reply
        assert "token is missing or wrong" in reply["message"], reply
        assert "Authorization: token <TOKEN>" in reply["message"] and "?token=" in reply["message"], reply


async def test_an_authorizer_denying_execute_refuses_exec_but_not_listing(jp_fetch, jp_ws_fetch):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
    assert status == 201
    assert (await call(jp_fetch, "sessions"))[0] == 200
    status, body = await call(
        jp_fetch, "sessions", info["id"], "exec", method="POST", body={"argv": ["true"], "timeout_seconds": 5}
    )
    assert status == 403 and body["error"] == "HTTPError"
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws")
    assert refused.value.code == 403
    assert (await call(jp_fetch, "sessions", info["id"], "files", "a.txt", method="PUT", raw=b"ok"))[0] == 201
    assert (await call(jp_fetch, "sessions", info["id"], method="DELETE"))[0] == 204


async def test_a_cross_origin_websocket_is_refused(jp_fetch, jp_ws_fetch):
    _, info = await call(jp_fetch, "sessions", method="POST", body={})
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch(
            "api", "sandbox", "sessions", info["id"], "exec", "ws", headers={"Origin": "http://evil.example"}
        )
    assert refused.value.code == 403


async def test_a_cookie_session_without_xsrf_cannot_mutate(jp_fetch, jp_serverapp):
    # log in the way a browser does (the token once), then mutate with the cookie alone
    token = jp_serverapp.identity_provider.token
    response = await jp_fetch(
        "api", "sandbox", "status", params={"token": token}, headers={"Authorization": ""}
    )
    cookies = [c.split(";", 1)[0] for c in response.headers.get_list("Set-Cookie")]
    login = [c for c in cookies if not c.startswith("_xsrf=")]
    assert login, cookies
    cookie = {"Authorization": "", "Cookie": "; ".join(login)}
    assert (await call(jp_fetch, "sessions", headers=cookie))[0] == 200  # the cookie logs in
    status, reply = await call(jp_fetch, "sessions", method="POST", body={}, headers=cookie)
    assert (
        status == 403
        and reply["error"] == "SandboxAuthenticationError"
        and "xsrf" in reply["message"].lower()
    )
    assert "Authorization: token" in reply["message"]  # and how a script passes the token instead


async def test_an_authorizer_denying_an_upload_refuses_it_before_the_body_is_written(jp_fetch):
    _, info = await call(jp_fetch, "sessions", method="POST", body={})
    status, reply = await call(
        jp_fetch, "sessions", info["id"], "files", "denied.txt", method="PUT", raw=b"x" * (4 << 20)
    )
    assert status == 403, reply
    _, listing = await call(jp_fetch, "sessions", info["id"], "files", "")
    assert [e["name"] for e in listing["entries"]] == [], listing
    assert (await call(jp_fetch, "sessions", info["id"], "files", "allowed.txt", method="PUT", raw=b"ok"))[
        0
    ] == 201
