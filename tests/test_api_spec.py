"""api.yaml is the source of truth: every route the app serves is in it, and responses match it."""

import re
from importlib.resources import files

import pytest
import yaml
from jsonschema import Draft202012Validator, ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from server_support import call, sandbox_app, server_config

SPEC = yaml.safe_load(files("jupyter_tai_sandbox").joinpath("api.yaml").read_text())
REGISTRY = Registry().with_resource("urn:api", Resource.from_contents(SPEC, default_specification=DRAFT202012))
METHODS = ("get", "post", "put", "delete", "patch")


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes")


def template(pattern: str) -> str:
    """A tornado route pattern as an OpenAPI path under /api/sandbox."""
    path = re.sub(r"\(\?:/\(\?P<(\w+)>[^)]*\)\)\?", r"/{\1}", pattern)  # an optional trailing segment
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)
    assert path.startswith("/api/sandbox/"), pattern
    return path.removeprefix("/api/sandbox").rstrip("$")


def response_schema(path: str, method: str, status: int) -> dict | None:
    responses = SPEC["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path} -> {status} is not documented"
    response = responses[str(status)]
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response.get("content", {})
    return content.get("application/json", {}).get("schema")


def check(path: str, method: str, status: int, body) -> None:
    schema = response_schema(path, method, status)
    if schema is not None and isinstance(body, (dict, list)):
        Draft202012Validator(_rooted(schema), registry=REGISTRY).validate(body)


def _rooted(schema: dict) -> dict:
    if "$ref" in schema:
        return {"$ref": "urn:api" + schema["$ref"]}
    return {"$id": "urn:inline", **_rebase(schema)}


def _rebase(node):
    if isinstance(node, dict):
        return {k: ("urn:api" + v if k == "$ref" else _rebase(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rebase(v) for v in node]
    return node


def test_every_registered_route_and_method_is_documented(jp_serverapp):
    app = sandbox_app(jp_serverapp)
    assert app.handlers
    for pattern, handler, *_ in app.handlers:
        path = template(pattern)
        assert path in SPEC["paths"], f"{pattern} is served but not in api.yaml"
        served = {m for m in METHODS if m in vars(handler) or any(m in vars(base) for base in handler.__mro__[:2])}
        documented = {m for m in SPEC["paths"][path] if m in METHODS}
        assert served <= documented, f"{path}: {sorted(served - documented)} not in api.yaml"


def test_the_check_itself_rejects_a_body_off_the_spec():
    with pytest.raises(ValidationError):
        check("/status", "get", 200, {"no": "kind"})
    with pytest.raises(ValidationError):
        check("/sessions/{session_id}/exec", "post", 504, {"error": "SandboxExecTimeoutError", "message": "m"})


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
    await do("/sessions/{session_id}/exec", "post", "sessions", sid, "exec",
             body={"argv": ["echo", "hi"], "timeout_seconds": 5})
    await do("/sessions/{session_id}/exec", "post", "sessions", sid, "exec", body={"argv": []})
    await do("/sessions/{session_id}/exec", "post", "sessions", sid, "exec",
             body={"argv": ["sleep", "5"], "timeout_seconds": 0.5})
    await do("/sessions/{session_id}/files/{path}", "put", "sessions", sid, "files", "a/b.txt", raw=b"x")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "a")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "a/b.txt")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "../x")
    await do("/sessions/{session_id}/files/{path}", "get", "sessions", sid, "files", "missing")
    await do("/sessions/{session_id}", "delete", "sessions", sid)
