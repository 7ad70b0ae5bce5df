"""Several users on one server: owners, bound consumers, operator limits, the fence on replace.

The test server authenticates with its token as usual; a custom IdentityProvider then
names the user from the ``X-Test-User`` header (so every request is one of alice, bob or
admin), and an Authorizer grants the admin resource to ``admin`` only -- the setup README's
"Several users on one server" section describes.
"""

from __future__ import annotations

import json

import pytest
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider, User
from tornado.httpclient import HTTPClientError

from jupyter_tai_sandbox.sessions import principal_name, server_owner
from tests.support.server import call, exec_call, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user


@pytest.fixture
def jp_server_config(provider, tmp_path, monkeypatch):
    monkeypatch.setenv("WORD_COUNT_TOKEN", "s3cret-value")
    return server_config(
        provider,
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
        SandboxPolicy={
            "credentials": {"tool:word_count": ["WORD_COUNT_TOKEN"]},
            "max_sessions_per_user": 3,
            "max_ttl_seconds": 600.0,
            "max_timeout_seconds": 30.0,
        },
        SandboxApp={"presets_path": str(tmp_path / "presets.json"), "max_preset_bytes": 4096},
    )


async def create(jp_fetch, user, **spec):
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300, **spec}, headers=as_user(user)
    )
    assert status == 201, info
    return info


async def test_another_users_session_answers_404_on_every_route(jp_fetch, jp_ws_fetch):
    alice = await create(jp_fetch, "alice")
    assert alice["owner"] == "alice" and alice["consumer"] == "user:alice"
    sid = alice["id"]
    exec_body = {"argv": ["echo", "hi"], "timeout_seconds": 5}
    for method, parts, body in (
        ("GET", (), None),
        ("POST", ("exec",), exec_body),
        ("GET", ("files", ""), None),
        ("PUT", ("files", "planted.txt"), None),
        ("POST", ("pause",), None),
        ("POST", ("resume",), None),
        ("POST", ("fork",), None),
        ("DELETE", (), None),
    ):
        status, answer = await call(
            jp_fetch, "sessions", sid, *parts, method=method, body=body, headers=as_user("bob")
        )
        unknown = await call(
            jp_fetch,
            "sessions",
            "sbx-0000000000000000",
            *parts,
            method=method,
            body=body,
            headers=as_user("bob"),
        )
        assert (status, answer["error"]) == (404, "SandboxNotFoundError"), (method, parts, answer)
        assert unknown[0] == 404 and unknown[1]["error"] == answer["error"]  # no existence oracle
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws", headers=as_user("bob"))
    assert refused.value.code == 404
    # bob's list does not show it; alice's and the admin's do
    listed = {
        u: [s["id"] for s in (await call(jp_fetch, "sessions", headers=as_user(u)))[1]["sessions"]]
        for u in ("alice", "bob", "admin")
    }
    assert sid in listed["alice"] and sid not in listed["bob"] and sid in listed["admin"]
    # the session is untouched: alice still uses it, the admin manages it
    status, result = await call(
        jp_fetch, "sessions", sid, "exec", method="POST", body=exec_body, headers=as_user("alice")
    )
    assert (status, result["stdout"]) == (200, "hi\n")
    assert (await call(jp_fetch, "sessions", sid, "files", "planted.txt", headers=as_user("alice")))[0] == 404
    status, result = await call(
        jp_fetch, "sessions", sid, "exec", method="POST", body=exec_body, headers=as_user("admin")
    )
    assert status == 200
    assert (await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("admin")))[0] == 204


async def test_the_owners_websocket_works(jp_fetch, jp_ws_fetch):
    sid = (await create(jp_fetch, "alice"))["id"]
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws", headers=as_user("alice"))
    await ws.write_message(json.dumps({"type": "start", "argv": ["echo", "mine"], "timeout_seconds": 5}))
    messages = []
    while (message := await ws.read_message()) is not None:
        messages.append(message)
    assert b"\x01mine\n" in messages and json.loads(messages[-1]) == {"type": "exit", "exit_code": 0}
    ws.close()


async def test_a_consumer_label_is_bound_to_the_caller(jp_fetch):
    status, body = await call(
        jp_fetch, "sessions", method="POST", body={"consumer": "tool:word_count"}, headers=as_user("alice")
    )
    assert (status, body["error"]) == (403, "SandboxForbiddenError") and "tool:word_count" in body["message"]
    status, body = await call(
        jp_fetch, "sessions", method="POST", body={"owner": "bob"}, headers=as_user("alice")
    )
    assert (status, body["error"]) == (403, "SandboxForbiddenError")
    # the admin may name a consumer, and that session gets the consumer's credential
    info = await create(jp_fetch, "admin", consumer="tool:word_count")
    status, result = await exec_call(
        jp_fetch, info["id"], ["sh", "-c", "echo $WORD_COUNT_TOKEN"], 5, headers=as_user("admin")
    )
    assert result["stdout"] == "s3cret-value\n"
    await call(jp_fetch, "sessions", info["id"], method="DELETE", headers=as_user("admin"))


async def test_status_shows_the_credential_map_to_admins_only(jp_fetch):
    _, mine = await call(jp_fetch, "status", headers=as_user("alice"))
    _, admins = await call(jp_fetch, "status", headers=as_user("admin"))
    assert "credentials" not in mine["policy"] and "word_count" not in json.dumps(mine)
    assert admins["policy"]["credentials"] == {"tool:word_count": ["WORD_COUNT_TOKEN"]}


async def test_operator_limits_refuse_instead_of_clamping(jp_fetch):
    status, body = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 1e308}, headers=as_user("alice")
    )
    assert status == 400 and "max_ttl_seconds" in body["message"]
    status, body = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 10**400}, headers=as_user("alice")
    )
    assert status == 400 and body["error"] in ("SandboxSpecRejectedError", "SandboxRequestError")
    sid = (await create(jp_fetch, "alice"))["id"]
    status, body = await exec_call(jp_fetch, sid, ["true"], 31, headers=as_user("alice"))
    assert (status, body["error"], body["field"]) == (400, "SandboxRequestError", "timeout_seconds")
    assert "max_timeout_seconds" in body["message"]
    await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))


async def test_a_user_holds_at_most_max_sessions_per_user(jp_fetch):
    ids = [(await create(jp_fetch, "alice"))["id"] for _ in range(3)]
    status, body = await call(jp_fetch, "sessions", method="POST", body={}, headers=as_user("alice"))
    assert (status, body["error"]) == (429, "SandboxQuotaError") and "max_sessions_per_user" in body[
        "message"
    ]
    # another user is not held back by alice's sessions
    bob = await create(jp_fetch, "bob")
    for sid in ids:
        await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))
    await call(jp_fetch, "sessions", bob["id"], method="DELETE", headers=as_user("bob"))


async def test_removing_a_workspace_in_use_is_refused(jp_fetch):
    first = await create(jp_fetch, "alice", durability="persistent", workspace_key="shared-key")
    second = await create(jp_fetch, "alice", durability="persistent", workspace_key="shared-key")
    status, body = await call(
        jp_fetch,
        "sessions",
        first["id"],
        method="DELETE",
        params={"remove_workspace": "1"},
        headers=as_user("alice"),
    )
    assert (status, body["error"]) == (409, "SandboxConflictError") and "shared-key" in body["message"]
    # nothing was destroyed by the refusal
    assert (await call(jp_fetch, "sessions", first["id"], headers=as_user("alice")))[0] == 200
    await call(jp_fetch, "sessions", second["id"], method="DELETE", headers=as_user("alice"))
    assert (
        await call(
            jp_fetch,
            "sessions",
            first["id"],
            method="DELETE",
            params={"remove_workspace": "1"},
            headers=as_user("alice"),
        )
    )[0] == 204


async def test_two_users_same_workspace_key_are_two_workspaces(jp_fetch):
    """Workspace keys are a namespace per owner (issue 50 finding 7): bob asking for a key alice holds gets
    his own, new workspace, with the very answer a key nobody holds gets; alice keeps hers; an admin naming
    alice as the owner shares hers."""
    alice = await create(jp_fetch, "alice", durability="persistent", workspace_key="alices-data")
    await call(
        jp_fetch,
        "sessions",
        alice["id"],
        "files",
        "secret.txt",
        method="PUT",
        raw=b"alice's",
        headers=as_user("alice"),
    )

    async def bobs(key: str) -> dict:
        """bob's session on ``key``: what the create and a listing answer, then removed with its workspace."""
        info = await create(jp_fetch, "bob", durability="persistent", workspace_key=key)
        status, listing = await call(jp_fetch, "sessions", info["id"], "files", "", headers=as_user("bob"))
        assert status == 200
        missing = await call(jp_fetch, "sessions", info["id"], "files", "secret.txt", headers=as_user("bob"))
        # removing his own never waits on, or is refused for, alice's live session on hers
        status, _ = await call(
            jp_fetch,
            "sessions",
            info["id"],
            method="DELETE",
            params={"remove_workspace": "1"},
            headers=as_user("bob"),
        )
        assert status == 204
        for name in ("id", "created_at", "expires_at", "seconds_left"):
            info.pop(name)
        answer = json.loads(json.dumps({"info": info, "listing": listing}).replace(key, "<key>"))
        return {**answer, "secret": missing[0]}

    held, free = await bobs("alices-data"), await bobs("nobody-holds-it")
    assert held == free
    assert held["secret"] == 404 and held["info"]["owner"] == "bob"
    # alice's is untouched; the admin may name alice as the owner to share hers
    assert await call(jp_fetch, "sessions", alice["id"], "files", "secret.txt", headers=as_user("alice")) == (
        200,
        b"alice's",
    )
    admin = await create(
        jp_fetch, "admin", durability="persistent", workspace_key="alices-data", owner="alice"
    )
    assert await call(jp_fetch, "sessions", admin["id"], "files", "secret.txt", headers=as_user("admin")) == (
        200,
        b"alice's",
    )
    # the admin's own key of that name is another workspace
    own = await create(jp_fetch, "admin", durability="persistent", workspace_key="alices-data")
    assert (await call(jp_fetch, "sessions", own["id"], "files", "secret.txt", headers=as_user("admin")))[
        0
    ] == 404
    assert (await call(jp_fetch, "sessions", alice["id"], method="DELETE", headers=as_user("alice")))[
        0
    ] == 204
    for sid in (own["id"], admin["id"]):
        assert (
            await call(
                jp_fetch,
                "sessions",
                sid,
                method="DELETE",
                params={"remove_workspace": "1"},
                headers=as_user("admin"),
            )
        )[0] == 204


async def test_a_key_another_user_keeps_is_still_yours_to_use(jp_fetch):
    """No squatting: bob keeping the key a notebook uses does not refuse it to alice."""
    bob = await create(jp_fetch, "bob", durability="persistent", workspace_key="getting-started-notes")
    alice = await create(jp_fetch, "alice", durability="persistent", workspace_key="getting-started-notes")
    assert alice["owner"] == "alice"
    for user, sid in (("bob", bob["id"]), ("alice", alice["id"])):
        assert (
            await call(
                jp_fetch,
                "sessions",
                sid,
                method="DELETE",
                params={"remove_workspace": "1"},
                headers=as_user(user),
            )
        )[0] == 204


WORD_COUNT = {
    "description": "Count the words in a text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}


async def test_replacing_a_fenced_preset_needs_the_fence(jp_fetch):
    assert (
        await call(jp_fetch, "tools", "counter", method="PUT", body=WORD_COUNT, headers=as_user("admin"))
    )[0] == 201
    over_status = {"base": "sandbox_status", "description": "harmless?"}
    status, body = await call(
        jp_fetch,
        "tools",
        "counter",
        method="PUT",
        body=over_status,
        params={"replace": "1"},
        headers=as_user("alice"),
    )
    assert (status, body["error"]) == (403, "ToolAccessDeniedError")
    _, stored = await call(jp_fetch, "tools", "counter", headers=as_user("alice"))
    assert stored["base"] == "sandbox_exec"


async def test_presets_have_a_size_limit(jp_fetch):
    big = {**WORD_COUNT, "description": "x" * 5000}
    status, body = await call(jp_fetch, "tools", "big", method="PUT", body=big, headers=as_user("admin"))
    assert (status, body["error"]) == (400, "PresetInvalidError") and "max_preset_bytes" in body["message"]


def test_the_token_identity_provider_is_one_principal():
    for provider_class in (IdentityProvider, PasswordIdentityProvider):
        assert principal_name(provider_class(), User(username="anonymous-3f2a")) == server_owner()
    assert principal_name(HeaderUsers(), User(username="alice")) == "alice"
