"""The remote provider and an egress policy, against a real `jupyter server` subprocess on the local provider:
a spec's allow and deny lists reach the remote (which refuses them in its provider's words), a secret this
server grants is refused here (it cannot be carried to the remote), a live change is the remote's PATCH, and
the provider learns from the remote's status whether it enforces a policy."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_tai_sandbox.contract import EgressPolicy, SandboxSpecRejectedError, SessionSpec
from jupyter_tai_sandbox.gate import GatedSandbox
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.remote import RemoteSandbox
from tests.support.live_server import LOCAL_ARGS, LiveServer

pytestmark = [pytest.mark.slow(20)]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("egress-remote")
    server = LiveServer(tmp, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp / 'sandboxes'}")).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_policy_goes_to_the_remote_and_a_secret_of_this_server_does_not(remote, monkeypatch):
    monkeypatch.setenv("TEST_REMOTE_SECRET", "value-of-this-server")

    async def main():
        provider = RemoteSandbox(url=remote.url, token=remote.token)
        try:
            with pytest.raises(
                SandboxSpecRejectedError, match="the local provider runs on the host's network"
            ):
                await provider.create(SessionSpec(egress={"allow": ["pypi.org"], "deny": ["x.pypi.org"]}))
            assert provider.egress_policy is False, "learned from the remote's status"
            plain = GatedSandbox(provider, SandboxPolicy(isolation="none", egress_audit_path=""))
            granting = GatedSandbox(
                provider,
                SandboxPolicy(
                    isolation="none",
                    egress_audit_path="",
                    secrets={
                        "s": {"hosts": ["api.example.com"], "from_env": "TEST_REMOTE_SECRET", "env": "S"}
                    },
                ),
            )
            with pytest.raises(SandboxSpecRejectedError, match="the remote sandbox server's provider cannot"):
                await granting.create(SessionSpec(ttl_seconds=60))
            provider.egress_policy = True  # as a remote with a gateway says: this server's secret stays here
            with pytest.raises(SandboxSpecRejectedError, match="cannot carry this server's secrets"):
                await granting.create(SessionSpec(ttl_seconds=60))
            session = await plain.create(SessionSpec(ttl_seconds=60))
            try:
                with pytest.raises(SandboxSpecRejectedError, match="local provider cannot change"):
                    await session.session.set_egress(EgressPolicy(allow=("pypi.org",)))
            finally:
                await session.destroy()
        finally:
            await provider.close()

    asyncio.run(main())
