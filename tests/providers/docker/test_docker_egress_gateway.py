"""The docker provider's egress gateway on a real engine (issue 52): made for an owner's first session with an
egress policy and removed with its last; such a session reaches nothing but its gateway; its CA and env; a
live policy change at the gateway, seen by another server of the deployment; the gateway command restarted
after it dies (by a server started since); a reap of a gateway left alone; nothing left behind."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxSpecRejectedError, SandboxUnavailableError, SessionSpec
from jupyter_tai_sandbox.contract.egress import EgressPolicy, SecretGrant, new_placeholder
from jupyter_tai_sandbox.providers.docker import gateway as gateway_module
from jupyter_tai_sandbox.providers.docker.gateway import (
    CA_DIR,
    CA_ENV,
    GATEWAY_DIR,
    LABEL_GATEWAY_NETWORK,
    LABEL_ROLE,
)
from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_DEPLOYMENT
from tests.support.aio import run
from tests.support.docker import RUN_FILTER, provider, spec

pytestmark = [pytest.mark.docker, pytest.mark.slow(40), pytest.mark.usefixtures("nothing_left")]


class Hooks:
    """The server's side of the gateway (the gate's, in a server): secret values and an audit sink."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)
        self.lines: list[dict] = []

    def secret_value(self, name: str, owner: str | None = None) -> str | None:
        return self.values.get(name)

    def audit(self, record) -> None:
        self.lines.append(dict(record))


def gateways(client, deployment: str) -> list:
    """The deployment's gateway containers (this part of the run's)."""
    return client.containers.list(
        all=True, filters={"label": [RUN_FILTER, f"{LABEL_ROLE}=gateway", f"{LABEL_DEPLOYMENT}={deployment}"]}
    )


def container_file(container, path: str) -> str:
    result = container.exec_run(["cat", path])
    assert result.exit_code == 0, result.output
    return result.output.decode()


def gateway_file(container, path: str) -> str:
    """A file of the gateway's directory, as the gateway container holds it (root's tmpfs)."""
    return container_file(container, f"{GATEWAY_DIR}/{path}")


def default_route(container) -> str | None:
    """The address a container's default route goes through (its /proc/net/route)."""
    for line in container_file(container, "/proc/net/route").splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    return None


def address_on(client, container_id: str, network: str) -> str:
    return client.api.inspect_container(container_id)["NetworkSettings"]["Networks"][network]["IPAddress"]


async def lookup(session, name: str) -> tuple[int, str]:
    """busybox nslookup of ``name`` in the session: exit code, output."""
    result = await session.exec(["nslookup", name], timeout_seconds=20)
    return result.exit_code, (result.stdout + result.stderr).decode(errors="replace")


async def answers(session, name: str, address: str, within: float = 3.0) -> bool:
    """Whether the session's DNS answers ``name`` with ``address`` within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        code, out = await lookup(session, name)
        if code == 0 and address in out:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)


def egress_spec(policy: EgressPolicy, **changes) -> SessionSpec:
    return spec(consumer="docker-egress-gateway", owner="gw-owner", egress=policy, **changes)


def test_a_gateway_serves_an_owners_sessions_and_goes_with_the_last(client):
    async def main():
        hooks = Hooks(**{"gw-token": "real-value-1"})
        ours, other = provider(), provider()  # two servers of one deployment
        ours.egress_hooks = hooks
        grant = SecretGrant(
            name="gw-token", env="GW_TOKEN", placeholder=new_placeholder(), hosts=("api.allowed.test",)
        )
        policy = EgressPolicy(allow=("allowed.test", "*.wild.test"), secrets=(grant,))
        first = second = None
        try:
            assert gateways(client, ours.deployment) == []
            started = time.monotonic()
            first = await ours.create(egress_spec(policy, env={"GW_TOKEN": grant.placeholder}))
            made_in = time.monotonic() - started
            (gateway,) = gateways(client, ours.deployment)
            filtered = gateway.labels[LABEL_GATEWAY_NETWORK]
            assert filtered == ours._gateways.filtered_network("gw-owner")
            gateway_ip = address_on(client, gateway.id, filtered)

            # the session is on the filtered network alone; the gateway on it and on the owner's egress network
            session_networks = client.api.inspect_container(first.container_id)["NetworkSettings"]["Networks"]
            assert set(session_networks) == {filtered}
            assert set(client.api.inspect_container(gateway.id)["NetworkSettings"]["Networks"]) == {
                filtered,
                ours.scope.owner_network(ours.egress_network, "gw-owner"),
            }
            # its way out is the egress bridge: its default route goes there
            egress_gateway = client.api.inspect_container(gateway.id)["NetworkSettings"]["Networks"][
                ours.scope.owner_network(ours.egress_network, "gw-owner")
            ]["Gateway"]
            assert default_route(gateway) == egress_gateway
            assert container_file(gateway, "/proc/sys/net/ipv4/ip_forward").strip() == "0"  # it never routes
            attrs = client.api.inspect_network(filtered)
            assert attrs["Internal"] is True
            assert attrs["Options"].get("com.docker.network.bridge.inhibit_ipv4") == "true"
            # four times an owner network's subnet: every session of the owner with a policy is on it
            assert attrs["IPAM"]["Config"][0]["Subnet"].endswith(f"/{ours.network_prefix - 2}")

            # its DNS is the gateway's: allowed names answer the gateway's own address (at once: the policy is
            # in force when the create returns), others are NXDOMAIN
            code, out = await lookup(first, "allowed.test")
            assert code == 0 and gateway_ip in out, (made_in, out)
            assert await answers(first, "a.wild.test", gateway_ip)
            code, out = await lookup(first, "elsewhere.test")
            assert code != 0 and "NXDOMAIN" in out, out

            # nothing but the gateway: a direct address (the outside, the metadata service) fails at once
            for address in ("1.1.1.1", "169.254.169.254"):
                began = time.monotonic()
                probe = await first.exec(
                    ["sh", "-c", f"nc -w 5 {address} 443 </dev/null; echo rc=$?"], timeout_seconds=20
                )
                assert b"rc=0" not in probe.stdout and time.monotonic() - began < 2.0, (address, probe)

            # the CA, its bundle and the environment that points the session's clients at them
            ca = container_file(gateway, f"{CA_DIR}/ca.pem")
            assert "BEGIN CERTIFICATE" in ca
            shown = await first.exec(
                [
                    "sh",
                    "-c",
                    "cat /tmp/tai-sandbox-ca/ca.pem; echo ===; tail -c 2000 /tmp/tai-sandbox-ca/bundle.pem",
                ],
                timeout_seconds=20,
            )
            own, bundle_end = shown.stdout.decode().split("===\n")
            assert own == ca and bundle_end.endswith(ca)
            env = dict(
                line.split("=", 1)
                for line in (await first.exec(["env"], timeout_seconds=20)).stdout.decode().splitlines()
                if "=" in line
            )
            assert {k: env.get(k) for k in CA_ENV} == CA_ENV
            assert env["GW_TOKEN"] == grant.placeholder

            # the gateway's files: the session's (by its address), the secret's real value
            ip = address_on(client, first.container_id, filtered)
            assert json.loads(gateway_file(gateway, f"sessions/{ip}.json")) == {
                "session": first.id,
                "allow": ["allowed.test", "*.wild.test"],
                "deny": [],
                "secrets": {grant.placeholder: "gw-token"},
            }
            assert json.loads(gateway_file(gateway, "secrets/gw-token.json"))["value"] == "real-value-1"

            # a second session of the owner shares the gateway
            second = await ours.create(egress_spec(EgressPolicy(allow=("second.test",))))
            assert [g.id for g in gateways(client, ours.deployment)] == [gateway.id]
            assert await answers(second, "second.test", gateway_ip)
            code, _ = await lookup(second, "allowed.test")
            assert code != 0  # the first's policy is not the second's

            # a live change: in the gateway's file and in force when set_egress returns
            changed = EgressPolicy(allow=("changed.test",), deny=(), secrets=(grant,))
            await first.set_egress(changed)
            assert json.loads(gateway_file(gateway, f"sessions/{ip}.json"))["allow"] == ["changed.test"]
            code, out = await lookup(first, "changed.test")
            assert code == 0 and gateway_ip in out, out
            code, _ = await lookup(first, "allowed.test")
            assert code != 0
            assert first.spec.egress == changed
            # another server of the deployment reads the live policy back
            theirs = await other.get(first.id)
            assert theirs.spec.egress is not None and theirs.spec.egress.allow == ("changed.test",)
            assert theirs.spec.egress.secrets == (grant,)
            listed = {info.id: info.spec.egress for info in await other.list()}
            assert listed[first.id] is not None and listed[first.id].allow == ("changed.test",)
            # ... and may change it too: this server's info() says so, and the gateway follows
            other.egress_hooks = hooks
            await theirs.set_egress(EgressPolicy(allow=("changed.test", "also.test"), secrets=(grant,)))
            assert (await first.info()).spec.egress.allow == ("changed.test", "also.test")
            assert await answers(first, "also.test", gateway_ip)
            # a fork runs under the policy in force, behind the same gateway
            fork = await first.fork()
            try:
                assert fork.spec.egress is not None and fork.spec.egress.allow == (
                    "changed.test",
                    "also.test",
                )
                assert await answers(fork, "changed.test", gateway_ip)
            finally:
                await fork.destroy()
            assert [g.id for g in gateways(client, ours.deployment)] == [gateway.id]

            # a rotated secret reaches the gateway's file without a restart
            hooks.values["gw-token"] = "real-value-2"
            deadline = time.monotonic() + 10
            while json.loads(gateway_file(gateway, "secrets/gw-token.json"))["value"] != "real-value-2":
                assert time.monotonic() < deadline, "the rotated secret did not reach the gateway"
                await asyncio.sleep(0.2)

            # every decision became an audit line, moved to the server's hooks
            deadline = time.monotonic() + 10
            while not any(
                line.get("session") == first.id
                and line.get("host") == "elsewhere.test"
                and line.get("decision") == "refuse"
                for line in hooks.lines
            ):
                assert time.monotonic() < deadline, hooks.lines[-5:]
                await asyncio.sleep(0.2)
            assert all("real-value" not in json.dumps(line) for line in hooks.lines)

            # the first's end leaves the gateway to the second; the second's end removes it and its networks
            await first.destroy()
            first = None
            assert [g.id for g in gateways(client, ours.deployment)] == [gateway.id]
            assert gateway.exec_run(["test", "-e", f"{GATEWAY_DIR}/sessions/{ip}.json"]).exit_code != 0
            await second.destroy()
            second = None
            assert gateways(client, ours.deployment) == []
            assert client.networks.list(names=[filtered]) == []
            assert client.volumes.list(filters={"name": ours._gateways.ca_volume}) == []
        finally:
            for session in (first, second):
                if session is not None:
                    await session.destroy()
            await ours.close()
            await other.close()

    run(main())


def test_a_server_started_later_restarts_a_dead_gateway_command_and_a_reap_removes_a_gateway_left_alone(
    client, monkeypatch
):
    async def main():
        ours = provider()
        session = None
        try:
            session = await ours.create(egress_spec(EgressPolicy(allow=("alive.test",))))
            (gateway,) = gateways(client, ours.deployment)
            gateway_ip = address_on(client, gateway.id, gateway.labels[LABEL_GATEWAY_NETWORK])
            await ours.close()  # the server stops; the gateway and the session keep running

            pid = gateway_file(gateway, "ready").strip()
            assert gateway.exec_run(["kill", "-9", pid]).exit_code == 0
            inside = client.containers.get(session.container_id)
            assert inside.exec_run(["nslookup", "alive.test"]).exit_code != 0  # no gateway command: no DNS

            # a server started since finds the gateway by its labels (here at its reap) and starts the command
            ours = provider()
            assert session.id not in await ours.reap()
            deadline = time.monotonic() + 15
            while True:
                probe = gateway.exec_run(["cat", f"{GATEWAY_DIR}/ready"])
                if probe.exit_code == 0 and probe.output.decode().strip() not in ("", pid):
                    break
                assert time.monotonic() < deadline, "the gateway command was not started again"
                await asyncio.sleep(0.2)
            theirs = await ours.get(session.id)
            assert await answers(theirs, "alive.test", gateway_ip)

            # a file a crashed server left for an address no session holds goes at a reap (past a grace);
            # the live session's stays
            stray = f"{GATEWAY_DIR}/sessions/10.255.255.9.json"
            made = gateway.exec_run(
                ["sh", "-c", f"echo {{}} >{stray} && touch -d '2020-01-01 00:00:00' {stray}"]
            )
            assert made.exit_code == 0, made.output
            own = f"{GATEWAY_DIR}/sessions/{address_on(client, session.container_id, gateway.labels[LABEL_GATEWAY_NETWORK])}.json"
            await ours.reap()
            assert gateway.exec_run(["test", "-e", stray]).exit_code != 0
            assert gateway.exec_run(["test", "-e", own]).exit_code == 0

            # a session container removed behind the provider's back: the reap (after its grace) removes the
            # gateway left with no session, and its networks
            monkeypatch.setattr(gateway_module, "REAP_GRACE_SECONDS", 2.0)
            client.api.remove_container(session.container_id, force=True, v=True)
            session = None
            await asyncio.sleep(2.2)  # the gateway and its files are older than the grace now
            # but a file just written is a session being admitted (maybe by another server): it keeps the gateway
            fresh = f"{GATEWAY_DIR}/sessions/10.255.255.10.json"
            assert gateway.exec_run(["sh", "-c", f"echo {{}} >{fresh}"]).exit_code == 0
            await ours.reap()
            assert [g.id for g in gateways(client, ours.deployment)] == [gateway.id]
            await asyncio.sleep(2.2)
            await ours.reap()
            assert gateways(client, ours.deployment) == []
        finally:
            if session is not None:
                await session.destroy()
            await ours.close()

    run(main())


def test_a_gateway_that_cannot_start_fails_the_create_and_leaves_nothing(client, tmp_path):
    async def main():
        ours = provider(egress_upstream_ca=str(tmp_path / "missing.pem"))
        try:
            with pytest.raises(SandboxUnavailableError, match="egress_upstream_ca"):
                await ours.create(egress_spec(EgressPolicy(allow=("a.test",))))
            assert gateways(client, ours.deployment) == []
            assert [s for s in await ours.list() if s.spec.owner == "gw-owner"] == []
            assert client.networks.list(names=[ours._gateways.filtered_network("gw-owner")]) == []
        finally:
            await ours.close()

    run(main())


@pytest.mark.parametrize("picks", ["random", "lowest"])
def test_servers_making_an_owners_first_sessions_at_once_share_one_gateway_each_with_its_policy(
    client, monkeypatch, picks
):
    """Three servers make an owner's first sessions at once: one gateway, one gateway command, each session on
    its own address with its own policy. With ``lowest`` every server picks the lowest free address: without
    the claim, all three would write that address's file, two of the containers would fail to start there,
    and their withdrawals would delete the winner's file (its DNS refused)."""
    if picks == "lowest":

        class Lowest:
            @staticmethod
            def choice(seq):
                return seq[0]

        monkeypatch.setattr(gateway_module, "random", Lowest)

    async def main():
        servers = [provider(), provider(), provider()]
        made: list = []
        try:
            results = await asyncio.gather(
                *(
                    server.create(egress_spec(EgressPolicy(allow=(f"s{i}.test",))))
                    for i, server in enumerate(servers)
                ),
                return_exceptions=True,
            )
            made = [r for r in results if not isinstance(r, BaseException)]
            assert len(made) == len(servers), results
            (gateway,) = gateways(client, servers[0].deployment)
            filtered = gateway.labels[LABEL_GATEWAY_NETWORK]
            gateway_ip = address_on(client, gateway.id, filtered)
            addresses = {address_on(client, s.container_id, filtered) for s in made}
            assert len(addresses) == 3
            for i, session in enumerate(made):
                assert await answers(session, f"s{i}.test", gateway_ip), i
                code, _ = await lookup(session, f"s{(i + 1) % 3}.test")
                assert code != 0  # another session's allowance is not its own
            listed = gateway.exec_run(["ls", f"{GATEWAY_DIR}/claims"]).output.decode().split()
            assert set(listed) == addresses
            running = [
                line for line in gateway.exec_run(["ps"]).output.decode().splitlines() if " gateway " in line
            ]
            assert len(running) == 1, running
        finally:
            for session in made:
                await session.destroy()
            for server in servers:
                await server.close()
        assert gateways(client, servers[0].deployment) == []

    run(main())


def test_a_policy_session_never_takes_a_pooled_container(client):
    async def main():
        ours = provider(pool_size=1)
        session = None
        try:
            await ours._connect()  # the pool fills
            for _ in range(100):
                if ours._pool.ready_count():
                    break
                await asyncio.sleep(0.1)
            assert ours._pool.ready_count() == 1
            session = await ours.create(egress_spec(EgressPolicy(allow=("a.test",))))
            assert session.record is None  # not a pooled container's session
            assert ours._pool.ready_count() == 1  # the pooled container still waits
            networks = client.api.inspect_container(session.container_id)["NetworkSettings"]["Networks"]
            assert set(networks) == {ours._gateways.filtered_network("gw-owner")}
        finally:
            if session is not None:
                await session.destroy()
            await ours.close()

    run(main())


def test_a_session_made_without_a_policy_cannot_take_one_while_it_runs(client):
    async def main():
        ours = provider()
        session = None
        try:
            session = await ours.create(spec(consumer="docker-egress-gateway", owner="gw-owner"))
            with pytest.raises(SandboxSpecRejectedError, match="without an egress policy"):
                await session.set_egress(EgressPolicy(allow=("a.test",)))
            assert gateways(client, ours.deployment) == []  # no gateway was made for it
            assert session.spec.egress is None
        finally:
            if session is not None:
                await session.destroy()
            await ours.close()

    run(main())
