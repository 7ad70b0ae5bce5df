"""Secrets from JupyterHub's auth_state on a real hub: the sandbox service reads each session owner's own value.

The hub runs examples/jupyterhub_config.py as tests/hub/test_hub.py does, plus what a secret from_auth_state
needs: auth_state enabled (with an encryption key), a role giving the service the scopes admin:auth_state and
read:users:name, and the secret in the service's SandboxPolicy.secrets (TAI_MCP_SANDBOX_SECRETS). The test's
driver (an admin service of the hub) sets alice's and bob's auth_state through the hub's REST API
(PATCH /hub/api/users/NAME). Then a session each creates at the service holds only a placeholder, the
owner's gateway holds that owner's own value in its secret file, a user without the key is refused (400
naming the secret and the key), and a value changed in the hub reaches the gateway within the service's
refresh (30 s) and its gateway's (2 s)."""

from __future__ import annotations

import json
import secrets
import time

import pytest

from tests.support.hub import Hub, remove_hub, require_hub

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow(75)]

ALICE = "gho_alice-Hub-Auth-State-0123"
ALICE_ROTATED = "gho_alice-Hub-Auth-State-rotated"
BOB = "gho_bob-Hub-Auth-State-4567"
SECRET = {"git": {"hosts": ["api.github.test"], "from_auth_state": "tokens.git", "env": "GIT_TOKEN"}}


class AuthStateHub(Hub):
    """The example's hub with auth_state on and the service allowed to read it (and holding the secret)."""

    def config(self):
        path = super().config()
        extra = f"""
import json
c.Authenticator.enable_auth_state = True
c.CryptKeeper.keys = [{secrets.token_hex(32)!r}]
service["environment"]["TAI_MCP_SANDBOX_SECRETS"] = json.dumps({SECRET!r})
c.JupyterHub.load_roles.append(
    {{"name": "tai-sandbox-auth-state", "scopes": ["admin:auth_state", "read:users:name"], "services": ["tai-sandbox"]}}
)
"""
        path.write_text(path.read_text() + extra)
        return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    require_hub()
    hub = AuthStateHub(tmp_path_factory.mktemp("hub-auth-state"))
    try:
        hub.start()
        for user in ("alice", "bob", "carol"):
            hub.token_for(user)
        yield hub
    finally:
        remove_hub(hub)


def set_auth_state(hub: Hub, user: str, state) -> None:
    status, body = hub.api("PATCH", f"users/{user}", {"auth_state": state})
    assert status == 200, body


def gateway_secret(hub: Hub, owner: str, name: str) -> str | None:
    """The value in the owner's gateway's file for secret ``name`` (None: no gateway or no file yet)."""
    from jupyter_tai_sandbox.providers.docker.gateway import GATEWAY_DIR, LABEL_ROLE
    from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_DEPLOYMENT, LABEL_OWNER
    from tests.support.docker import docker_client

    client = docker_client()
    try:
        found = client.containers.list(
            filters={
                "label": [
                    f"{LABEL_ROLE}=gateway",
                    f"{LABEL_DEPLOYMENT}={hub.deployment}",
                    f"{LABEL_OWNER}={owner}",
                ]
            }
        )
        if not found:
            return None
        (gateway,) = found
        result = gateway.exec_run(["cat", f"{GATEWAY_DIR}/secrets/{name}.json"])
        return json.loads(result.output)["value"] if result.exit_code == 0 else None
    finally:
        client.close()


def create(hub: Hub, user: str):
    return hub.service("POST", "sessions", token=hub.tokens[user], body={"ttl_seconds": 300})


def printed(hub: Hub, user: str, sid: str, command: str) -> str:
    status, result = hub.service(
        "POST",
        f"sessions/{sid}/exec",
        token=hub.tokens[user],
        body={"argv": ["sh", "-c", command], "timeout_seconds": 30},
    )
    assert status == 200 and result["exit_code"] == 0, result
    return result["stdout"]


def test_each_owners_session_gets_their_own_auth_state_value_at_their_gateway(hub):
    set_auth_state(hub, "alice", {"tokens": {"git": ALICE}, "access_token": "not-a-secret-of-the-policy"})
    set_auth_state(hub, "bob", {"tokens": {"git": BOB}})
    made = {}
    try:
        for user, value in (("alice", ALICE), ("bob", BOB)):
            status, info = create(hub, user)
            assert status == 201, info
            made[user] = info["id"]
            (grant,) = info["spec"]["egress"]["secrets"]
            assert (grant["name"], grant["env"], grant["hosts"]) == ("git", "GIT_TOKEN", ["api.github.test"])
            assert value not in json.dumps(info), "the session's record holds the placeholder only"
            # the session sees the placeholder; its owner's gateway holds the owner's own value
            assert printed(hub, user, info["id"], "echo $GIT_TOKEN").strip() == grant["placeholder"]
            assert gateway_secret(hub, user, "git") == value
        assert ALICE not in printed(hub, "bob", made["bob"], "env") and BOB not in printed(
            hub, "alice", made["alice"], "env"
        )

        # carol has no auth_state: her create is refused naming the secret and the key
        status, body = create(hub, "carol")
        assert status == 400 and body["error"] == "SandboxSpecRejectedError", body
        assert "secret git" in body["message"] and "'tokens.git'" in body["message"], body

        # rotation in the hub reaches alice's gateway (the service reads it again after 30 s, the gateway
        # asks every 2 s); bob's stays his
        set_auth_state(hub, "alice", {"tokens": {"git": ALICE_ROTATED}})
        deadline = time.monotonic() + 45
        while gateway_secret(hub, "alice", "git") != ALICE_ROTATED:
            assert time.monotonic() < deadline, f"alice's rotated value not at her gateway:\n{hub.log_tail()}"
            time.sleep(1)
        assert gateway_secret(hub, "bob", "git") == BOB
    finally:
        for user, sid in made.items():
            hub.service("DELETE", f"sessions/{sid}", token=hub.tokens[user])
    log = hub.log_text()
    for value in (ALICE, ALICE_ROTATED, BOB):
        assert value not in log, "no value in the hub's or the service's log"
