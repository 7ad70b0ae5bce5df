"""The REST API on a real jupyter_server, for every provider."""

import base64
import json
import os

import pytest
from tornado.httpclient import AsyncHTTPClient

from tests.support.server import call, exec_call, fetch_raw_path, sandbox_app, server_config

pytestmark = [pytest.mark.slow(51)]

BIG = 120 << 20  # more than tornado's 100 MiB default body buffer: only a streamed route copes


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes")


async def new_session(jp_fetch, **spec):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 300, **spec})
    assert status == 201, info
    return info["id"]


async def test_status_names_the_provider_and_policy(jp_fetch, provider):
    status, body = await call(jp_fetch, "status")
    assert status == 200
    assert body["kind"] == provider and body["policy"]["isolation"] == "none"


async def test_session_lifecycle_over_rest(jp_fetch, provider):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60, "consumer": "nb"})
    assert status == 201, info
    assert (info["kind"], info["consumer"], info["durability"]) == (provider, "nb", "ephemeral")
    sid = info["id"]
    status, listing = await call(jp_fetch, "sessions")
    assert sid in [s["id"] for s in listing["sessions"]]
    status, again = await call(jp_fetch, "sessions", sid)
    assert status == 200 and again["id"] == sid and 0 < again["seconds_left"] <= 60
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", "cat; echo err >&2; exit 3"], stdin="hello")
    assert status == 200 and (result["exit_code"], result["stdout"], result["stderr"]) == (
        3,
        "hello",
        "err\n",
    )
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE")
    assert status == 204
    status, body = await call(jp_fetch, "sessions", sid)
    # its owner is told why (a SandboxNotFoundError's subclass: issue 48)
    assert status == 404 and body["error"] == "SandboxSessionGoneError" and body["reason"] == "destroyed", (
        body
    )


async def test_consumer_defaults_to_the_user(jp_fetch):
    status, info = await call(jp_fetch, "sessions", method="POST", body={})
    assert status == 201 and info["consumer"]
    await call(jp_fetch, "sessions", info["id"], method="DELETE")


async def test_exec_is_binary_safe_with_base64(jp_fetch):
    sid = await new_session(jp_fetch)
    data = bytes(range(256)) * 16
    status, result = await exec_call(
        jp_fetch, sid, ["cat"], stdin_b64=base64.b64encode(data).decode(), encoding="base64"
    )
    assert status == 200 and base64.b64decode(result["stdout"]) == data
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", "printf '\\377ok'"])
    assert result["stdout"] == "\ufffdok"  # utf-8 encoding replaces what is not text
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_timeout_is_504_with_byte_counts(jp_fetch):
    sid = await new_session(jp_fetch)
    status, body = await exec_call(
        jp_fetch, sid, ["sh", "-c", "head -c 10 /dev/zero; head -c 4 /dev/zero >&2; exec sleep 30"], 1
    )
    assert status == 504
    assert body["error"] == "SandboxExecTimeoutError"
    assert (body["stdout_bytes"], body["stderr_bytes"]) == (10, 4)
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_files_upload_list_download(jp_fetch):
    sid = await new_session(jp_fetch)
    status, body = await call(
        jp_fetch, "sessions", sid, "files", "data/in.bin", method="PUT", raw=b"\x00\x01binary"
    )
    assert status == 201 and body == {"path": "data/in.bin", "size": 8}
    status, listing = await call(jp_fetch, "sessions", sid, "files", "data")
    assert status == 200 and [(e["name"], e["type"], e["size"]) for e in listing["entries"]] == [
        ("in.bin", "file", 8)
    ]
    status, root = await call(jp_fetch, "sessions", sid, "files", "")
    assert "data" in [e["name"] for e in root["entries"]]
    status, content = await call(jp_fetch, "sessions", sid, "files", "data/in.bin")
    assert status == 200 and content == b"\x00\x01binary"
    status, result = await exec_call(jp_fetch, sid, ["cat", "data/in.bin"], encoding="base64")
    assert base64.b64decode(result["stdout"]) == b"\x00\x01binary"
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_a_file_larger_than_the_body_buffer_streams_both_ways(
    jp_fetch, jp_http_port, jp_base_url, jp_serverapp
):
    sid = await new_session(jp_fetch)
    block = os.urandom(1 << 20)

    async def produce(write):
        for _ in range(BIG >> 20):
            await write(block)

    status, body = await call(
        jp_fetch,
        "sessions",
        sid,
        "files",
        "big.bin",
        method="PUT",
        body_producer=produce,
        request_timeout=300,
    )
    assert status == 201 and body["size"] == BIG
    received = 0
    mismatch = []

    def take(chunk):
        nonlocal received
        start = received % len(block)
        expected = (block * 2)[start : start + len(chunk)] if len(chunk) <= len(block) else None
        if expected is not None and chunk != expected:
            mismatch.append(received)
        received += len(chunk)

    # pytest-jupyter's client stops at 100 MiB even when streaming: use one that takes more
    client = AsyncHTTPClient(force_instance=True, max_body_size=BIG * 2)
    url = f"http://localhost:{jp_http_port}{jp_base_url}api/sandbox/sessions/{sid}/files/big.bin"
    token = jp_serverapp.identity_provider.token
    response = await client.fetch(
        url, headers={"Authorization": f"token {token}"}, streaming_callback=take, request_timeout=300
    )
    client.close()
    assert response.code == 200 and received == BIG and not mismatch
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_delete_keeps_a_persistent_workspace_unless_asked(jp_fetch):
    sid = await new_session(jp_fetch, durability="persistent", workspace_key="rest-keep")
    await call(jp_fetch, "sessions", sid, "files", "kept.txt", method="PUT", raw=b"kept")
    assert (await call(jp_fetch, "sessions", sid, method="DELETE"))[0] == 204
    sid = await new_session(jp_fetch, durability="persistent", workspace_key="rest-keep")
    assert (await call(jp_fetch, "sessions", sid, "files", "kept.txt")) == (200, b"kept")
    assert (await call(jp_fetch, "sessions", sid, method="DELETE", params={"remove_workspace": "1"}))[
        0
    ] == 204
    sid = await new_session(jp_fetch, durability="persistent", workspace_key="rest-keep")
    status, body = await call(jp_fetch, "sessions", sid, "files", "kept.txt")
    assert status == 404 and body["error"] == "SandboxNotFoundError"
    await call(jp_fetch, "sessions", sid, method="DELETE", params={"remove_workspace": "1"})


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("raw", "message", "error"),
    [
        (b"{not json", "not valid JSON", "SandboxRequestError"),
        (b"[1, 2]", "JSON object", "SandboxRequestError"),
        (b'{"imag": "typo"}', "unknown session spec field", "SandboxSpecRejectedError"),
        (b'{"ttl_seconds": "soon"}', "ttl_seconds", "SandboxSpecRejectedError"),
        (b'{"isolation": "paranoid"}', "unknown isolation", "SandboxSpecRejectedError"),
        (b'{"durability": "persistent"}', "workspace_key", "SandboxSpecRejectedError"),
        (b'{"env": {"A": 1}}', "string", "SandboxSpecRejectedError"),
        (b'{"image": "\xff\xfe"}', "UTF-8", "SandboxRequestError"),
    ],
)
async def test_bad_session_bodies_are_400_with_a_typed_error(jp_fetch, raw, message, error):
    before = {s["id"] for s in (await call(jp_fetch, "sessions"))[1]["sessions"]}
    status, body = await call(jp_fetch, "sessions", method="POST", raw=raw)
    assert status == 400, body
    assert body["error"] == error and message in body["message"]
    after = {s["id"] for s in (await call(jp_fetch, "sessions"))[1]["sessions"]}
    assert after <= before  # nothing was created


async def test_a_spec_the_provider_cannot_honour_is_400(jp_fetch):
    status, body = await call(jp_fetch, "sessions", method="POST", body={"isolation": "vm"})
    assert status == 400 and body["error"] == "SandboxSpecRejectedError" and "vm" in body["message"]


@pytest.mark.parametrize(
    "exec_body",
    [
        {"timeout_seconds": 5},
        {"argv": [], "timeout_seconds": 5},
        {"argv": "echo hi", "timeout_seconds": 5},
        {"argv": ["echo", 1], "timeout_seconds": 5},
        {"argv": ["echo"]},
        {"argv": ["echo"], "timeout_seconds": -1},
        {"argv": ["echo"], "timeout_seconds": "5"},
        {"argv": ["echo"], "timeout_seconds": 5, "stdin_b64": "***"},
        {"argv": ["echo"], "timeout_seconds": 5, "stdin": "a", "stdin_b64": "YQ=="},
        {"argv": ["echo"], "timeout_seconds": 5, "shell": True},
        {"argv": ["echo"], "timeout_seconds": 5, "encoding": "latin-1"},
        {"argv": ["echo"], "timeout_seconds": 5, "cwd": "../.."},
    ],
)
async def test_bad_exec_bodies_are_400(jp_fetch, exec_body):
    sid = await new_session(jp_fetch)
    status, body = await call(jp_fetch, "sessions", sid, "exec", method="POST", body=exec_body)
    assert status == 400, body
    assert body["error"] in ("SandboxRequestError", "SandboxPathError") and body["message"]
    if body["error"] == "SandboxRequestError":
        assert body["field"] in exec_body or body["field"] in ("argv", "timeout_seconds"), body
    await call(jp_fetch, "sessions", sid, method="DELETE")


@pytest.mark.parametrize(
    ("method", "suffix"),
    [("GET", ()), ("DELETE", ()), ("POST", ("exec",)), ("GET", ("files", "")), ("PUT", ("files", "x.txt"))],
)
async def test_unknown_session_is_404_on_every_route(jp_fetch, method, suffix):
    body = {"argv": ["true"], "timeout_seconds": 5} if suffix == ("exec",) else None
    status, reply = await call(
        jp_fetch, "sessions", "sbx-0000000000000000", *suffix, method=method, body=body
    )
    assert status == 404 and reply["error"] == "SandboxNotFoundError"


@pytest.mark.parametrize(
    "path",
    [
        "files/../outside.txt",
        "files/%2e%2e/outside.txt",
        "files/a/%2E%2E/%2e%2e/outside.txt",
        "files//etc/passwd",
        "files/%2Fetc%2Fpasswd",
    ],
)
async def test_traversal_in_file_paths_is_refused(jp_fetch, jp_http_port, jp_base_url, jp_serverapp, path):
    sid = await new_session(jp_fetch)
    token = jp_serverapp.identity_provider.token
    for method, body in (("GET", None), ("PUT", b"escaped")):
        status, reply = await fetch_raw_path(
            jp_http_port, jp_base_url, f"api/sandbox/sessions/{sid}/{path}", token, method=method, body=body
        )
        assert status in (400, 404), (method, path, status, reply)
        if isinstance(reply, dict):
            assert reply["error"] in ("SandboxPathError", "SandboxNotFoundError")
        else:
            assert status == 404  # tornado refused the path before the handler
    status, result = await exec_call(jp_fetch, sid, ["sh", "-c", "ls ../outside.txt /etc/escaped 2>&1; true"])
    assert "escaped" not in result["stdout"] or "No such" in result["stdout"]
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_symlinks_out_of_the_workspace_are_refused(jp_fetch):
    sid = await new_session(jp_fetch)
    await exec_call(jp_fetch, sid, ["sh", "-c", "ln -s / out && ln -s /etc/passwd pw"])
    for parts in (("out", "etc", "passwd"), ("pw",), ("out",)):
        status, body = await call(jp_fetch, "sessions", sid, "files", "/".join(parts))
        assert status == 400 and body["error"] == "SandboxPathError", (parts, body)
    status, body = await call(jp_fetch, "sessions", sid, "files", "out/tmp/planted", method="PUT", raw=b"x")
    assert status == 400 and body["error"] == "SandboxPathError"
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_an_oversized_upload_is_413_and_loses_nothing(jp_fetch, jp_serverapp):
    sid = await new_session(jp_fetch)
    await call(jp_fetch, "sessions", sid, "files", "keep.txt", method="PUT", raw=b"original")
    sandbox_app(jp_serverapp).max_upload_bytes = 1000
    status, body = await call(jp_fetch, "sessions", sid, "files", "keep.txt", method="PUT", raw=b"x" * 5000)
    assert status == 413 and body["error"] == "UploadTooLargeError" and "1000" in body["message"]

    async def chunked(write):  # no Content-Length: the limit is enforced as the body streams
        for _ in range(5):
            await write(b"y" * 1000)

    status, body = await call(
        jp_fetch, "sessions", sid, "files", "keep.txt", method="PUT", body_producer=chunked
    )
    assert status == 413 and body["error"] == "UploadTooLargeError"
    assert (await call(jp_fetch, "sessions", sid, "files", "keep.txt")) == (200, b"original")
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_non_utf8_exec_body_is_400(jp_fetch):
    sid = await new_session(jp_fetch)
    status, body = await call(jp_fetch, "sessions", sid, "exec", method="POST", raw=b'{"argv": ["\xff"]}')
    assert status == 400 and body["error"] == "SandboxRequestError"
    await call(jp_fetch, "sessions", sid, method="DELETE")


async def test_errors_never_leak_a_traceback(jp_fetch):
    _status, body = await call(jp_fetch, "sessions", method="POST", raw=b"{")
    assert set(body) == {"error", "message"} and "Traceback" not in json.dumps(body)


async def test_pause_and_resume_over_rest_or_a_typed_refusal_naming_the_operation(jp_fetch, provider):
    sid = await new_session(jp_fetch)
    status, body = await call(jp_fetch, "sessions", sid, "pause", method="POST")
    if provider == "local":  # the local provider cannot freeze host processes as a unit
        assert (
            status == 400 and body["error"] == "SandboxUnsupportedError" and body["operation"] == "pause"
        ), body
    else:
        assert status == 200 and body["paused"] is True, body
        status, refused = await exec_call(jp_fetch, sid, ["true"])
        assert status == 409 and refused["error"] == "SandboxConflictError", refused
        status, again = await call(jp_fetch, "sessions", sid)
        assert status == 200 and again["paused"] is True
        status, body = await call(jp_fetch, "sessions", sid, "resume", method="POST")
        assert status == 200 and body["paused"] is False, body
        status, result = await exec_call(jp_fetch, sid, ["echo", "on"])
        assert status == 200 and result["stdout"] == "on\n"
    await call(jp_fetch, "sessions", sid, method="DELETE")
