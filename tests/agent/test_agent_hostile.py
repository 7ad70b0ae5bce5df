"""Hostile session code against the session agent, and malformed frames on its channel."""

from __future__ import annotations

import asyncio
import json
import signal
import struct
from pathlib import Path

import pytest

from jupyter_tai_sandbox.agent import AgentConnectionLost, protocol
from jupyter_tai_sandbox.agent.client import AGENT_PATH
from tests.support.agent import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]


def test_session_code_cannot_reach_the_agent_or_its_channel(session):
    """/proc/<agent>/{fd,environ,mem,exe,root}, ptrace, the socket and the relay binary: all refused, for the
    agent (PID 1) and for the live `connect` relay carrying this very test's channel."""

    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["/bin/hostile"], env={"SECRET_SEEN": "no"})
            out, err, status = await cmd.collect()
            assert status.code == 0, err
            lines = out.decode().splitlines()
            assert lines[-1] == "DONE"
            attempts = lines[:-1]
            relay_pids = {line.split()[2] for line in attempts if line.split()[1] == "pid"} - {"1"}
            assert relay_pids, f"the test's own relay was not probed: {attempts}"
            for name in ("environ", "mem", "exe", "ptrace attach", "ptrace seize", "root"):
                assert any(name in line for line in attempts), name
            assert any(" fd " in line for line in attempts) or any("fd dir" in line for line in attempts)
            assert any(line.startswith("REFUSED socket") for line in attempts)
            assert any(line.startswith("REFUSED relay") for line in attempts)
            assert "CONTROL ptrace child: ok" in attempts, (
                "ptrace must work on a dumpable process for the test to mean much"
            )
            opened = [line for line in attempts if not line.startswith(("REFUSED", "CONTROL"))]
            assert opened == [], opened
            assert (await (await client.start(["true"])).wait()).code == 0  # the agent is unharmed
        finally:
            await client.close()

    run(go())


def test_session_code_cannot_take_or_remove_the_agents_socket(session):
    """The socket is abstract: no file to remove or replace, and its name cannot be bound while the agent
    lives (were it, `connect` would still refuse a listener that is not the agent: trustedPeer)."""

    async def go():
        client = await session.client()
        try:
            fake = await client.start(["sh", "-c", "rm -rf /.tai/run; /bin/hostile fake-agent"])
            out, _, status = await fake.collect()
            assert (
                status.code == 1 and out.startswith(b"LISTEN FAILED") and b"address already in use" in out
            ), out
            second = await asyncio.wait_for(session.client(), 20)  # a new connection still reaches the agent
            assert (await (await second.start(["true"])).wait()).code == 0
            await second.close()
        finally:
            await client.close()

    run(go())


# it waits for its stdin's end, so its start is answered (through the relay it kills) before it kills
KILL_RELAYS = (
    "read -r _; for d in /proc/[0-9]*; do p=${d#/proc/}; "
    '[ "$(cat $d/comm 2>/dev/null)" = agent ] && [ "$p" != 1 ] && kill -9 "$p"; done; echo done'
)


def test_session_code_killing_the_relay_is_loud_and_the_commands_live_on(session):
    async def go():
        client = await session.client()
        try:
            sleeper = await client.start(["sleep", "100"])
            killer = await client.start(["sh", "-c", KILL_RELAYS])
            await killer.close_stdin()

            async def until_lost():
                while True:
                    await client.ping()
                    await asyncio.sleep(0.05)

            with pytest.raises(AgentConnectionLost):
                await asyncio.wait_for(until_lost(), 10)
            with pytest.raises(AgentConnectionLost):
                await asyncio.wait_for(sleeper.wait(), 10)
        finally:
            await client.close()
        again = await session.client()
        try:
            listed = {c["id"]: c for c in await again.list()}
            assert listed[sleeper.id]["running"]
            assert listed[killer.id]["exit"]["code"] == 0
            out, _, _ = await (await again.attach(killer.id)).collect()
            assert out == b"done\n"
            await (await again.attach(sleeper.id)).kill()
        finally:
            await again.close()

    run(go())


def test_signals_from_session_code_do_not_stop_the_agent_silently(session):
    async def go():
        client = await session.client()
        try:
            for sig in ("HUP", "INT", "QUIT", "USR1", "USR2", "PIPE", "ALRM", "SEGV", "KILL", "STOP"):
                status = await (await client.start(["kill", f"-{sig}", "1"])).wait()
                assert status.code == 0, sig
            await client.ping()
            assert (await (await client.start(["true"])).wait()).code == 0
        finally:
            await client.close()

    run(go())


def test_the_agent_dying_fails_every_call_promptly(session):
    async def go():
        client = await session.client()
        running = await client.start(["sleep", "100"])
        await asyncio.to_thread(session.container.kill, signal.SIGKILL)
        with pytest.raises(AgentConnectionLost):
            await asyncio.wait_for(running.wait(), 10)
        with pytest.raises(AgentConnectionLost):
            await asyncio.wait_for(client.start(["true"]), 10)
        with pytest.raises(AgentConnectionLost):
            await asyncio.wait_for(running.read(), 10)
        await client.close()

    run(go())


async def _raw(session) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "docker",
        "exec",
        "-i",
        session.name,
        AGENT_PATH,
        "connect",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _closes_after(session, data: bytes) -> list[protocol.Frame]:
    """Send raw bytes; return the frames the agent answered before closing the connection (it must close)."""
    proc = await _raw(session)
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        rest = await asyncio.wait_for(proc.stdout.read(), 10)  # EOF: the agent closed the connection
        await asyncio.wait_for(proc.wait(), 10)
        return protocol.FrameDecoder().feed(rest)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        proc.stdin.close()


HELLO = protocol.encode_json(protocol.HELLO, 0, {"version": protocol.PROTOCOL_VERSION})


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(struct.pack(">IBI", 2, 1, 0), id="length-below-header"),
        pytest.param(struct.pack(">IBI", (1 << 20) + 6, 1, 0), id="oversize"),
        pytest.param(struct.pack(">IBI", 0xFFFFFFFF, 1, 0), id="huge"),
        pytest.param(protocol.encode(protocol.START, 1, b'{"argv":["true"]}'), id="before-hello"),
        pytest.param(protocol.encode_json(protocol.HELLO, 0, {"version": 99}), id="wrong-version"),
        pytest.param(HELLO + protocol.encode(protocol.START, 1, b"{not json"), id="bad-json"),
        pytest.param(
            HELLO + protocol.encode(protocol.START, 1, b'{"argv":["true"],"evil":1}'), id="unknown-field"
        ),
        pytest.param(HELLO + protocol.encode(0x7F, 1, b""), id="unknown-type"),
        pytest.param(HELLO + protocol.encode(protocol.CREDIT, 1, b"\0"), id="short-credit"),
        pytest.param(HELLO + protocol.encode(protocol.KILL, 1, b"x"), id="kill-with-payload"),
    ],
)
def test_malformed_frames_close_the_connection(session, data):
    async def go():
        keeper = await session.client()
        try:
            survivor = await keeper.start(["sleep", "100"])
            frames = await _closes_after(session, data)
            assert frames and frames[-1].type == protocol.ERROR
            assert frames[-1].json()["code"] in ("EPROTO", "EPROTONOSUPPORT")
            listed = {c["id"]: c for c in await keeper.list()}
            assert listed[survivor.id]["running"]  # other connections and commands are untouched
            await survivor.kill()
        finally:
            await keeper.close()

    run(go())


def test_stdin_beyond_the_granted_window_closes_the_connection(session):
    async def go():
        proc = await _raw(session)
        start = protocol.encode_json(protocol.START, 5, {"argv": ["sleep", "100"]})
        proc.stdin.write(HELLO + start)
        decoder = protocol.FrameDecoder()
        frames: list[protocol.Frame] = []
        while not any(f.type == protocol.STARTED for f in frames):
            frames += decoder.feed(await proc.stdout.read(65536))
        window = next(f for f in frames if f.type == protocol.STARTED).json()["stdin_window"]
        chunk = b"x" * (512 << 10)
        pipe_max = int(
            Path("/proc/sys/fs/pipe-max-size").read_text()
        )  # the stdin pipe may take this much unread
        for _ in range((window + pipe_max) // len(chunk) + 1):
            proc.stdin.write(protocol.encode(protocol.STDIN, 5, chunk))
        rest = await asyncio.wait_for(proc.stdout.read(), 10)
        frames = decoder.feed(rest)
        assert frames[-1].type == protocol.ERROR and frames[-1].json()["code"] == "EPROTO"
        await proc.wait()
        client = await session.client()
        try:
            (cmd,) = [c for c in await client.list() if c["id"] == 5]
            assert cmd["running"]
            await (await client.attach(5)).kill()
        finally:
            await client.close()

    run(go())


def test_list_reply_is_json_with_what_a_restarted_server_needs(session):
    async def go():
        client = await session.client()
        try:
            cmd = await client.start(["sh", "-c", "echo hi; sleep 100"])
            assert await cmd.read() == ("stdout", b"hi\n")
            (entry,) = [c for c in await client.list() if c["id"] == cmd.id]
            assert entry["running"] and entry["argv"][0] == "sh" and entry["pid"] == cmd.pid
            assert entry["output"] == {"stdout": [0, 3], "stderr": [0, 0]}
            json.dumps(entry)
            await cmd.kill()
        finally:
            await client.close()

    run(go())
