"""``GET /api/sandbox/sessions/{id}/transcript.ipynb`` on a real server (local and docker): one-shot commands
over REST, interactive and terminal (pty) ones over the exec websocket, then the notebook read with nbformat:
valid, untrusted, its cells the commands and their output, a credential scrubbed, another user 404, still
there for the owner right after a destroy."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbformat.sign import NotebookNotary

from jupyter_tai_sandbox.transcripts import command_source, notebook_filename
from tests.support.server import call, exec_call, read_all, server_config
from tests.support.users import AdminOnlyAdmin, HeaderUsers, as_user

SECRET = "s3cr3t-Transcript-Value"
USERS = {"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin}


@pytest.fixture
def jp_server_config(provider, tmp_path, monkeypatch):
    monkeypatch.setenv("TAI_TRANSCRIPT_SECRET", SECRET)
    return server_config(
        provider,
        tmp_path / "sandboxes",
        ServerApp=USERS,
        SandboxPolicy={"scrub_transcript": True, "credentials": {"user:alice": ["TAI_TRANSCRIPT_SECRET"]}},
        SandboxApp={"live_command_grace_seconds": 0},
    )


async def transcript(jp_fetch, session_id, user="alice"):
    """(status, headers, body bytes) of the route."""
    from tornado.httpclient import HTTPClientError

    try:
        response = await jp_fetch(
            "api", "sandbox", "sessions", session_id, "transcript.ipynb", headers=as_user(user)
        )
    except HTTPClientError as e:
        response = e.response
    return response.code, response.headers, response.body


async def interactive(jp_ws_fetch, session_id, **start):
    ws = await jp_ws_fetch("api", "sandbox", "sessions", session_id, "exec", "ws", headers=as_user("alice"))
    await ws.write_message(json.dumps({"type": "start", "timeout_seconds": 30, **start}))
    return await read_all(ws)


def texts(cell, name):
    return "".join(o["text"] for o in cell["outputs"] if o["output_type"] == "stream" and o["name"] == name)


def exit_note(cell):
    notes = [o for o in cell["outputs"] if o["output_type"] == "display_data"]
    assert cell["outputs"][-1] is notes[-1]
    return notes[-1]["data"]["text/plain"]


def test_a_cell_shows_the_script_of_sh_c_else_the_quoted_argv():
    assert command_source(["sh", "-c", "echo hi; ls | wc -l"]) == "echo hi; ls | wc -l"
    assert command_source(["bash", "-lc", "make test"]) == "make test"
    assert command_source(["echo", "a b", "$HOME", "it's"]) == "echo 'a b' '$HOME' 'it'\"'\"'s'"
    assert command_source(["sh", "-c", "x", "extra"]) == "sh -c x extra"
    assert notebook_filename("sbx-1a2b") == "sbx-1a2b-transcript.ipynb"
    assert notebook_filename('a/b"c') == "a_b_c-transcript.ipynb"


async def test_commands_and_their_output_as_a_valid_untrusted_scrubbed_notebook(
    jp_fetch, jp_ws_fetch, provider
):
    status, info = await call(
        jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300}, headers=as_user("alice")
    )
    assert status == 201, info
    sid = info["id"]
    secret_script = 'echo "token=$TAI_TRANSCRIPT_SECRET"; echo oops >&2; exit 3'
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", secret_script], headers=as_user("alice"))
    assert status == 200 and result["exit_code"] == 3, result
    assert result["stdout"] == "token=[scrubbed]\n"
    status, result = await exec_call(jp_fetch, sid, ["echo", "a b"], headers=as_user("alice"))
    assert status == 200 and result["exit_code"] == 0, result

    out, err, final, _ = await interactive(
        jp_ws_fetch,
        sid,
        argv=["sh", "-c", "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 0"],
    )
    assert (out, err, final["exit_code"]) == (b"one\nthree\n", b"two\n", 0)
    out, _, final, _ = await interactive(
        jp_ws_fetch, sid, argv=["sh", "-c", 'printf "tty:%s\\n" "$TAI_TRANSCRIPT_SECRET"'], pty=True
    )
    assert final["exit_code"] == 0 and b"tty:[scrubbed]" in out

    status, headers, body = await transcript(jp_fetch, sid)
    assert status == 200, body
    assert headers["Content-Type"] == "application/x-ipynb+json"
    assert headers["Content-Disposition"] == f'attachment; filename="{sid}-transcript.ipynb"'
    assert SECRET.encode() not in body
    notebook = nbformat.reads(body.decode(), as_version=4)
    nbformat.validate(notebook)
    assert NotebookNotary().check_signature(notebook) is False
    assert "signature" not in notebook.metadata and "trusted" not in json.dumps(notebook.metadata)

    meta = notebook.metadata["jupyter_tai_sandbox"]
    assert (meta["session"], meta["owner"], meta["consumer"], meta["provider"]) == (
        sid,
        "alice",
        "user:alice",
        provider,
    )
    assert meta["commands"] == 4 and meta["truncated"] is False
    assert meta["spec"]["owner"] == "alice" and meta["spec"]["env"] == ["TAI_TRANSCRIPT_SECRET"]

    header, *cells = notebook.cells
    assert header.cell_type == "markdown"
    assert f"`{sid}`" in header.source and "`alice`" in header.source and f"`{provider}`" in header.source
    assert [c.cell_type for c in cells] == ["code"] * 4
    assert all(c.execution_count is None for c in cells)

    one_shot, echo, streamed, terminal = cells
    assert one_shot.source == secret_script
    assert texts(one_shot, "stdout") == "token=[scrubbed]\n" and texts(one_shot, "stderr") == "oops\n"
    assert exit_note(one_shot).startswith("[exit 3, ")
    assert one_shot.metadata["jupyter_tai_sandbox"]["mode"] == "one-shot"
    assert one_shot.metadata["jupyter_tai_sandbox"]["exit_code"] == 3
    assert one_shot.metadata["jupyter_tai_sandbox"]["stdout_bytes"] == len(f"token={SECRET}\n")

    assert echo.source == "echo 'a b'" and texts(echo, "stdout") == "a b\n"

    assert streamed.source.startswith("echo one;")
    assert [(o["name"], o["text"]) for o in streamed.outputs if o["output_type"] == "stream"] == [
        ("stdout", "one\n"),
        ("stderr", "two\n"),
        ("stdout", "three\n"),
    ]  # interleaved as they came
    assert exit_note(streamed).startswith("[exit 0, ")
    assert streamed.metadata["jupyter_tai_sandbox"]["mode"] == "interactive"

    assert terminal.metadata["jupyter_tai_sandbox"]["mode"] == "terminal"
    assert terminal.source.startswith("# a terminal (pty)")
    assert "tty:[scrubbed]" in texts(terminal, "stdout")

    # another user: 404, as every session route; the owner still reads it right after the destroy
    status, _, body = await transcript(jp_fetch, sid, user="bob")
    assert status == 404 and json.loads(body)["error"] == "SandboxNotFoundError"
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE", headers=as_user("alice"))
    assert status == 204
    status, _, body = await transcript(jp_fetch, sid)
    assert status == 200, body
    after = nbformat.reads(body.decode(), as_version=4)
    nbformat.validate(after)
    assert after.metadata["jupyter_tai_sandbox"]["ended"] == "destroyed" and len(after.cells) == 5
    assert "destroyed" in after.cells[0].source
    status, _, body = await transcript(jp_fetch, sid, user="bob")
    assert status == 404 and json.loads(body)["error"] == "SandboxNotFoundError"
    status, _, _ = await transcript(jp_fetch, "sbx-never-made")
    assert status == 404
