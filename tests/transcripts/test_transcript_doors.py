"""A transcript through each door but REST's own route: ``SandboxClient.transcript``, ``%sandbox transcript NAME
[PATH]`` in a kernel of a live server, and the MCP tool ``session_transcript`` (owner rules: another user's
session refused like an unknown one)."""

from __future__ import annotations

import asyncio
import json
import re

import nbformat
import pytest
from nbformat.sign import NotebookNotary

from jupyter_tai_sandbox.client import SandboxClient
from jupyter_tai_sandbox.contract import SandboxNotFoundError
from tests.support.live_server import local_server, magics_kernel
from tests.support.server import server_config


def valid(notebook: dict) -> nbformat.NotebookNode:
    node = nbformat.from_dict(notebook)
    nbformat.validate(node)
    assert NotebookNotary().check_signature(node) is False
    return node


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    yield from local_server(tmp_path_factory, "transcript-server")


def test_the_client_and_the_magic(live, tmp_path):
    gen = magics_kernel(live)
    k = next(gen)
    try:
        k.ok("%sandbox new tr")
        k.ok("%%sandbox --session tr\necho hello from the cell\necho warned >&2")
        sid = next(s["id"] for s in live.call("GET", "sessions")[1]["sessions"])

        async def fetch():
            client = SandboxClient(live.url, live.token)
            try:
                found = await client.transcript(sid)
                with pytest.raises(SandboxNotFoundError):
                    await client.transcript("sbx-never-made")
                return found
            finally:
                client.close()

        notebook = valid(asyncio.run(fetch()))
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert any("echo hello from the cell" in c.source for c in code), [c.source for c in code]
        cell = next(c for c in code if "echo hello from the cell" in c.source)
        streams = {o["name"]: o["text"] for o in cell.outputs if o["output_type"] == "stream"}
        assert streams == {"stdout": "hello from the cell\n", "stderr": "warned\n"}

        run = k.ok("%sandbox transcript tr")
        said = re.search(r"-> (\S+\.ipynb) \(it opens untrusted\)", run.stdout)
        assert said and "session 'tr'" in run.stdout, run.stdout
        path = said.group(1)
        assert path.endswith("/tr-transcript.ipynb")
        with open(path, encoding="utf-8") as f:
            saved = valid(json.load(f))
        assert saved.metadata["jupyter_tai_sandbox"]["session"] == sid

        run = k.ok(f"%sandbox transcript tr {tmp_path}")
        assert (tmp_path / "tr-transcript.ipynb").is_file(), run.stdout
        run = k.ok(f"%sandbox transcript tr {tmp_path / 'mine.ipynb'}")
        assert valid(json.loads((tmp_path / "mine.ipynb").read_text()))["cells"]
        assert f"-> {tmp_path / 'mine.ipynb'}" in run.stdout

        assert "no session named 'nope'" in k.run("%sandbox transcript nope").error_line()
        assert (
            "no local folder" in k.run(f"%sandbox transcript tr {tmp_path / 'no' / 'x.ipynb'}").error_line()
        )
        k.ok("%sandbox rm tr")
        # right after the destroy the transcript is still there (TranscriptSettings.keep_after_end_seconds)
        k.ok(f"%sandbox transcript {sid} {tmp_path / 'after.ipynb'}")
        after = valid(json.loads((tmp_path / "after.ipynb").read_text()))
        assert after.metadata["jupyter_tai_sandbox"]["ended"] == "destroyed"
    finally:
        next(gen, None)


class TestMCP:
    @pytest.fixture
    def jp_server_config(self, tmp_path, monkeypatch):
        from tests.support.mcp import AdminOnlyAdmin, HeaderUsers

        monkeypatch.setenv("TAI_TRANSCRIPT_SECRET", "mcp-s3cret-Value")
        return server_config(
            "local",
            tmp_path / "sandboxes",
            ServerApp={"identity_provider_class": HeaderUsers, "authorizer_class": AdminOnlyAdmin},
            SandboxPolicy={
                "scrub_transcript": True,
                "credentials": {"user:alice": ["TAI_TRANSCRIPT_SECRET"]},
            },
        )

    async def test_session_transcript(
        self, jp_serverapp, http_server, jp_http_port, jp_base_url, jp_auth_header
    ):
        from tests.support.mcp import data, mcp_client, mcp_url, refusal

        url = mcp_url(jp_http_port, jp_base_url)
        alice_headers = {**jp_auth_header, "X-Test-User": "alice"}
        bob_headers = {**jp_auth_header, "X-Test-User": "bob"}
        async with mcp_client(url, alice_headers) as alice, mcp_client(url, bob_headers) as bob:
            tools = {tool.name: tool for tool in (await alice.list_tools()).tools}
            assert tools["session_transcript"].input_schema["required"] == ["session_id"]
            sid = data(await alice.call_tool("session_create", {}))["id"]
            ran = data(
                await alice.call_tool(
                    "session_exec", {"session_id": sid, "script": 'echo "k=$TAI_TRANSCRIPT_SECRET"; exit 2'}
                )
            )
            assert ran["exit_code"] == 2 and ran["stdout"] == "k=[scrubbed]\n"
            answer = data(await alice.call_tool("session_transcript", {"session_id": sid}))
            assert (answer["session_id"], answer["filename"], answer["commands"], answer["truncated"]) == (
                sid,
                f"{sid}-transcript.ipynb",
                1,
                False,
            )
            notebook = valid(answer["notebook"])
            assert "mcp-s3cret-Value" not in json.dumps(answer)
            cell = notebook.cells[1]
            assert cell.source == 'echo "k=$TAI_TRANSCRIPT_SECRET"; exit 2'
            assert cell.outputs[0]["text"] == "k=[scrubbed]\n"
            assert cell.outputs[-1]["data"]["text/plain"].startswith("[exit 2, ")

            theirs = refusal(await bob.call_tool("session_transcript", {"session_id": sid}))
            assert theirs["error"] == "SandboxNotFoundError"
            data(await alice.call_tool("session_destroy", {"session_id": sid}))
            after = data(await alice.call_tool("session_transcript", {"session_id": sid}))
            assert valid(after["notebook"]).metadata["jupyter_tai_sandbox"]["ended"] == "destroyed"
            theirs = refusal(await bob.call_tool("session_transcript", {"session_id": sid}))
            assert theirs["error"] == "SandboxNotFoundError"
