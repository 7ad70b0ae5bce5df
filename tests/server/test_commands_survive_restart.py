"""Commands that outlive their server: a docker session's agent holds each interactive command and its
recent output, so a server started after a SIGKILLed one adopts them under the same exec ids; a client
attaches from the offset it had seen and gets the rest, nothing skipped or repeated.

Each test runs real ``jupyter server`` subprocesses on one state folder and a deployment of their own.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError
from tests.support import DEPLOYMENT
from tests.support.live_server import LiveServer, sandbox_server, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300), pytest.mark.slow(40)]

COUNT = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i; sleep 0.005; done"]


@pytest.fixture
def docker_servers(tmp_path):
    """Start servers (the same arguments each time) on one state folder and a deployment of their own;
    everything left is removed even when the test fails."""
    docker_support = pytest.importorskip("tests.support.docker")
    client = docker_support.docker_client()
    deployment = f"{DEPLOYMENT}-restart-{secrets.token_hex(3)}"
    extra = (f"--DockerSandbox.image={docker_support.TEST_IMAGE}", f"--DockerSandbox.deployment={deployment}")
    started: list[LiveServer] = []

    def start(*more: str) -> LiveServer:
        server = sandbox_server(tmp_path, "docker", *extra, *more)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
        docker_support.remove_deployment(client, deployment)


async def _ws(server: LiveServer, session_id: str):
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{server.port}/api/sandbox/sessions/{session_id}/exec/ws"
    return await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"}))


async def _read_until(ws, stdout: bytearray, enough, seconds: float = 60) -> dict | None:
    """Read output frames into ``stdout`` until ``enough(stdout)``; the final message if one came first."""
    async with asyncio.timeout(seconds):
        while not enough(stdout):
            message = await ws.read_message()
            if message is None:
                return {"type": "closed"}
            if isinstance(message, bytes):
                assert message[0] == 1, f"stderr: {message[1:]!r}"
                stdout += message[1:]
            else:
                return json.loads(message)
    return None


def _lines(data: bytes | bytearray) -> int:
    return data.count(b"\n")


def test_a_websocket_command_outlives_a_killed_server_and_resumes_at_the_clients_offset(docker_servers):
    first = docker_servers()
    _, session = first.call("POST", "sessions", {"ttl_seconds": 600})
    sid = session["id"]

    async def before() -> tuple[str, bytearray]:
        ws = await _ws(first, sid)
        await ws.write_message(json.dumps({"type": "start", "argv": COUNT, "timeout_seconds": 240}))
        started = json.loads(await ws.read_message())
        assert started["type"] == "started", started
        seen = bytearray()
        assert await _read_until(ws, seen, lambda out: _lines(out) >= 50) is None
        return started["exec_id"], seen

    exec_id, seen = asyncio.run(before())
    first.kill9()  # mid-stream: the socket dies with the server
    second = docker_servers()
    # the restarted server lists the command under its id, still running
    wait_for(
        lambda: any(
            e["id"] == exec_id and e["running"]
            for e in second.call("GET", f"sessions/{sid}/execs")[1]["execs"]
        ),
        30,
        "the command was not listed after the restart",
    )

    async def after() -> tuple[dict, bytearray, dict | None]:
        ws = await _ws(second, sid)
        await ws.write_message(json.dumps({"type": "attach", "exec_id": exec_id, "offset": len(seen)}))
        attached = json.loads(await ws.read_message())
        rest = bytearray()
        final = await _read_until(ws, rest, lambda out: _lines(out) >= 300)
        await ws.write_message(json.dumps({"type": "kill"}))
        if final is None:
            final = await _read_until(ws, rest, lambda out: False)
        return attached, rest, final

    attached, rest, final = asyncio.run(after())
    assert attached == {"type": "attached", "exec_id": exec_id, "offset": len(seen)}, attached
    numbers = [
        int(n) for n in bytes(seen + rest).decode().split()[:-1]
    ]  # the last line may be cut by the kill
    assert numbers[:5] == [1, 2, 3, 4, 5]
    assert numbers == list(range(1, len(numbers) + 1)), (
        "the output skipped or repeated bytes across the restart"
    )
    assert len(numbers) >= 350
    assert final is not None and final["type"] in ("exit", "error"), final
    # killed: gone from the list, and nothing of it runs in the session
    wait_for(
        lambda: not second.call("GET", f"sessions/{sid}/execs")[1]["execs"],
        30,
        "the killed command is listed",
    )
    status, ps = second.call(
        "POST", f"sessions/{sid}/exec", {"argv": ["ps", "-o", "args"], "timeout_seconds": 30}
    )
    assert status == 200 and not re.search(r"while :", ps["stdout"]), ps


def _running_loops(server: LiveServer, sid: str) -> list[str]:
    status, ps = server.call(
        "POST", f"sessions/{sid}/exec", {"argv": ["ps", "-o", "args"], "timeout_seconds": 30}
    )
    assert status == 200, ps
    return [line for line in ps["stdout"].splitlines() if "while :" in line]


def test_a_killed_servers_command_nobody_attaches_to_is_adopted_at_the_start_and_killed_after_the_grace(
    docker_servers,
):
    grace = "--SandboxApp.live_command_grace_seconds=12"  # the first look must come within it, on a busy machine too
    first = docker_servers(grace)
    _, session = first.call("POST", "sessions", {"ttl_seconds": 600})
    sid = session["id"]

    async def start() -> str:
        ws = await _ws(first, sid)
        await ws.write_message(json.dumps({"type": "start", "argv": COUNT, "timeout_seconds": 240}))
        started = json.loads(await ws.read_message())
        assert await _read_until(ws, bytearray(), lambda out: _lines(out) >= 5) is None
        return started["exec_id"]

    asyncio.run(start())
    first.kill9()
    second = docker_servers(grace)
    assert _running_loops(second, sid), "the command should outlive the killed server"
    # nobody asks the new server about it: it adopted the command at its start, and the grace applies
    wait_for(lambda: not _running_loops(second, sid), 45, "the unwatched command was not killed")


def test_a_second_server_of_the_deployment_lists_a_command_and_an_attach_there_takes_it_over(docker_servers):
    first = docker_servers()
    second = docker_servers()
    _, session = first.call("POST", "sessions", {"ttl_seconds": 600})
    sid = session["id"]

    async def main() -> tuple[dict, bytearray, dict | None, dict]:
        ws_first = await _ws(first, sid)
        await ws_first.write_message(json.dumps({"type": "start", "argv": COUNT, "timeout_seconds": 240}))
        exec_id = json.loads(await ws_first.read_message())["exec_id"]
        seen = bytearray()
        assert await _read_until(ws_first, seen, lambda out: _lines(out) >= 20) is None
        # the second server lists it, read elsewhere
        listed = second.call("GET", f"sessions/{sid}/execs")[1]["execs"]
        assert [(e["id"], e["running"], e["attached"], e.get("elsewhere")) for e in listed] == [
            (exec_id, True, True, True)
        ], listed
        # the first server's client is told it left; the first server does not stop the command
        ws_second = await _ws(second, sid)
        await ws_second.write_message(json.dumps({"type": "attach", "exec_id": exec_id, "offset": 0}))
        attached = json.loads(await ws_second.read_message())
        left = await _read_until(ws_first, seen, lambda out: False, 30)
        everything = bytearray()
        final = await _read_until(ws_second, everything, lambda out: _lines(out) >= len(seen) // 2 + 100)
        await ws_second.write_message(json.dumps({"type": "kill"}))
        return attached, everything, final, left

    attached, everything, final, left = asyncio.run(main())
    assert attached["type"] == "attached" and attached["offset"] == 0, attached
    assert left["type"] == "detached", left
    assert final is None, final  # it ran on until the kill: the first server did not stop it
    numbers = [int(n) for n in bytes(everything).decode().split()[:-1]]
    assert numbers == list(range(1, len(numbers) + 1))
    # not the first server's any more, nor listed once the second has the kill's end (it was sent, not awaited:
    # it may run a moment longer)
    give_up = time.monotonic() + 15
    while (listed := first.call("GET", f"sessions/{sid}/execs")[1]["execs"]) and time.monotonic() < give_up:
        assert [(e["id"], e.get("elsewhere")) for e in listed] == [(attached["exec_id"], True)], listed
        time.sleep(0.2)
    assert listed == [], listed


def test_a_sandboxed_kernels_session_outlives_a_killed_server_stays_listed_and_can_be_shut_down(
    docker_servers,
    tmp_path,
    monkeypatch,
):
    from jupyter_tai_sandbox.kernels import kernelspecs
    from tests.support.docker import python_image
    from tests.support.live_server import Kernel

    python_image().close()
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))  # the servers' own data folder
    kernelspecs.install("sbx-restart", user=True)
    first = docker_servers()
    kernel_id = first.request("POST", "api/kernels", {"name": "sbx-restart"})["id"]
    kernel = Kernel(first, kernel_id)
    try:
        assert kernel.ok("print(1 + 1)").stdout == "2\n"
    finally:
        kernel.client.stop_channels()
    first.kill9()
    second = docker_servers()
    sessions = second.call("GET", "sessions")[1]["sessions"]
    mine = [s for s in sessions if s["consumer"] == f"kernel:{kernel_id}"]
    assert len(mine) == 1, sessions
    sid = mine[0]["id"]
    status, ps = second.call(
        "POST", f"sessions/{sid}/exec", {"argv": ["ps", "-o", "args"], "timeout_seconds": 30}
    )
    assert status == 200 and "ipykernel" in ps["stdout"], ps  # the kernel runs on
    assert second.call("DELETE", f"sessions/{sid}")[0] == 204
    assert second.call("GET", f"sessions/{sid}")[0] == 404


def test_the_python_client_resumes_both_streams_exactly_across_a_restart_by_their_own_offsets(docker_servers):
    from jupyter_tai_sandbox.client import SandboxClient

    both = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i; echo $i >&2; sleep 0.005; done"]
    first = docker_servers()
    _, session = first.call("POST", "sessions", {"ttl_seconds": 600})
    sid = session["id"]
    got = {"stdout": bytearray(), "stderr": bytearray()}

    async def read(remote, lines: int) -> None:
        async with asyncio.timeout(60):
            async for item in remote.output:
                got[item.stream] += item.data
                if min(_lines(got["stdout"]), _lines(got["stderr"])) >= lines:
                    return

    async def before() -> tuple[str, dict[str, int]]:
        client = SandboxClient(first.url, first.token)
        remote = await client.exec_start(sid, both, timeout_seconds=240)
        await read(remote, 40)
        return remote.exec_id, dict(remote.offsets)

    exec_id, offsets = asyncio.run(before())
    assert offsets == {name: len(data) for name, data in got.items()}
    first.kill9()
    second = docker_servers()

    async def after() -> dict[str, int]:
        client = SandboxClient(second.url, second.token)
        remote = await client.attach(sid, exec_id, offsets=offsets)
        resumed = dict(remote.offsets)
        await read(remote, 200)
        await remote.kill()
        return resumed

    assert asyncio.run(after()) == offsets  # the replay starts where each stream was left
    for name, data in got.items():
        numbers = [int(n) for n in bytes(data).decode().split()[:-1]]
        assert numbers == list(range(1, len(numbers) + 1)), (
            f"{name} skipped or repeated bytes across the restart"
        )
        assert len(numbers) >= 190


def test_an_mcp_handle_is_polled_on_after_a_killed_server_from_its_next_offset(docker_servers):
    from tests.support.mcp import data, mcp_client, mcp_url

    first = docker_servers()
    _, session = first.call("POST", "sessions", {"ttl_seconds": 600})
    sid = session["id"]
    script = "for i in $(seq 1 400); do echo $i; sleep 0.01; done"

    async def poll(server: LiveServer, handle: str, offset: int, text: str, until) -> tuple[int, str, dict]:
        headers = {"Authorization": f"token {server.token}"}
        async with mcp_client(mcp_url(server.port, "/"), headers) as client:
            while True:
                answer = data(
                    await client.call_tool(
                        "session_exec_poll", {"handle": handle, "offset": offset, "wait_seconds": 5}
                    )
                )
                assert "skipped_bytes" not in answer, answer
                text += "".join(o["text"] for o in answer["output"])
                offset = answer["next_offset"]
                if until(text, answer):
                    return offset, text, answer

    async def before() -> tuple[str, int, str]:
        headers = {"Authorization": f"token {first.token}"}
        async with mcp_client(mcp_url(first.port, "/"), headers) as client:
            started = data(
                await client.call_tool(
                    "session_exec_start", {"session_id": sid, "script": script, "timeout_seconds": 120}
                )
            )
        offset, text, _ = await poll(first, started["handle"], 0, "", lambda text, _: text.count("\n") >= 30)
        return started["handle"], offset, text

    handle, offset, text = asyncio.run(before())
    first.kill9()
    second = docker_servers()
    _, text, answer = asyncio.run(
        poll(second, handle, offset, text, lambda _, a: not a["running"] and not a["more"])
    )
    assert answer["exit_code"] == 0, answer
    assert text == "".join(f"{i}\n" for i in range(1, 401)), (
        "the poll skipped or repeated output across the restart"
    )


def test_only_a_commands_owner_or_an_admin_takes_it_over_from_the_server_that_reads_it():
    """Two servers in one process (each its provider, so each its own agent connection) over one docker
    session: bob, who may use the session but did not start the command, finds nothing, and the command
    stays with the server that reads it; an admin takes it over."""
    from jupyter_tai_sandbox.contract import ExecRequest, SessionSpec
    from jupyter_tai_sandbox.gate import GatedSandbox
    from jupyter_tai_sandbox.policy import SandboxPolicy
    from jupyter_tai_sandbox.server.execs import LiveCommandPolicy, LiveCommands
    from jupyter_tai_sandbox.sessions import Caller
    from tests.support.docker import docker_client, provider

    docker_client().close()

    async def main() -> None:
        gate, other = (GatedSandbox(provider(pool_size=0), SandboxPolicy()) for _ in range(2))
        session = await gate.create(SessionSpec(consumer="restart-test", network="none"))
        seen_there = await other.get(session.id)
        first, second = LiveCommands(LiveCommandPolicy()), LiveCommands(LiveCommandPolicy())
        try:
            request = ExecRequest(("sleep", "60"), 60)
            ticket = first.ticket("alice", session.id, request, "websocket")
            command = first.add(await session.start(ticket.labelled(request)), ticket)
            for caller in (Caller("bob"), Caller("bob", frozenset({"read"}))):
                with pytest.raises(SandboxNotFoundError):
                    await second.find(command.id, caller, seen_there)
            assert command.running and not command.taken_over
            [held] = [c for c in await session.held_commands() if c.label]
            assert held.attached  # still read by the first registry
            taken = await second.find(command.id, Caller("carol", frozenset({"read", "write"})), seen_there)
            assert taken.running and taken.owner == "alice"
            for _ in range(100):
                if command.final is not None:
                    break
                await asyncio.sleep(0.05)
            assert command.taken_over and command.final == {
                "type": "detached",
                "message": command.error["message"],
            }
            await taken.kill()
        finally:
            await first.close()
            await second.close()
            await session.destroy()
            await gate.close()
            await other.close()

    asyncio.run(main())
