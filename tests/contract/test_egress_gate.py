"""The gate and a session's egress policy: the policy decided at create reaches the provider (placeholders in
the session's environment, never a real value), a live change is narrowed by the gate before the provider
applies it (the session's secrets kept whatever the caller sends), and the gate gives its provider the
EgressHooks its gateway needs (a secret's real value, the audit sink).

The provider is the real local one; a subclass stands in for a provider with an egress gateway only in
saying it enforces a policy and keeping the policy a live change hands it (what a gateway would apply)."""

from __future__ import annotations

import asyncio
import json

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import EgressPolicy, SandboxSpecRejectedError, SecretGrant, SessionSpec
from jupyter_tai_sandbox.contract.egress import new_placeholder
from jupyter_tai_sandbox.gate import GatedSession
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.providers.local.session import LocalSession

pytestmark = pytest.mark.timeout(120)

REAL = "ghp_Real-Secret-Value-0123"


class KeepingSession(LocalSession):
    """A local session that keeps the egress policy it is handed (a gateway would put it in force)."""

    applied: dict[str, EgressPolicy] = {}

    async def set_egress(self, policy: EgressPolicy) -> None:
        self.applied[self.id] = policy


class GatewayLocal(LocalSandbox):
    egress_policy = True
    session_class = KeepingSession


@pytest.fixture
def audit_file(tmp_path):
    return tmp_path / "audit" / "egress.jsonl"


@pytest.fixture
def gate(tmp_path, monkeypatch, audit_file):
    monkeypatch.setenv("TEST_EGRESS_GH", REAL)
    policy = SandboxPolicy(
        isolation="none",
        scrub_transcript=True,
        egress_rules={"*": {"allow": ["*.github.com", "pypi.org"], "deny": ["gist.github.com"]}},
        secrets={"github": {"hosts": ["api.github.com"], "from_env": "TEST_EGRESS_GH", "env": "GH_TOKEN"}},
        egress_audit_path=str(audit_file),
    )
    gated = sandboxes.register_sandbox(GatewayLocal(root=str(tmp_path / "root")), policy=policy, replace=True)
    KeepingSession.applied.clear()
    yield gated
    sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "plain")), replace=True)


def run(gate, scenario, spec=None):
    async def main():
        session = await gate.create(spec or SessionSpec(consumer="user:alice", ttl_seconds=300))
        try:
            return await scenario(session)
        finally:
            await session.destroy()

    return asyncio.run(main())


def test_the_session_holds_a_placeholder_and_its_spec_the_grant(gate):
    async def scenario(session):
        info = await session.info()
        (grant,) = info.spec.egress.secrets
        assert info.spec.egress.allow == ("*.github.com", "pypi.org")
        assert info.spec.egress.deny == ("gist.github.com",)
        # the real value is not in the session: its environment holds the placeholder
        result = await session.session.exec(["env"], timeout_seconds=10)
        assert f"GH_TOKEN={grant.placeholder}".encode() in result.stdout
        assert REAL.encode() not in result.stdout
        assert REAL not in json.dumps(info.to_json())
        # a command that prints the real value (the server's own, on the host) is scrubbed through the gate
        shown = await session.exec(["echo", REAL], timeout_seconds=10)
        assert shown.stdout == b"[scrubbed]\n"
        # and so is the session's placeholder, one-shot and streamed: the transcript shows neither
        shown = await session.exec(["sh", "-c", "echo $GH_TOKEN"], timeout_seconds=10)
        assert shown.stdout == b"[scrubbed]\n"
        handle = await session.exec_start(["sh", "-c", "echo $GH_TOKEN"], timeout_seconds=10)
        streamed = b"".join([item.data async for item in handle.output if hasattr(item, "data")])
        assert streamed == b"[scrubbed]\n"

    run(gate, scenario)


def test_the_gate_gives_its_provider_the_hooks(gate, audit_file):
    hooks = gate.provider.egress_hooks
    assert hooks is not None and gate.egress_hooks is hooks
    assert hooks.secret_value("github") == REAL and hooks.secret_value("nope") is None
    line = {
        "time": "2026-12-05T10:00:00.123456789Z",
        "owner": "alice",
        "session": "sbx-1",
        "kind": "dns",
        "host": "pypi.org",
        "port": 53,
        "decision": "allow",
        "reason": "allowed",
    }
    hooks.audit(line)
    assert gate.egress_audit.query(owner="alice") == [line]
    assert [json.loads(text) for text in audit_file.read_text().splitlines()] == [line]


def test_a_live_change_is_narrowed_by_the_gate_and_keeps_the_secrets(gate):
    async def scenario(session):
        grants = (await session.info()).spec.egress.secrets
        info = await gate.set_egress(session.id, allow=["API.github.com"], deny=["x.org"])
        wanted = EgressPolicy(allow=("api.github.com",), deny=("gist.github.com", "x.org"), secrets=grants)
        assert KeepingSession.applied[session.id] == wanted
        assert info.spec.egress == wanted
        with pytest.raises(SandboxSpecRejectedError, match=r"'github\.com' is over the operator's ceiling"):
            await gate.set_egress(session.id, allow=["github.com"])
        assert KeepingSession.applied[session.id] == wanted, "a refused change applies nothing"
        # a caller's own grants are ignored: the session keeps the operator's
        forged = SecretGrant("github", "GH_TOKEN", new_placeholder(), ("evil.example.com",))
        await session.set_egress(EgressPolicy(allow=None, secrets=(forged,)))
        applied = KeepingSession.applied[session.id]
        assert applied.secrets == grants and applied.allow == ("*.github.com", "pypi.org")

    run(gate, scenario)


def test_a_provider_without_a_gateway_refuses_at_create_and_on_a_live_change(tmp_path):
    policy = SandboxPolicy(isolation="none", egress_audit_path="")
    gated = sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "root")), policy=policy, replace=True)

    async def main():
        with pytest.raises(SandboxSpecRejectedError, match="the local provider runs on the host's network"):
            await gated.create(SessionSpec(egress={"allow": ["pypi.org"]}))
        session = await gated.create(SessionSpec(ttl_seconds=300))
        assert isinstance(session, GatedSession)
        try:
            with pytest.raises(SandboxSpecRejectedError, match="cannot change a session's egress policy"):
                await gated.set_egress(session.id, allow=["pypi.org"])
        finally:
            await session.destroy()

    asyncio.run(main())
