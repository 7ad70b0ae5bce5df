"""vm sessions with an egress policy (issue 52): the seat of such a session sits on its owner's filtered
bridge at the address the owner's egress gateway picked for it (providers/vm/sandbox.py, docker/gateway.py),
so the guest's only way out is the gateway, which is its resolver: an allowed name answers (the gateway's own
address), an unlisted one is NXDOMAIN, a direct address has no route. The gateway is the very one a docker
provider of the deployment makes and finds. Real QEMU guests (the package's busybox guest) under TCG, the
tests' own internet (tests/support/egress_hosts.py); run as root (CI is)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from docker import errors as docker_errors

from jupyter_tai_sandbox.contract import SandboxSpecRejectedError, SessionSpec
from jupyter_tai_sandbox.contract.egress import EgressPolicy, SecretGrant, new_placeholder
from jupyter_tai_sandbox.policy import within_limits
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.providers.docker.gateway import CA_ENV, LABEL_GATEWAY_NETWORK, LABEL_ROLE
from jupyter_tai_sandbox.providers.vm import VmSandbox
from jupyter_tai_sandbox.providers.vm.networks import LABEL_SEAT
from tests.support import DEPLOYMENT
from tests.support.egress_hosts import (
    ALLOWED,
    PLAIN,
    SECRET_HOST,
    TCP_ECHO_PORT,
    UNLISTED,
    EgressHosts,
    egress_hosts,
)
from tests.support.vm import missing, need_qemu

pytestmark = [
    pytest.mark.docker,
    pytest.mark.egress_gateway,
    pytest.mark.slow(120),
    pytest.mark.timeout(600),
]

__all__ = ["egress_hosts"]  # the fixture, imported for this module

SECRET_NAME = "vm-token"
SECRET_ENV = "VM_TOKEN"


@pytest.fixture(scope="module", autouse=True)
def qemu() -> None:
    need_qemu()
    if os.geteuid() != 0:
        missing("root (a vm session's seat is set up by the server as root)")


@dataclass
class Hooks:
    """The server's side of the gateway: secrets' real values, and the audit lines moved out of it."""

    values: dict[str, str]
    lines: list[dict[str, Any]] = field(default_factory=list)

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        return self.values.get(name)

    def audit(self, record: Any) -> None:
        self.lines.append(dict(record))


@pytest.fixture
def made(client, egress_hosts: EgressHosts, request) -> Iterator[dict[str, Any]]:
    """A vm provider of the test's own deployment and state folder whose gateways ask the test hosts'
    resolver; afterwards nothing of the deployment is left on the engine (no seat, gateway, network, CA
    volume) nor in its folder."""
    state = tempfile.mkdtemp(prefix="tai-vme-", dir="/tmp")
    deployment = f"{DEPLOYMENT}-vmgw-{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]}"
    real = f"real-vm-secret-{secrets.token_hex(16)}"
    hooks = Hooks({SECRET_NAME: real})
    settings = {
        "accel": "tcg",
        "state_dir": state,
        "deployment": deployment,
        "egress_resolver": egress_hosts.resolver,
        "egress_upstream_ca": str(egress_hosts.ca),
    }
    sandbox = VmSandbox(**settings)
    sandbox.egress_hooks = hooks
    yield {"sandbox": sandbox, "settings": settings, "hooks": hooks, "real": real, "hosts": egress_hosts}
    mine = {
        "label": f"jupyter-tai-sandbox.deployment={sandbox.scope.labels['jupyter-tai-sandbox.deployment']}"
    }
    try:
        assert client.containers.list(all=True, filters=mine) == [], "a seat or gateway was left"
        assert client.networks.list(filters=mine) == [], "a bridge was left"
        assert client.volumes.list(filters=mine) == [], "the CA volume was left"
    finally:

        async def close() -> None:
            for info in await sandbox.list():
                with contextlib.suppress(Exception):
                    await (await sandbox.get(info.id)).destroy()
            await sandbox.close()

        asyncio.run(close())
        for container in client.containers.list(all=True, filters=mine):
            container.remove(force=True)
        for network in client.networks.list(filters=mine):
            network.remove()
        for volume in client.volumes.list(filters=mine):
            volume.remove(force=True)
        shutil.rmtree(state, ignore_errors=True)


async def sh(session: Any, script: str, **env: str) -> tuple[int, str]:
    result = await session.exec(["sh", "-c", script], timeout_seconds=60, env=env)
    return result.exit_code, (result.stdout + result.stderr).decode(errors="replace")


async def lookup(session: Any, name: str) -> tuple[int, str]:
    return await sh(session, f"nslookup {name} 2>&1")


async def resolves_to(session: Any, name: str) -> str | None:
    """The address ``name`` resolves to in the guest (its resolv.conf's server), None for NXDOMAIN."""
    code, out = await lookup(session, name)
    if code != 0 or "NXDOMAIN" in out or "can't resolve" in out:
        return None
    answers = out.split(name, 1)[-1].split()
    return next((word for word in reversed(answers) if word.count(".") == 3), None)


def test_a_vm_session_reaches_only_what_its_policy_allows_through_its_owners_gateway(made, client):
    sandbox: VmSandbox = made["sandbox"]
    hosts: EgressHosts = made["hosts"]
    real: str = made["real"]
    owner = f"vmgw-{secrets.token_hex(3)}"
    placeholder = new_placeholder()
    policy = EgressPolicy(
        allow=(PLAIN, ALLOWED),
        secrets=(SecretGrant(SECRET_NAME, SECRET_ENV, placeholder, hosts=(SECRET_HOST,)),),
    )

    async def main() -> None:
        docker = DockerSandbox(
            **{k: v for k, v in made["settings"].items() if k not in ("accel", "state_dir")}
        )
        session = await sandbox.create(
            SessionSpec(owner=owner, egress=policy, env={SECRET_ENV: placeholder}, ttl_seconds=900)
        )
        fork = None
        try:
            gateway = await sandbox._gateways.find(owner)
            assert gateway is not None
            # its seat is on the owner's filtered network, at an address of its own there
            (seat,) = client.containers.list(filters={"label": f"{LABEL_SEAT}={session.id}"})
            networks = seat.attrs["NetworkSettings"]["Networks"]
            assert (
                list(networks) == [gateway.network] and client.networks.get(gateway.network).attrs["Internal"]
            )
            address = networks[gateway.network]["IPAddress"]
            _, shown = await sh(
                session, "ip -4 -o addr show eth0; echo; ip route; echo; cat /etc/resolv.conf"
            )
            assert f" {address}/" in shown and "default" not in shown  # no route out
            assert f"nameserver {gateway.ip}" in shown  # the gateway is the guest's resolver

            # an allowed name answers with the gateway's address, and plain HTTP to it arrives through it
            assert await resolves_to(session, PLAIN) == gateway.ip
            before = len(hosts.http_requests())
            code, out = await sh(session, f"wget -q -O- 'http://{PLAIN}/echo?from=vm-guest'")
            assert code == 0 and json.loads(out)["host"] == PLAIN, out
            assert [r for r in hosts.http_requests()[before:] if r.get("query") == "from=vm-guest"]
            # an unlisted name is NXDOMAIN; HTTP naming it at the gateway gets the policy's 403; a direct
            # address has no route (refused at once, never a hang)
            assert await resolves_to(session, UNLISTED) is None
            code, out = await sh(
                session, f"wget -q -O- --header 'Host: {UNLISTED}' http://{gateway.ip}/ 2>&1"
            )
            assert code != 0 and "403" in out, out
            started = time.monotonic()
            code, out = await sh(session, f"nc -w 5 {hosts.web} {TCP_ECHO_PORT} </dev/null 2>&1; echo rc=$?")
            assert "rc=0" not in out and "unreachable" in out.lower(), out
            assert time.monotonic() - started < 5

            # the CA in the guest as root's, with the environment that makes TLS clients trust it; the
            # secret as its placeholder only
            ca = await sandbox._gateways.ca_pem(gateway)
            _, inside = await sh(session, "cat /tmp/tai-sandbox-ca/ca.pem")
            assert inside.encode() == ca
            _, inside = await sh(session, "cat /tmp/tai-sandbox-ca/bundle.pem")
            assert inside.encode().endswith(ca)
            _, listed = await sh(session, "ls -ln /tmp/tai-sandbox-ca")
            assert all(line.split()[2] == "0" for line in listed.splitlines() if line.endswith(".pem"))
            _, env = await sh(session, "env")
            seen = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
            assert {k: seen.get(k) for k in CA_ENV} == CA_ENV
            assert seen[SECRET_ENV] == placeholder and real not in env
            assert SECRET_ENV in session.spec.env and not set(CA_ENV) & set(session.spec.env)

            # the gateway is the deployment's: a docker provider of it finds the same one (name, labels), and
            # its reap, even long past the grace, keeps it and the vm session's file (a seat is a member)
            found = await docker._gateways.find(owner)
            assert found == gateway
            labels = client.containers.get(gateway.container_id).labels
            assert labels[LABEL_ROLE] == "gateway" and labels[LABEL_GATEWAY_NETWORK] == gateway.network
            await docker._gateways.reap([], time.time() + 3600)
            assert await docker._gateways.find(owner) == gateway
            assert await resolves_to(session, PLAIN) == gateway.ip

            # a live change: in force within a second of set_egress returning, and read back by another server
            await session.set_egress(EgressPolicy(allow=(UNLISTED,), secrets=policy.secrets))
            assert await resolves_to(session, UNLISTED) == gateway.ip
            assert await resolves_to(session, PLAIN) is None
            again = VmSandbox(**made["settings"])
            try:
                assert (await again.get(session.id)).spec.egress.allow == (UNLISTED,)
                listed_policy = {i.id: i.spec.egress for i in await again.list()}
                assert listed_policy[session.id].allow == (UNLISTED,)
            finally:
                await again.close()

            # a fork takes a seat of its own behind the same gateway, under the live policy
            fork = await session.fork()
            assert fork.spec.egress.allow == (UNLISTED,)
            (fork_seat,) = client.containers.list(filters={"label": f"{LABEL_SEAT}={fork.id}"})
            fork_address = fork_seat.attrs["NetworkSettings"]["Networks"][gateway.network]["IPAddress"]
            assert fork_address != address
            _, shown = await sh(fork, "ip -4 -o addr show eth0")
            assert f" {fork_address}/" in shown
            assert await resolves_to(fork, UNLISTED) == gateway.ip
            assert await resolves_to(fork, PLAIN) is None
            code, env = await sh(fork, "env")
            assert f"{SECRET_ENV}={placeholder}" in env and real not in env
            # the guest's root taking the fork's address gets nothing to the gateway (the seat drops frames
            # whose source is not its own): a query from it is never seen there, the same from its own is
            hooks: Hooks = made["hooks"]
            token = secrets.token_hex(4)
            root = sandbox._session(session.id, sandbox._machines.read(session.id)["labels"], {}, 0.0)
            prefix = shown.split(f" {fork_address}/", 1)[1].split()[0]
            await sh(
                root,
                f"ip addr flush dev eth0 && ip addr add {fork_address}/{prefix} dev eth0; "
                f"timeout 3 nslookup spoofed-{token}.{UNLISTED}; "
                f"ip addr flush dev eth0; ip addr add {address}/{prefix} dev eth0",
            )
            await lookup(session, f"own-{token}.{UNLISTED}")

            def audited(word: str) -> list[dict[str, Any]]:
                return [line for line in hooks.lines if word in str(line.get("host"))]

            deadline = time.monotonic() + 5  # the audit pump moves the gateway's lines every second
            while time.monotonic() < deadline and not audited(f"own-{token}"):
                await asyncio.sleep(0.2)
            assert [line["client"] for line in audited(f"own-{token}")] == [address]
            assert audited(f"spoofed-{token}") == []
            # the fork's file at the gateway is its own: the source's policy changes alone
            await session.set_egress(EgressPolicy(allow=(PLAIN,), secrets=policy.secrets))
            assert await resolves_to(fork, UNLISTED) == gateway.ip
            assert await resolves_to(session, PLAIN) == gateway.ip
            await fork.destroy()
            fork = None
            assert await sandbox._gateways.find(owner) is not None  # the source is still behind it
        finally:
            if fork is not None:
                await fork.destroy()
            await session.destroy()
            await docker.close()
        # the owner's last such session took its gateway and filtered network with it
        assert await sandbox._gateways.find(owner) is None
        with pytest.raises(docker_errors.NotFound):
            client.networks.get(sandbox._gateways.filtered_network(owner))

    asyncio.run(main())


def test_without_networks_the_vm_provider_refuses_a_policy_and_says_why():
    """Where it offers network 'none' only (no Docker engine here, or a server not running as root)."""
    limits = VmSandbox(engine_url="unix:///nonexistent/docker.sock").session_limits()
    assert not limits.egress_policy and limits.networks == frozenset({"none"})
    assert limits.egress_refusal == (
        "the vm provider cannot enforce an egress allow-list here: no Docker engine at "
        "unix:///nonexistent/docker.sock (its sessions have network 'none' only); use docker"
    )
    with pytest.raises(SandboxSpecRejectedError):
        within_limits(SessionSpec(egress={"allow": [ALLOWED]}, image=limits.default_image), limits)
