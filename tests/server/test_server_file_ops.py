"""Delete, rename and make-folder over REST: confined to the workspace, owned, typed errors."""

from __future__ import annotations

import pytest

from tests.support.server import call, server_config


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes")


async def test_make_rename_and_delete(jp_fetch):
    _, info = await call(jp_fetch, "sessions", method="POST", body={})
    sid = info["id"]
    assert (await call(jp_fetch, "sessions", sid, "files", "a/b", method="POST", body={"type": "directory"}))[
        0
    ] == 201
    assert (await call(jp_fetch, "sessions", sid, "files", "a/b/x.txt", method="PUT", raw=b"hello"))[0] == 201
    status, moved = await call(
        jp_fetch, "sessions", sid, "files", "a/b/x.txt", method="PATCH", body={"path": "c/y.txt"}
    )
    assert (status, moved) == (200, {"path": "c/y.txt"})
    assert await call(jp_fetch, "sessions", sid, "files", "c/y.txt") == (200, b"hello")
    assert (await call(jp_fetch, "sessions", sid, "files", "a/b/x.txt"))[0] == 404
    # the target exists: 409, nothing moved
    await call(jp_fetch, "sessions", sid, "files", "d.txt", method="PUT", raw=b"d")
    status, body = await call(
        jp_fetch, "sessions", sid, "files", "d.txt", method="PATCH", body={"path": "c/y.txt"}
    )
    assert (status, body["error"]) == (409, "SandboxConflictError")
    assert (await call(jp_fetch, "sessions", sid, "files", "a", method="DELETE"))[0] == 204
    assert (await call(jp_fetch, "sessions", sid, "files", "a/b"))[0] == 404
    status, body = await call(jp_fetch, "sessions", sid, "files", "nothing-here", method="DELETE")
    assert (status, body["error"]) == (404, "SandboxNotFoundError")
    await call(jp_fetch, "sessions", sid, method="DELETE")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "", None),
        ("DELETE", "..", None),
        ("DELETE", "../outside", None),
        ("PATCH", "x.txt", {"path": "../../escaped"}),
        ("PATCH", "x.txt", {"path": 5}),
        ("POST", "../new", {"type": "directory"}),
        ("POST", "dir", {"type": "file"}),
    ],
)
async def test_a_path_outside_or_a_bad_body_is_refused(jp_fetch, method, path, body):
    _, info = await call(jp_fetch, "sessions", method="POST", body={})
    sid = info["id"]
    await call(jp_fetch, "sessions", sid, "files", "x.txt", method="PUT", raw=b"x")
    status, answer = await call(
        jp_fetch, "sessions", sid, "files", *([path] if path else []), method=method, body=body
    )
    assert 400 <= status < 500, answer
    assert answer["error"] in ("SandboxPathError", "SandboxRequestError", "SandboxNotFoundError"), answer
    assert await call(jp_fetch, "sessions", sid, "files", "x.txt") == (200, b"x")
    await call(jp_fetch, "sessions", sid, method="DELETE")
