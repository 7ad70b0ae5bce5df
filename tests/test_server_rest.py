import pytest
from server_support import call


@pytest.fixture
def jp_server_config(tmp_path):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_tai_sandbox": True}},
        "SandboxApp": {"provider": "local"},
        "SandboxPolicy": {"isolation": "none"},
        "LocalSandbox": {"root": str(tmp_path / "sandboxes")},
    }


async def test_status_names_the_provider_and_policy(jp_fetch):
    status, body = await call(jp_fetch, "status")
    assert status == 200
    assert body["kind"] == "local" and body["policy"]["isolation"] == "none"


async def test_session_lifecycle_over_rest(jp_fetch):
    status, info = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
    assert status == 201, info
    sid = info["id"]
    status, listing = await call(jp_fetch, "sessions")
    assert [s["id"] for s in listing["sessions"]] == [sid]
    status, result = await call(jp_fetch, "sessions", sid, "exec", method="POST",
                                body={"argv": ["sh", "-c", "cat; echo err >&2; exit 3"], "stdin": "hello",
                                      "timeout_seconds": 10})
    assert status == 200 and result["exit_code"] == 3 and result["stdout"] == "hello" and result["stderr"] == "err\n"
    status, _ = await call(jp_fetch, "sessions", sid, method="DELETE")
    assert status == 204
    status, body = await call(jp_fetch, "sessions", sid)
    assert status == 404 and body["error"] == "SandboxNotFoundError"
