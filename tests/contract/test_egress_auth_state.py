"""Secrets from a JupyterHub user's auth_state (``"from_auth_state": KEY`` in SandboxPolicy.secrets): the setting,
the per-owner values a policy keeps (read once at create, again in the background once older than
``auth_state_max_age`` when a gateway asks), the refusals (no such key: 400 naming the secret and the key, never
a value; no hub: 400 saying it needs the sandbox service under JupyterHub), the gate that reads them before it
decides, and the hub's reader (HubAuthState) against an HTTP server answering as the hub's REST API does.

The auth_state source here is a dict of users' auth_state: what the hub's API would answer, with a count of the
reads (tests/hub/test_hub_auth_state.py reads a real hub's)."""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import SandboxSpecRejectedError, SandboxUnavailableError, SessionSpec
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.secret_sources import auth_state_value
from tests.contract.test_egress_gate import GatewayLocal, KeepingSession
from tests.contract.test_egress_policy import GATEWAY

pytestmark = pytest.mark.timeout(60)

ALICE = "gho_alice-Own-Token-0123"
BOB = "gho_bob-Own-Token-4567"
SECRETS = {"git": {"hosts": ["api.github.com"], "from_auth_state": "tokens.git", "env": "GIT_TOKEN"}}


class States:
    """Users' auth_state as the hub holds it; ``reads`` counts the reads, ``fail`` makes the next ones fail."""

    def __init__(self, states: dict) -> None:
        self.states = states
        self.reads: list[str] = []
        self.fail: Exception | None = None

    async def auth_state(self, user: str):
        self.reads.append(user)
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return self.states.get(user)


def hub_policy(states: States | None = None, **traits) -> SandboxPolicy:
    traits.setdefault("egress_audit_path", "")
    traits.setdefault("secrets", SECRETS)
    p = SandboxPolicy(**traits)
    p.auth_state_source = states
    return p


def default_states() -> States:
    return States(
        {
            "alice": {"tokens": {"git": ALICE}, "refresh_token": "alice-refresh-never-kept"},
            "bob": {"tokens": {"git": BOB}},
            "dave": {"tokens": {}},
        }
    )


def decided(p: SandboxPolicy, owner: str | None, consumer: str | None = None) -> SessionSpec:
    spec = SessionSpec(owner=owner, consumer=consumer or f"user:{owner}")

    async def main():
        await p.prepare_secrets(spec.owner, spec.consumer)
        return p.effective_spec(spec, GATEWAY)

    return asyncio.run(main())


def test_the_setting_takes_a_key_or_a_dotted_path_and_exactly_one_source(monkeypatch):
    p = SandboxPolicy(egress_audit_path="", secrets=SECRETS)
    assert p.secrets["git"]["from_auth_state"] == "tokens.git" and p.secrets["git"]["env"] == "GIT_TOKEN"
    for bad in ("", "a..b", ".a", "a.", "has space"):
        with pytest.raises(ValueError, match=r"from_auth_state|exactly one"):
            SandboxPolicy(secrets={"x": {"hosts": ["api.example.com"], "from_auth_state": bad}})
    with pytest.raises(ValueError, match=r"exactly one of from_env .* from_auth_state"):
        SandboxPolicy(secrets={"x": {"hosts": ["api.example.com"], "from_auth_state": "t", "from_env": "T"}})
    monkeypatch.setenv(
        "TAI_MCP_SANDBOX_SECRETS",
        json.dumps({"hub": {"hosts": ["x.example.com"], "from_auth_state": "token"}}),
    )
    assert SandboxPolicy().secrets["hub"]["from_auth_state"] == "token"


def test_auth_state_value_follows_a_dotted_path_to_a_string():
    state = {"a": {"b": "v", "n": 3, "e": ""}, "top": "t", "a.b": "literal"}
    assert auth_state_value(state, "a.b") == "v"
    assert auth_state_value(state, "top") == "t"
    assert [auth_state_value(state, k) for k in ("a.n", "a.e", "a", "a.b.c", "missing")] == [None] * 5
    assert auth_state_value(None, "top") is None


def test_each_owner_gets_their_own_value_read_once_and_only_the_secrets_keys_are_kept():
    states = default_states()
    p = hub_policy(states)
    alice = decided(p, "alice")
    (grant,) = alice.egress.secrets
    assert alice.env["GIT_TOKEN"] == grant.placeholder and grant.hosts == ("api.github.com",)
    assert ALICE not in json.dumps(alice.to_json()), "the session's spec holds the placeholder only"
    assert p.secret_value("git", "alice") == ALICE
    assert p.secret_value("git") is None, "a value of the owner's own: none without an owner"
    bob = decided(p, "bob")
    assert p.secret_value("git", "bob") == BOB and bob.env["GIT_TOKEN"] != grant.placeholder
    decided(p, "alice")
    assert states.reads == ["alice", "bob"], "a second create within the max age reads nothing again"
    assert p.secret_value("git", "carol") is None, "a user never read has no value (yet)"
    values = p.injected_values()
    assert ALICE in values and BOB in values, "the scrub knows every user's value read so far"
    assert "alice-refresh-never-kept" not in repr(p.__dict__), "the rest of the auth_state is not kept"


def test_a_missing_key_refuses_the_create_naming_the_secret_and_the_key_never_a_value():
    states = default_states()
    p = hub_policy(states)
    for owner in ("dave", "nobody"):  # the key missing; no auth_state at all
        with pytest.raises(SandboxSpecRejectedError) as refused:
            decided(p, owner)
        message = str(refused.value)
        assert "secret git" in message and "'tokens.git'" in message and f"{owner!r}" in message
        assert ALICE not in message and BOB not in message
    assert decided(p, "bob", consumer="user:bob").egress is not None
    # a secret granted to someone else reads nothing for this consumer
    p = hub_policy(states, secrets={"git": {**SECRETS["git"], "consumers": ["user:alice"]}})
    states.reads.clear()
    assert decided(p, "dave").egress is None and states.reads == []


def test_without_the_hub_service_a_from_auth_state_secret_refuses_the_create():
    p = hub_policy(None)
    with pytest.raises(SandboxSpecRejectedError, match=r"sandbox service under JupyterHub.*admin:auth_state"):
        decided(p, "alice")
    p = hub_policy(default_states())
    with pytest.raises(SandboxSpecRejectedError, match="no owner"):
        decided(p, None, consumer="user:alice")


def test_a_value_older_than_the_max_age_is_read_again_in_the_background():
    states = default_states()
    p = hub_policy(states)

    async def main():
        await p.prepare_secrets("alice", "user:alice")
        assert p.secret_value("git", "alice") == ALICE and states.reads == ["alice"]
        states.states["alice"] = {"tokens": {"git": "gho_alice-Rotated"}}
        p.auth_state_max_age = 0.05
        await asyncio.sleep(0.1)
        # a gateway's ask: the value read last at once, a read started behind it (one, however many ask)
        assert p.secret_value("git", "alice") == ALICE
        assert p.secret_value("git", "alice") == ALICE
        for _ in range(50):
            await asyncio.sleep(0.01)
            if p.secret_value("git", "alice") != ALICE:
                break
        assert p.secret_value("git", "alice") == "gho_alice-Rotated"
        assert states.reads == ["alice", "alice"]
        # a read that fails keeps the value read last, and is logged
        p.auth_state_max_age = 30.0
        p.secret_sources.auth_states["alice"].fetched = -1e9
        states.fail = SandboxUnavailableError("the hub is down")
        assert p.secret_value("git", "alice") == "gho_alice-Rotated"
        await asyncio.sleep(0.05)
        assert p.secret_value("git", "alice") == "gho_alice-Rotated" and len(states.reads) == 3
        # a create whose values are stale reads first, and the hub's error refuses it
        p.secret_sources.auth_states["alice"].fetched = -1e9
        with pytest.raises(SandboxUnavailableError, match="the hub is down"):
            await p.prepare_secrets("alice", "user:alice")
        # an unknown owner asked for by a gateway (a server started again) is read in the background too
        states.fail = None
        assert p.secret_value("git", "bob") is None
        await asyncio.sleep(0.05)
        assert p.secret_value("git", "bob") == BOB

    asyncio.run(main())


def test_the_gate_reads_the_owners_auth_state_before_it_decides(tmp_path):
    states = default_states()
    policy = hub_policy(states, isolation="none", scrub_transcript=True)
    policy.auth_state_source = states
    gate = sandboxes.register_sandbox(GatewayLocal(root=str(tmp_path / "root")), policy=policy, replace=True)
    KeepingSession.applied.clear()

    async def main():
        session = await gate.create(SessionSpec(owner="alice", consumer="user:alice", ttl_seconds=300))
        try:
            info = await session.info()
            (grant,) = info.spec.egress.secrets
            result = await session.session.exec(["env"], timeout_seconds=10)
            assert f"GIT_TOKEN={grant.placeholder}".encode() in result.stdout
            assert ALICE.encode() not in result.stdout
            hooks = gate.provider.egress_hooks
            assert hooks.secret_value("git", "alice") == ALICE and hooks.secret_value("git", "bob") is None
            shown = await session.exec(["echo", ALICE], timeout_seconds=10)
            assert shown.stdout == b"[scrubbed]\n", "the transcript scrub knows the owner's value"
            # a live change reads again first when the values are stale (the gateway writes them again)
            policy.secret_sources.auth_states["alice"].fetched = -1e9
            await gate.set_egress(session.id, allow=["api.github.com"])
            assert states.reads.count("alice") == 2  # (bob's was read in the background: asked for above)
        finally:
            await session.destroy()
        with pytest.raises(SandboxSpecRejectedError, match=r"'tokens.git' is not in hub user 'dave'"):
            await gate.create(SessionSpec(owner="dave", consumer="user:dave", ttl_seconds=300))

    try:
        asyncio.run(main())
    finally:
        sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "plain")), replace=True)


# ---------------------------------------------------------------------- the hub's reader


@pytest.fixture
def hub_api():
    """An HTTP server answering GET /hub/api/users/NAME as JupyterHub's does, for the token 'service-token':
    with auth_state for alice, without it (the scope withheld) for bob, 404 for others."""
    from tornado import web

    seen: list[tuple[str, str]] = []

    class User(web.RequestHandler):
        def get(self, name):
            seen.append((self.request.path, self.request.headers.get("Authorization", "")))
            if self.request.headers.get("Authorization") != "token service-token":
                raise web.HTTPError(403)
            if name == "alice/x":
                self.write({"kind": "user", "name": name, "auth_state": {"tokens": {"git": ALICE}}})
            elif name == "bob":
                self.write({"kind": "user", "name": name})
            elif name == "nostate":
                self.write({"kind": "user", "name": name, "auth_state": None})
            else:
                raise web.HTTPError(404)

    return web.Application([(r"/hub/api/users/(.+)", User)]), seen


def test_hub_auth_state_reads_the_users_auth_state_with_the_services_token(hub_api):
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from jupyter_tai_sandbox.hub import HubAuthState

    app, seen = hub_api

    async def main():
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(app)
        server.add_sockets(sockets)
        url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/hub/api/"
        try:
            source = HubAuthState(url, "service-token")
            assert await source.auth_state("alice/x") == {"tokens": {"git": ALICE}}
            assert seen[-1] == ("/hub/api/users/alice%2Fx", "token service-token"), "name quoted, token sent"
            assert await source.auth_state("nostate") is None
            with pytest.raises(
                SandboxUnavailableError, match=r"withheld .*admin:auth_state and read:users:name"
            ):
                await source.auth_state("bob")
            with pytest.raises(SandboxUnavailableError, match=r"404 .*unknown to the hub"):
                await source.auth_state("carol")
            with pytest.raises(SandboxUnavailableError, match="403"):
                await HubAuthState(url, "wrong").auth_state("alice/x")
        finally:
            server.stop()
        with pytest.raises(SandboxUnavailableError, match="did not answer"):
            await HubAuthState(url, "service-token", timeout=2).auth_state("alice/x")

    asyncio.run(main())
