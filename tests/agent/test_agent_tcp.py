"""TCP connections into the session through the agent (network none: the agent dials inside)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from jupyter_tai_sandbox.agent import AgentError
from tests.support.agent import run

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]


async def _echo_server(client, port: int):
    server = await client.start(["nc", "-ll", "-p", str(port), "-e", "cat"])
    for _ in range(100):
        try:
            probe = await client.connect_tcp(port)
        except AgentError as e:
            assert e.code == "ECONNREFUSED"
            await asyncio.sleep(0.05)
            continue
        await probe.kill()
        await probe.release()
        return server
    raise AssertionError("the echo server never listened")


def test_a_tcp_connection_inside_the_session_echoes_exactly(session):
    payload = hashlib.sha256(b"tcp").digest() * ((4 << 20) // 32)

    async def go():
        client = await session.client()
        try:
            server = await _echo_server(client, 8000)
            conn = await client.connect_tcp(8000)

            async def feed():
                await conn.write(payload)
                await conn.close_stdin()

            _, (out, _, status) = await asyncio.gather(feed(), conn.collect())
            assert out == payload and status.code == 0
            await conn.release()
            await server.kill()
        finally:
            await client.close()

    run(go())


def test_a_refused_port_is_a_typed_error_and_kill_closes_a_connection(session):
    async def go():
        client = await session.client()
        try:
            with pytest.raises(AgentError) as e:
                await client.connect_tcp(1)
            assert e.value.code == "ECONNREFUSED"
            server = await _echo_server(client, 8001)
            conn = await client.connect_tcp(8001)
            await conn.write(b"ping\n")
            assert await conn.read() == ("stdout", b"ping\n")
            await conn.kill()
            status = await conn.wait()
            assert status.code == 0 and status.killed
            assert await conn.read() is None
            await server.kill()
        finally:
            await client.close()

    run(go())
