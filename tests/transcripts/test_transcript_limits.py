"""A transcript's bounds on a real server (local provider): past ``TranscriptSettings.max_bytes_per_session``
the oldest output, then the oldest commands, are dropped and the notebook says so; ``max_sessions`` forgets
the least recent session; ``keep_after_end_seconds = 0`` forgets a destroyed session at once; ``enabled =
False`` keeps nothing."""

from __future__ import annotations

import asyncio
import time

import nbformat
import pytest
from nbformat.sign import NotebookNotary

from jupyter_tai_sandbox.events import SandboxEvent
from jupyter_tai_sandbox.transcripts import TranscriptSettings
from tests.support.server import call, exec_call, sandbox_app, server_config

LIMIT = 4096


@pytest.fixture
def jp_server_config(tmp_path, request):
    transcripts = {"max_bytes_per_session": LIMIT, "max_sessions": 2, "keep_after_end_seconds": 0}
    transcripts.update(getattr(request, "param", {}))
    return server_config("local", tmp_path / "sandboxes", TranscriptSettings=transcripts)


async def new_session(jp_fetch) -> str:
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300})
    assert status == 201, info
    return info["id"]


async def notebook_of(jp_fetch, sid):
    status, body = await call(jp_fetch, "sessions", sid, "transcript.ipynb")
    assert status == 200, body
    notebook = nbformat.reads(body.decode(), as_version=4)
    nbformat.validate(notebook)
    assert NotebookNotary().check_signature(notebook) is False
    return notebook


def streamed(cell) -> str:
    return "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream")


async def test_past_the_limit_the_oldest_output_goes_and_the_notebook_says_so(jp_fetch):
    sid = await new_session(jp_fetch)
    status, result = await exec_call(
        jp_fetch, sid, ["sh", "-c", "head -c 20000 /dev/zero | tr '\\0' x; echo END"]
    )
    assert status == 200 and result["exit_code"] == 0
    status, result = await exec_call(jp_fetch, sid, ["echo", "after"])
    assert status == 200

    notebook = await notebook_of(jp_fetch, sid)
    meta = notebook.metadata["jupyter_tai_sandbox"]
    assert meta["truncated"] is True and meta["dropped_bytes"] > 20001 - LIMIT
    assert meta["max_bytes_per_session"] == LIMIT and meta["commands"] == 2
    header, big, after = notebook.cells
    assert "**Truncated:**" in header.source and "TranscriptSettings.max_bytes_per_session" in header.source
    note = big.outputs[0]["data"]["text/plain"]
    assert note.startswith("[... the first ") and "of this command's output were dropped" in note
    assert big.metadata["jupyter_tai_sandbox"]["dropped_bytes"] == meta["dropped_bytes"]
    kept = streamed(big)
    assert kept.endswith("xxxxEND\n") and len(kept) + meta["dropped_bytes"] == 20004
    assert len(kept) < LIMIT
    assert streamed(after) == "after\n" and after.outputs[-1]["data"]["text/plain"].startswith("[exit 0, ")

    # many commands: the oldest ended ones go too, counted
    for n in range(30):
        assert (await exec_call(jp_fetch, sid, ["echo", f"n{n}"]))[0] == 200
    notebook = await notebook_of(jp_fetch, sid)
    meta = notebook.metadata["jupyter_tai_sandbox"]
    assert meta["dropped_commands"] > 0 and meta["commands"] == 32 - meta["dropped_commands"]
    assert notebook.cells[-1].source == "echo n29" and streamed(notebook.cells[-1]) == "n29\n"
    assert f"the {meta['dropped_commands']} oldest commands" in notebook.cells[0].source


async def test_sessions_kept_and_forgetting_after_the_end(jp_fetch, jp_serverapp):
    first, second, third = [await new_session(jp_fetch) for _ in range(3)]
    for sid in (first, second, third):
        assert (await exec_call(jp_fetch, sid, ["echo", sid]))[0] == 200
    # max_sessions = 2: the first session's record was forgotten when the third's was made
    assert (await notebook_of(jp_fetch, first)).metadata["jupyter_tai_sandbox"]["commands"] == 0
    notebook = await notebook_of(jp_fetch, third)
    assert [c.source for c in notebook.cells[1:]] == [f"echo {third}"]
    assert notebook.metadata["jupyter_tai_sandbox"]["spec"]["ttl_seconds"] == 300
    # keep_after_end_seconds = 0: a destroyed session's transcript goes with it
    assert (await call(jp_fetch, "sessions", third, method="DELETE"))[0] == 204
    status, body = await call(jp_fetch, "sessions", third, "transcript.ipynb")
    assert status == 404 and body["error"] in ("SandboxNotFoundError", "SandboxSessionGoneError")
    assert sandbox_app(jp_serverapp).transcripts.record(third) is None


@pytest.mark.parametrize("jp_server_config", [{"enabled": False}], indirect=True)
async def test_off_nothing_is_kept_and_no_listener_takes_output(jp_fetch, jp_serverapp):
    app = sandbox_app(jp_serverapp)
    assert app.transcripts not in [listener for listener, _ in app.event_listeners]
    sid = await new_session(jp_fetch)
    assert (await exec_call(jp_fetch, sid, ["echo", "hi"]))[0] == 200
    notebook = await notebook_of(jp_fetch, sid)
    assert len(notebook.cells) == 1 and "Transcripts are off on this server" in notebook.cells[0].source
    assert notebook.metadata["jupyter_tai_sandbox"]["owner"]  # the header from the live session's info


def test_a_long_stream_of_small_chunks_stays_bounded():
    """The listener alone, fed what the gate tells of a terminal writing a byte at a time."""
    transcripts = TranscriptSettings(max_bytes_per_session=1000)

    def tell(kind, **data):
        transcripts(SandboxEvent(kind, "s1", "alice", "user:alice", "local", data=data))

    tell("session.create")
    tell("exec.start", exec=7, argv=["bash"], one_shot=False, pty=True, cwd=None, label=None)
    for i in range(20000):
        tell("exec.output", exec=7, stream="stdout", bytes=b"%d" % (i % 10))
    record = transcripts.record("s1")
    assert record is not None and record.size <= 1000
    command = record.commands[0]
    assert command.running and record.dropped_bytes == 20000 - sum(len(run[1]) for run in command.output)
    assert bytes(command.output[0][1]).endswith(b"56789")
    notebook = transcripts.to_notebook("s1")
    nbformat.validate(nbformat.from_dict(notebook))
    assert (
        notebook["cells"][1]["outputs"][-1]["data"]["text/plain"]
        == "[still running when this transcript was saved]"
    )


@pytest.mark.parametrize("jp_server_config", [{"keep_after_end_seconds": 600}], indirect=True)
async def test_a_reaped_session_is_still_answered_and_says_so(jp_fetch, jp_serverapp):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 1})
    assert status == 201, info
    sid = info["id"]
    assert (await exec_call(jp_fetch, sid, ["echo", "before the end"]))[0] == 200
    await asyncio.sleep(max(0.0, info["expires_at"] - time.time()) + 0.2)
    app = sandbox_app(jp_serverapp)
    await app.reap_once()  # the reaper's own pass (unless its loop was there first)
    record = app.transcripts.record(sid)
    assert record is not None and record.ended is not None
    notebook = await notebook_of(jp_fetch, sid)
    assert notebook.metadata["jupyter_tai_sandbox"]["ended"] == "reaped (its TTL passed)"
    assert "reaped (its TTL passed)" in notebook.cells[0].source
    assert streamed(notebook.cells[1]) == "before the end\n"


def test_a_long_stream_of_large_chunks_keeps_exactly_its_last_bytes():
    """Large chunks (a websocket stream's), mixed with small ones and the other stream: the kept output is
    byte for byte the stream's tail, within the limit, and what was dropped is counted."""
    transcripts = TranscriptSettings(max_bytes_per_session=1 << 20)

    def tell(kind, **data):
        transcripts(SandboxEvent(kind, "s1", "alice", "user:alice", "local", data=data))

    tell("session.create")
    tell("exec.start", exec=1, argv=["cat"], one_shot=False, pty=False, cwd=None, label=None)
    sent = bytearray()
    for i in range(200):
        chunk = bytes([i % 251]) * (256 << 10 if i % 3 else 1000 + i)
        tell("exec.output", exec=1, stream="stdout", bytes=chunk)
        sent += chunk
    tell("exec.output", exec=1, stream="stderr", bytes=b"oops")
    tell("exec.output", exec=1, stream="stdout", bytes=b"end")
    sent += b"end"
    record = transcripts.record("s1")
    assert record is not None and record.size <= 1 << 20
    command = record.commands[0]
    kept = [(stream, bytes(data)) for stream, data in command.output]
    out = b"".join(data for stream, data in kept if stream == "stdout")
    assert kept[-2:] == [("stderr", b"oops"), ("stdout", b"end")]
    assert bytes(sent).endswith(out) and len(out) > 1 << 19
    assert record.dropped_bytes == command.dropped_bytes == len(sent) + 4 - sum(len(data) for _, data in kept)
