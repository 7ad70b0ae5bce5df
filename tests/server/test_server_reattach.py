"""Commands that survive a closed tab: exec ids, the output ring, attach from an offset, the grace time."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from jupyter_core.utils import ensure_async
from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.auth.identity import IdentityProvider, User
from tornado.httpclient import HTTPClientError

from jupyter_tai_sandbox.sessions import ADMIN_RESOURCE
from tests.support.server import call, exec_call, server_config

GRACE = 2.0


class HeaderUsers(IdentityProvider):
    async def get_user(self, handler):
        user = await ensure_async(super().get_user(handler))
        name = handler.request.headers.get("X-Test-User", "alice")
        return User(username=name) if user is not None else None


class NoAdmin(Authorizer):
    def is_authorized(self, handler, user, action, resource):
        return resource != ADMIN_RESOURCE


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": NoAdmin},
        SandboxApp={"live_command_grace_seconds": GRACE, "live_command_buffer_bytes": 1 << 16},
    )


async def new_session(jp_fetch) -> str:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    assert status == 201, info
    return info["id"]


async def read_until(ws, predicate, seconds=10.0):
    """Binary output and control messages until ``predicate(output)`` holds or the socket closes."""
    out, messages = b"", []
    deadline = time.monotonic() + seconds
    while not predicate(out):
        message = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
        if message is None:
            break
        if isinstance(message, bytes):
            out += message[1:]
        else:
            messages.append(json.loads(message))
    return out, messages


COUNT = ["sh", "-c", "for i in $(seq 1 40); do echo $i; sleep 0.1; done"]


async def test_a_command_runs_on_across_a_disconnect_and_reattaches_from_an_offset(jp_fetch, jp_ws_fetch):
    sid = await new_session(jp_fetch)
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(json.dumps({"type": "start", "argv": COUNT, "timeout_seconds": 30}))
    started = json.loads(await ws.read_message())
    exec_id = started["exec_id"]
    seen, _ = await read_until(ws, lambda out: out.count(b"\n") >= 3)
    ws.close()  # the tab closes
    await asyncio.sleep(0.5)
    _, listed = await call(jp_fetch, "sessions", sid, "execs")
    [entry] = listed["execs"]
    assert (entry["id"], entry["argv"], entry["attached"], entry["running"]) == (exec_id, COUNT, False, True)
    # attach again from the offset already seen: exactly the bytes after it, then live, then the exit
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(json.dumps({"type": "attach", "exec_id": exec_id, "offset": len(seen)}))
    attached = json.loads(await ws.read_message())
    assert attached == {"type": "attached", "exec_id": exec_id, "offset": len(seen)}
    rest, messages = await read_until(ws, lambda out: False, seconds=15)
    assert seen + rest == b"".join(b"%d\n" % i for i in range(1, 41))
    assert messages == [{"type": "exit", "exit_code": 0}]


async def test_attach_from_zero_replays_the_ring(jp_fetch, jp_ws_fetch):
    sid = await new_session(jp_fetch)
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(
        json.dumps(
            {"type": "start", "argv": ["sh", "-c", "echo one; echo two >&2; sleep 30"], "timeout_seconds": 30}
        )
    )
    exec_id = json.loads(await ws.read_message())["exec_id"]
    await read_until(ws, lambda out: b"two" in out)
    ws.close()
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(json.dumps({"type": "attach", "exec_id": exec_id}))
    assert json.loads(await ws.read_message())["offset"] == 0
    frames = [await ws.read_message(), await ws.read_message()]
    assert frames == [b"\x01one\n", b"\x02two\n"]
    await ws.write_message(json.dumps({"type": "kill"}))
    _, messages = await read_until(ws, lambda out: False)
    assert messages == [{"type": "exit", "exit_code": 137}]


async def test_a_detached_command_is_killed_after_the_grace_time(jp_fetch, jp_ws_fetch):
    sid = await new_session(jp_fetch)
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(
        json.dumps(
            {"type": "start", "argv": ["sh", "-c", "echo $$ > pid; exec sleep 60"], "timeout_seconds": 60}
        )
    )
    exec_id = json.loads(await ws.read_message())["exec_id"]
    await asyncio.sleep(0.3)
    ws.close()
    await asyncio.sleep(GRACE / 2)
    assert [e["id"] for e in (await call(jp_fetch, "sessions", sid, "execs"))[1]["execs"]] == [exec_id]
    deadline = time.monotonic() + GRACE + 10
    while (await call(jp_fetch, "sessions", sid, "execs"))[1]["execs"]:
        assert time.monotonic() < deadline, "the detached command outlived its grace time"
        await asyncio.sleep(0.2)
    _, pid = await call(jp_fetch, "sessions", sid, "files", "pid")
    _, state = await exec_call(
        jp_fetch, sid, ["sh", "-c", f"cut -d' ' -f3 /proc/{pid.decode().strip()}/stat 2>/dev/null"], 5
    )
    assert state["stdout"].strip() in ("", "Z")
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(json.dumps({"type": "attach", "exec_id": exec_id}))
    message = json.loads(await ws.read_message())
    assert (message["type"], message["error"]) == ("error", "SandboxNotFoundError")


async def test_another_user_cannot_list_or_attach(jp_fetch, jp_ws_fetch):
    sid = await new_session(jp_fetch)
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    await ws.write_message(json.dumps({"type": "start", "argv": ["sleep", "30"], "timeout_seconds": 30}))
    exec_id = json.loads(await ws.read_message())["exec_id"]
    bob = {"X-Test-User": "bob"}
    assert (await call(jp_fetch, "sessions", sid, "execs", headers=bob))[0] == 404
    with pytest.raises(HTTPClientError) as refused:
        await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws", headers=bob)
    assert refused.value.code == 404
    # bob's own session cannot reach alice's command by its id either
    _, bobs = await call(jp_fetch, "sessions", method="POST", body={}, headers=bob)
    other = await jp_ws_fetch("api", "sandbox", "sessions", bobs["id"], "exec", "ws", headers=bob)
    await other.write_message(json.dumps({"type": "attach", "exec_id": exec_id}))
    message = json.loads(await other.read_message())
    assert (message["type"], message["error"]) == ("error", "SandboxNotFoundError")
    await ws.write_message(json.dumps({"type": "kill"}))
    await read_until(ws, lambda out: False)


async def test_the_client_attaches_from_where_it_left(
    jp_fetch, jp_serverapp, jp_base_url, jp_http_port, jp_auth_header
):
    from jupyter_tai_sandbox.client import SandboxClient
    from jupyter_tai_sandbox.contract import ExitItem, OutputChunk

    token = jp_auth_header["Authorization"].split()[-1]
    async with SandboxClient(f"http://localhost:{jp_http_port}{jp_base_url}", token) as client:
        sid = (await client.create(ttl_seconds=120))["id"]
        remote = await client.exec_start(sid, COUNT, timeout_seconds=30)
        seen = b""
        async for item in remote.output:
            seen += item.data if isinstance(item, OutputChunk) else b""
            if seen.count(b"\n") >= 5:
                break
        remote.disconnect()
        assert [e["id"] for e in await client.execs(sid)] == [remote.exec_id]
        again = await client.attach(sid, remote.exec_id, offset=len(seen))
        assert again.offset == len(seen)
        rest, last = b"", None
        async for item in again.output:
            if isinstance(item, ExitItem):
                last = item
            else:
                rest += item.data
        assert seen + rest == b"".join(b"%d\n" % i for i in range(1, 41)) and last == ExitItem(0)
        await client.destroy(sid)


def test_the_ring_resumes_each_stream_at_its_own_offset_and_keeps_what_it_still_holds():
    from jupyter_tai_sandbox.server.execs import OutputRing

    ring = OutputRing(
        10, start=4, stream_starts={"stdout": 3, "stderr": 1}
    )  # a restart's ring: 3 + 1 before it
    for stream, data in [("stdout", b"abc"), ("stderr", b"XY"), ("stdout", b"de"), ("stderr", b"Z")]:
        ring.append(stream, data)
    assert (ring.start, ring.end, ring.stream_ends) == (4, 12, {"stdout": 8, "stderr": 4})

    def pieces(offset=0, streams=None):
        return [(stream, data) for _, stream, data in ring.since(offset, streams)]

    # by the combined offset: the ring's order
    assert pieces(6) == [("stdout", b"c"), ("stderr", b"XY"), ("stdout", b"de"), ("stderr", b"Z")]
    # by each stream's own offset: exactly the rest of each, wherever the other stream's bytes fell
    assert pieces(streams={"stdout": 5, "stderr": 3}) == [
        ("stdout", b"c"),
        ("stdout", b"de"),
        ("stderr", b"Z"),
    ]
    assert pieces(streams={"stdout": 8, "stderr": 4}) == []
    ring.append("stdout", b"0123456789")  # a chunk as large as the ring: everything older goes
    assert (ring.stream_start("stdout"), ring.stream_start("stderr")) == (8, 4)
    assert pieces(streams={"stdout": 0, "stderr": 0}) == [("stdout", b"0123456789")]
    assert pieces(streams={"stdout": 15, "stderr": 0}) == [("stdout", b"789")]


async def test_an_attach_with_bad_stream_offsets_is_refused_naming_the_field(jp_fetch, jp_ws_fetch):
    sid = await new_session(jp_fetch)
    for offsets in ({"stdin": 0}, {"stdout": -1}, {"stdout": True}, [0, 0]):
        ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
        await ws.write_message(json.dumps({"type": "attach", "exec_id": "exe-0", "offsets": offsets}))
        answer = json.loads(await ws.read_message())
        assert (answer["type"], answer["error"], answer.get("field")) == (
            "error",
            "SandboxRequestError",
            "offsets",
        )
