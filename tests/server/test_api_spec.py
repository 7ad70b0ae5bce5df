"""api.yaml is the source of truth: every route the app serves is in it, and responses match it."""

import pytest
from jsonschema import Draft202012Validator, ValidationError

from tests.support.api_spec import METHODS, REGISTRY, SPEC, check, rooted, template
from tests.support.server import call, sandbox_app, server_config


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes")


def test_every_registered_route_and_method_is_documented(jp_serverapp):
    app = sandbox_app(jp_serverapp)
    assert app.handlers
    for pattern, handler, *_ in app.handlers:
        path = template(pattern)
        assert path in SPEC["paths"], f"{pattern} is served but not in api.yaml"
        served = {
            m for m in METHODS if m in vars(handler) or any(m in vars(base) for base in handler.__mro__[:2])
        }
        documented = {m for m in SPEC["paths"][path] if m in METHODS}
        assert served <= documented, f"{path}: {sorted(served - documented)} not in api.yaml"


def test_the_check_itself_rejects_a_body_off_the_spec():
    with pytest.raises(ValidationError):
        check("/status", "get", 200, {"no": "kind"})
    with pytest.raises(ValidationError):
        check(
            "/sessions/{session_id}/exec", "post", 504, {"error": "SandboxExecTimeoutError", "message": "m"}
        )


async def test_responses_validate_against_the_spec(jp_fetch):
    async def do(path, method, *parts, **kwargs):
        status, body = await call(jp_fetch, *parts, method=method.upper(), **kwargs)
        check(path, method, status, body)
        return status, body

    await do("/status", "get", "status")
    _status, info = await do("/sessions", "post", "sessions", body={"ttl_seconds": 60, "env": {"A": "1"}})
    sid = info["id"]
    await do("/sessions", "post", "sessions", body={"bogus": 1})
    await do("/sessions", "get", "sessions")
    await do("/sessions/{session_id}", "get", "sessions", sid)
    await do("/sessions/{session_id}", "get", "sessions", "sbx-0000000000000000")
    await do("/sessions/{session_id}", "patch", "sessions", sid, body={"ttl_seconds": 120})
    await do("/sessions/{session_id}", "patch", "sessions", sid, body={"ttl_seconds": 10**9})
    await do("/sessions/{session_id}", "patch", "sessions", sid, body={"ttl": 1})
    await do("/sessions/{session_id}", "patch", "sessions", "sbx-0000000000000000", body={"ttl_seconds": 120})
    await do(
        "/sessions/{session_id}/exec",
        "post",
        "sessions",
        sid,
        "exec",
        body={"argv": ["echo", "hi"], "timeout_seconds": 5},
    )
    await do("/sessions/{session_id}/exec", "post", "sessions", sid, "exec", body={"argv": []})
    await do(
        "/sessions/{session_id}/exec",
        "post",
        "sessions",
        sid,
        "exec",
        body={"argv": ["sleep", "5"], "timeout_seconds": 0.5},
    )
    await do("/sessions/{session_id}/files/{path}", "put", "sessions", sid, "files", "a/b.txt", raw=b"x")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "a")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "a/b.txt")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "../x")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "missing")
    await do("/sessions/{session_id}", "delete", "sessions", sid)


# ------------------------------------------------------------------ the error statuses

WS_SERVER = {"$ref": "#/components/schemas/WsServerMessage"}


def check_schema(ref: dict, value) -> None:
    Draft202012Validator(rooted(ref), registry=REGISTRY).validate(value)


class NoAdmin:
    """An Authorizer: every user may use sessions, nobody holds the admin resource."""

    def __new__(cls):
        from jupyter_server.auth.authorizer import Authorizer

        class _NoAdmin(Authorizer):
            def is_authorized(self, handler, user, action, resource):
                return resource != "jupyter_tai_sandbox:admin"

        return _NoAdmin


class TestErrorBodies:
    """Each status of the error table, answered by the server, is documented for its route and its body fits."""

    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config(
            "local",
            tmp_path / "sandboxes",
            ServerApp={"authorizer_class": NoAdmin()},
            SandboxPolicy={
                "max_sessions_per_user": 3,
                "max_timeout_seconds": 30.0,
                "max_ttl_seconds": 7200.0,
            },
            SandboxApp={
                "max_output_bytes": 1000,
                "max_upload_bytes": 1000,
                "presets_path": str(tmp_path / "presets.json"),
            },
        )

    async def do(self, jp_fetch, path, method, *parts, expect, **kwargs):
        status, body = await call(jp_fetch, *parts, method=method.upper(), **kwargs)
        assert status == expect, (method, parts, status, body)
        check(path, method, status, body)
        return body

    async def test_every_status_and_body_is_in_the_spec(self, jp_fetch):
        do = self.do
        status = await do(jp_fetch, "/status", "get", "status", expect=200)
        assert "credentials" not in status["policy"]  # not an admin
        assert status["policy"]["max_sessions_per_user"] == 3
        info = await do(
            jp_fetch,
            "/sessions",
            "post",
            "sessions",
            expect=201,
            body={"durability": "persistent", "workspace_key": "held"},
        )
        assert info["owner"] and info["spec"]["owner"] == info["owner"]
        sid = info["id"]
        other = await do(
            jp_fetch,
            "/sessions",
            "post",
            "sessions",
            expect=201,
            body={"durability": "persistent", "workspace_key": "held"},
        )
        exec_path = "/sessions/{session_id}/exec"
        # 400 naming the field
        body = await do(
            jp_fetch,
            exec_path,
            "post",
            "sessions",
            sid,
            "exec",
            expect=400,
            body={"argv": ["true"], "timeout_seconds": 31},
        )
        assert (body["error"], body["field"]) == ("SandboxRequestError", "timeout_seconds")
        body = await do(
            jp_fetch,
            exec_path,
            "post",
            "sessions",
            sid,
            "exec",
            expect=400,
            body={"argv": ["true"], "timeout_seconds": 1, "env": {"1BAD": "x"}},
        )
        assert body["field"] == "env"
        body = await do(jp_fetch, "/sessions", "post", "sessions", expect=400, body={"ttl_seconds": 10**400})
        # 400 naming an operation the provider lacks (local cannot pause)
        body = await do(
            jp_fetch, "/sessions/{session_id}/{action}", "post", "sessions", sid, "pause", expect=400
        )
        assert (body["error"], body["operation"]) == ("SandboxUnsupportedError", "pause")
        body = await do(jp_fetch, "/sessions/{session_id}/fork", "post", "sessions", sid, "fork", expect=400)
        assert (body["error"], body["operation"]) == ("SandboxUnsupportedError", "fork")
        # 403: another consumer without admin write
        body = await do(
            jp_fetch, "/sessions", "post", "sessions", expect=403, body={"consumer": "someone-else"}
        )
        assert body["error"] == "SandboxForbiddenError"
        # 409: the workspace is held by the other session
        body = await do(
            jp_fetch,
            "/sessions/{session_id}",
            "delete",
            "sessions",
            sid,
            expect=409,
            params={"remove_workspace": "1"},
        )
        assert body["error"] == "SandboxConflictError"
        # 413: too large an upload
        body = await do(
            jp_fetch,
            "/sessions/{session_id}/files/{path}",
            "put",
            "sessions",
            sid,
            "files",
            "big",
            expect=413,
            raw=b"x" * 2000,
        )
        assert body["error"] == "UploadTooLargeError"
        # 504 with the byte counts
        body = await do(
            jp_fetch,
            exec_path,
            "post",
            "sessions",
            sid,
            "exec",
            expect=504,
            body={"argv": ["sh", "-c", "echo hi; sleep 5"], "timeout_seconds": 0.3},
        )
        assert body["stdout_bytes"] == 3
        # 429: the third session fills alice's quota of 3
        third = await do(jp_fetch, "/sessions", "post", "sessions", expect=201, body={})
        body = await do(jp_fetch, "/sessions", "post", "sessions", expect=429, body={})
        assert body["error"] == "SandboxQuotaError"
        # 403 at the tools' fence, 422 for a tool's bad input, 404 for an unknown tool
        body = await do(
            jp_fetch,
            "/tools/{name}",
            "put",
            "tools",
            "counter",
            expect=403,
            body={"description": "d", "input_schema": {"type": "object"}, "binding": {"argv": ["wc"]}},
        )
        assert body["error"] == "ToolAccessDeniedError"
        body = await do(
            jp_fetch,
            "/tools/{name}/run",
            "post",
            "tools",
            "sandbox_status",
            "run",
            expect=422,
            body={"bogus": 1},
        )
        assert body["error"] == "ToolInputError"
        await do(jp_fetch, "/tools/{name}/run", "post", "tools", "sandbox_status", "run", expect=200, body={})
        await do(
            jp_fetch,
            "/tools/{name}/run",
            "post",
            "tools",
            "sandbox_exec",
            "run",
            expect=403,
            body={"argv": ["true"]},
        )
        await do(jp_fetch, "/tools/{name}", "get", "tools", "no-such-tool", expect=404)
        await do(jp_fetch, "/tools", "get", "tools", expect=200)
        await do(jp_fetch, "/sessions/{session_id}/execs", "get", "sessions", sid, "execs", expect=200)
        for s in (third["id"], other["id"], sid):
            await do(jp_fetch, "/sessions/{session_id}", "delete", "sessions", s, expect=204)

    async def test_output_past_max_output_bytes_is_413_with_counts(self, jp_fetch):
        _, info = await call(jp_fetch, "sessions", method="POST", body={})
        try:
            body = await self.do(
                jp_fetch,
                "/sessions/{session_id}/exec",
                "post",
                "sessions",
                info["id"],
                "exec",
                expect=413,
                body={"argv": ["sh", "-c", "head -c 5000 /dev/zero"], "timeout_seconds": 10},
            )
            assert (
                body["error"] == "OutputTooLargeError" and body["stdout_bytes"] + body["stderr_bytes"] > 1000
            )
        finally:
            await call(jp_fetch, "sessions", info["id"], method="DELETE")

    async def test_websocket_messages_are_in_the_spec(self, jp_fetch, jp_ws_fetch):
        import json

        _, info = await call(jp_fetch, "sessions", method="POST", body={})
        for start, last in (
            ({"argv": ["echo", "hi"], "timeout_seconds": 5}, "exit"),
            ({"argv": ["true"], "timeout_seconds": 5, "rows": 0}, "error"),
            ({"argv": ["true"], "timeout_seconds": 5, "cols": "abc"}, "error"),
            ({"argv": ["sleep", "5"], "timeout_seconds": 0.3}, "error"),
        ):
            check_schema(
                {"$ref": "#/components/schemas/WsStart"},
                {"type": "start", **{k: v for k, v in start.items() if k not in ("rows", "cols")}},
            )
            ws = await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws")
            await ws.write_message(json.dumps({"type": "start", **start}))
            texts = []
            while (message := await ws.read_message()) is not None:
                if isinstance(message, str):
                    texts.append(json.loads(message))
            ws.close()
            for message in texts:
                check_schema(WS_SERVER, message)
            assert texts[-1]["type"] == last, texts
            if "rows" in start or "cols" in start:
                assert texts == [texts[-1]] and texts[-1]["field"] in ("rows", "cols"), texts
        await call(jp_fetch, "sessions", info["id"], method="DELETE")


class TestUnavailableBodies:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("dokcer", tmp_path / "sandboxes")

    async def test_a_provider_that_cannot_start_answers_503_on_every_route(self, jp_fetch):
        for path, method, parts, body in (
            ("/status", "get", ("status",), None),
            ("/sessions", "get", ("sessions",), None),
            ("/sessions", "post", ("sessions",), {}),
            ("/sessions/{session_id}", "get", ("sessions", "sbx-1"), None),
            ("/sessions/{session_id}", "delete", ("sessions", "sbx-1"), None),
            (
                "/sessions/{session_id}/exec",
                "post",
                ("sessions", "sbx-1", "exec"),
                {"argv": ["true"], "timeout_seconds": 1},
            ),
            ("/sessions/{session_id}/files/{path}", "get", ("sessions", "sbx-1", "files", "a"), None),
            ("/tools/{name}/run", "post", ("tools", "sandbox_exec", "run"), {"argv": ["true"]}),
        ):
            status, reply = await call(jp_fetch, *parts, method=method.upper(), body=body)
            assert (status, reply["error"]) == (503, "SandboxUnavailableError"), (path, reply)
            check(path, method, status, reply)
