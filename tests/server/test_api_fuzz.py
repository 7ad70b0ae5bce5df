"""Property-based fuzzing over api.yaml against a live test server (local provider).

* REST: schemathesis generates requests from every route's schema, valid ones and ones
  that break it (wrong types, missing fields, huge numbers, odd strings), a fixed number
  per route and mode, derandomized so CI sees the same requests every run. Every answer
  must be a documented status whose JSON body fits the spec, never a 5xx (but the documented
  504 of a command that met its deadline, however tiny), never a hang
  (each request has its own timeout; the whole run a time budget). A valid body must not
  be refused as malformed (400 SandboxRequestError), so the spec is no looser than the server.
* Hostile values the generator does not reach on its own (10**400, NUL bytes, lone
  surrogates, oversized argv, 300-character names, long paths) are explicit cases.
* The exec websocket: start messages generated from ``WsStart`` and broken one field at a
  time; each connection must end with exactly one ``exit`` or ``error`` message, promptly.

Requests go through real sockets to pytest-jupyter's server (``jp_http_port``), from a
worker thread, so the server keeps running on the test's loop.

A server bug this file finds while it is open goes in ``KNOWN_BUGS`` (the fuzz run then
tolerates and reports it) with a reproducer marked ``xfail(strict=True)``. The bugs it found
so far are fixed; their reproducers stay as plain regression cases (``FOUND_BUGS``,
``WS_FOUND_BUGS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import pytest
import requests
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.support.server import server_config

schemathesis = pytest.importorskip("schemathesis", reason='pip install -e ".[test]" (schemathesis)')
hypothesis_jsonschema = pytest.importorskip("hypothesis_jsonschema", reason='pip install -e ".[test]"')
GenerationMode = schemathesis.GenerationMode

SPEC = yaml.safe_load(files("jupyter_tai_sandbox").joinpath("api.yaml").read_text())
REGISTRY = Registry().with_resource(
    "urn:api", Resource.from_contents(SPEC, default_specification=DRAFT202012)
)

#: examples per route and generation mode (positive: fits the schema; negative: breaks it)
EXAMPLES = 8
#: the REST fuzz run's time budget, shared out evenly between the route/mode pairs (each stops
#: generating when its share is spent, so a slow machine runs fewer examples, never longer)
REST_BUDGET_SECONDS = 50.0
#: one request longer than this is a hang
REQUEST_TIMEOUT = 20.0
#: the websocket cases: how many starts generated from WsStart, and how long one connection may take
WS_EXAMPLES = 25
WS_TIMEOUT = 15.0
#: the commands run by the fuzz (random argv) cannot run longer than this
MAX_TIMEOUT_SECONDS = 3.0

#: routes the generator does not call: the websocket (a GET without an upgrade is not the
#: route; its messages are fuzzed below) and MCP's event stream (a GET that stays open by design)
SKIPPED = {("GET", "/sessions/{session_id}/exec/ws"), ("GET", "/mcp")}

PRESET = {
    "description": "Echo a text back.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "binding": {"argv": ["cat"], "stdin": {"field": "text"}, "timeout_seconds": 2},
}


@dataclass(frozen=True)
class KnownBug:
    """A server bug the fuzz run has found: matched by route and a pattern of the answer or the log."""

    method: str
    path: str
    pattern: str
    reason: str


#: Server bugs found by this file (reported, each with a strict-xfail reproducer below).
KNOWN_BUGS: list[KnownBug] = []


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config(
        "local",
        tmp_path / "sandboxes",
        SandboxPolicy={"max_timeout_seconds": MAX_TIMEOUT_SECONDS, "max_sessions_per_user": 500},
        SandboxApp={
            "presets_path": str(tmp_path / "presets.json"),
            "max_upload_bytes": 1 << 20,
            "max_output_bytes": 1 << 20,
        },
    )


# ------------------------------------------------------------------ checking one answer


def _rooted(schema: dict) -> dict:
    def rebase(node):
        if isinstance(node, dict):
            return {k: ("urn:api" + v if k == "$ref" else rebase(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [rebase(v) for v in node]
        return node

    return {"$id": "urn:inline", **rebase(schema)}


def documented(method: str, path: str, status: int) -> dict | bool | None:
    """The JSON schema of a documented answer, None when it has none, False when undocumented."""
    responses = SPEC["paths"][path][method.lower()]["responses"]
    response = responses.get(str(status))
    if response is None:
        return False
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return response.get("content", {}).get("application/json", {}).get("schema")


@dataclass
class Finding:
    kind: str
    method: str
    path: str
    request: str
    status: int | None
    body: str
    log: list[str] = field(default_factory=list)

    def known(self) -> KnownBug | None:
        text = self.body + "\n" + "\n".join(self.log)
        for bug in KNOWN_BUGS:
            if bug.method == self.method and bug.path == self.path and re.search(bug.pattern, text):
                return bug
        return None

    def __str__(self) -> str:
        log = "".join(f"\n      log: {line}" for line in dict.fromkeys(self.log[-4:]))
        return f"[{self.kind}] {self.method} {self.path}: {self.request}\n   -> {self.status} {self.body[:400]}{log}"


class ErrorLog(logging.Handler):
    """The server's error-level log lines (what a 5xx left behind)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self._lines_lock = threading.Lock()  # not ``lock``: logging.Handler holds that one around emit()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage().splitlines()[0][:300] if record.getMessage() else ""
        if record.exc_info and record.exc_info[1] is not None:
            line += f" | {type(record.exc_info[1]).__name__}: {str(record.exc_info[1])[:200]}"
        with self._lines_lock:
            self.lines.append(line)

    def take(self) -> list[str]:
        with self._lines_lock:
            lines, self.lines = self.lines, []
        return lines


def judge(
    method: str,
    path: str,
    request: str,
    status: int,
    content: bytes,
    content_type: str,
    log: ErrorLog,
    positive: bool,
) -> list[Finding]:
    """Everything wrong with one answer."""
    text = content[:2000].decode("utf-8", "replace")
    lines = log.take()
    found = []

    def add(kind: str) -> None:
        found.append(Finding(kind, method, path, request, status, text, lines))

    if status >= 500 and not _deadline_answer(status, content):
        add("server error")
        return found
    schema = documented(method, path, status)
    if schema is False:
        add("undocumented status")
        return found
    body: Any = None
    if content_type.startswith("application/json") and content:
        try:
            body = json.loads(content)
        except ValueError:
            add("invalid JSON")
            return found
    if schema and body is not None:
        errors = list(Draft202012Validator(_rooted(schema), registry=REGISTRY).iter_errors(body))
        if errors:
            found.append(
                Finding(
                    "body off the spec",
                    method,
                    path,
                    request,
                    status,
                    f"{errors[0].message[:300]} in {text[:300]}",
                    lines,
                )
            )
    if (
        positive
        and status == 400
        and isinstance(body, dict)
        and body.get("error") == "SandboxRequestError"
        and not _operator_limit(body.get("message", ""))
    ):
        add("valid by the spec, refused as malformed")
    return found


def _deadline_answer(status: int, content: bytes) -> bool:
    """A 504 SandboxExecTimeoutError is the documented answer of a command that met its deadline (a
    valid ``timeout_seconds`` may be 1e-200), not a server fault; its body is checked like any other."""
    if status != 504:
        return False
    try:
        return json.loads(content).get("error") == "SandboxExecTimeoutError"
    except (ValueError, AttributeError):
        return False


def _operator_limit(message: str) -> bool:
    """Refusals the spec can only describe in words: operator maxima, the argv+env byte bound, surrogates, a
    program the session cannot start (the fuzz's random argv[0] rarely names one that exists), a TTL whose
    end is already past (PATCH's description)."""
    words = ("maximum", "the limit is", "lone surrogate", "could not start", "would have ended the session")
    return any(word in message for word in words)


# ------------------------------------------------------------------ the live server


class Server:
    """Requests to the test server from a worker thread, with the state the fuzz needs."""

    def __init__(self, port: int, base_url: str, headers: dict[str, str]) -> None:
        self.root = f"http://localhost:{port}{base_url.rstrip('/')}/api/sandbox"
        self.http = requests.Session()
        self.http.headers.update(headers)
        # one connection per request: an answer given before the body was read (a refused upload)
        # closes the connection, and a kept-alive reuse would then fail the next, innocent request
        self.http.headers["Connection"] = "close"
        self._sid: str | None = None

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", REQUEST_TIMEOUT)
        return self.http.request(method, self.root + path, **kwargs)

    def live_session(self) -> str:
        """A session that exists now (the fuzz may have destroyed the last one)."""
        if self._sid is None or self.request("GET", f"/sessions/{self._sid}").status_code != 200:
            answer = self.request("POST", "/sessions", json={"ttl_seconds": 600})
            assert answer.status_code == 201, answer.text
            self._sid = answer.json()["id"]
            put = self.request("PUT", f"/sessions/{self._sid}/files/known/file.txt", data=b"hello\n")
            assert put.status_code == 201, put.text
        return self._sid

    def ensure_preset(self) -> None:
        if self.request("GET", "/tools/echo_text").status_code != 200:
            answer = self.request("PUT", "/tools/echo_text", json=PRESET, params={"replace": "1"})
            assert answer.status_code in (200, 201), answer.text


@pytest.fixture
def error_log(jp_serverapp):
    handler = ErrorLog()
    loggers = [
        jp_serverapp.log,
        logging.getLogger("tornado.application"),
        logging.getLogger("tornado.general"),
    ]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture
def server(jp_serverapp, jp_fetch, jp_http_port, jp_base_url, jp_auth_header):
    # jp_fetch: its http_server fixture is what serves the bound port
    s = Server(jp_http_port, jp_base_url, jp_auth_header)
    yield s
    s.http.close()


def report(findings: list[Finding]) -> None:
    """Fail on unknown findings; print the known ones (each has its own strict-xfail test)."""
    known = [(f, f.known()) for f in findings]
    for finding, bug in known:
        if bug is not None:
            print(f"known server bug ({bug.reason}):\n  {finding}")
    unknown = [f for f, bug in known if bug is None]
    assert not unknown, f"{len(unknown)} finding(s):\n" + "\n".join(str(f) for f in unknown[:15])


# ------------------------------------------------------------------ REST, generated by schemathesis


def _operations() -> list[Any]:
    schema = schemathesis.openapi.from_dict(SPEC)
    return [
        op
        for op in (r.ok() for r in schema.get_all_operations())
        if (op.method.upper(), op.path) not in SKIPPED
    ]


def _describe(case: Any) -> str:
    body = case.body if not isinstance(case.body, bytes) else case.body[:80]
    text = json.dumps(body, default=repr, ensure_ascii=True) if body is not None else ""
    query = f"?{case.query}" if case.query else ""
    return f"{case.formatted_path}{query} {text[:500]}"


def _fuzz_one_route(
    server: Server,
    log: ErrorLog,
    op: Any,
    mode: Any,
    stop_at: float,
    findings: list[Finding],
    counts: dict[str, int],
) -> None:
    label = f"{op.method.upper()} {op.path} {mode.value}"

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=op.as_strategy(generation_mode=mode),
        real=st.booleans(),
        tool=st.sampled_from([None, "sandbox_status", "echo_text", "sandbox_exec"]),
        where=st.sampled_from([None, "known", "known/file.txt", "known/", "."]),
    )
    def one(case: Any, real: bool, tool: str | None, where: str | None) -> None:
        if time.monotonic() > stop_at:
            return
        params = case.path_parameters or {}
        if real and "session_id" in params:
            params["session_id"] = server.live_session()
            if where is not None and "path" in params:
                params["path"] = where
        if tool is not None and "name" in params and op.method.upper() != "DELETE":
            params["name"] = tool
            server.ensure_preset()
        request = _describe(case)
        try:
            answer = case.call(base_url=server.root, session=server.http, timeout=REQUEST_TIMEOUT)
        except requests.Timeout:
            findings.append(
                Finding(
                    "hang",
                    op.method.upper(),
                    op.path,
                    request,
                    None,
                    f"no answer within {REQUEST_TIMEOUT} s",
                    log.take(),
                )
            )
            return
        except requests.ConnectionError as e:
            findings.append(
                Finding(
                    "connection dropped", op.method.upper(), op.path, request, None, str(e)[:300], log.take()
                )
            )
            return
        counts[label] = counts.get(label, 0) + 1
        content_type = (answer.headers.get("content-type") or [""])[0]
        findings.extend(
            judge(
                op.method.upper(),
                op.path,
                request,
                answer.status_code,
                answer.content,
                content_type,
                log,
                mode == GenerationMode.POSITIVE,
            )
        )

    with contextlib.suppress(Unsatisfiable):  # a route without parameters or body has no negative cases
        one()


def fuzz_rest(server: Server, log: ErrorLog) -> tuple[list[Finding], dict[str, int]]:
    findings: list[Finding] = []
    counts: dict[str, int] = {}
    server.ensure_preset()
    operations = _operations()
    share = REST_BUDGET_SECONDS / (2 * len(operations))
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_one_route(server, log, op, mode, time.monotonic() + share, findings, counts)
    return findings, counts


@pytest.mark.timeout(180)
async def test_rest_routes_never_answer_5xx_or_hang(server, error_log):
    started = time.monotonic()
    findings, counts = await asyncio.to_thread(fuzz_rest, server, error_log)
    print(
        f"REST fuzz: {sum(counts.values())} requests over {len(counts)} route/mode pairs "
        f"in {time.monotonic() - started:.1f} s: {counts}"
    )
    assert sum(counts.values()) >= 100, counts  # the budget did not cut the run to nothing
    report(findings)


# ------------------------------------------------------------------ REST, hostile values

BIG = 10**400


def hostile_cases() -> list[tuple[str, str, str, Any, str]]:
    """(id, method, path template, body (JSON value, or raw bytes/str), route) - {sid} is a live session."""
    exec_path = "/sessions/{sid}/exec"
    ok = {"argv": ["true"], "timeout_seconds": 1}
    cases = [
        ("ttl-10e400", "POST", "/sessions", {"ttl_seconds": BIG}),
        ("cpu-10e400", "POST", "/sessions", {"cpu": BIG}),
        ("memory-10e400", "POST", "/sessions", {"memory_mb": BIG}),
        ("ttl-negative", "POST", "/sessions", {"ttl_seconds": -1}),
        ("ttl-zero", "POST", "/sessions", {"ttl_seconds": 0}),
        ("ttl-string", "POST", "/sessions", {"ttl_seconds": "60"}),
        ("memory-zero", "POST", "/sessions", {"memory_mb": 0}),
        ("cpu-tiny", "POST", "/sessions", {"cpu": 1e-12}),
        ("env-nul", "POST", "/sessions", {"env": {"A": "x\x00y"}}),
        ("env-name-bad", "POST", "/sessions", {"env": {"A-B": "x"}}),
        ("env-surrogate", "POST", "/sessions", '{"env": {"A": "\\ud800"}}'),
        ("workspace-key-300", "POST", "/sessions", {"durability": "persistent", "workspace_key": "k" * 300}),
        ("image-huge", "POST", "/sessions", {"image": "i" * 100_000}),
        ("consumer-nul", "POST", "/sessions", {"consumer": "a\x00b"}),
        ("body-array", "POST", "/sessions", [1, 2]),
        ("body-not-json", "POST", "/sessions", b"{not json"),
        ("body-not-utf8", "POST", "/sessions", b"\xff\xfe{}"),
        ("body-deep", "POST", "/sessions", "[" * 100_000 + "]" * 100_000),
        ("timeout-10e400", "POST", exec_path, {"argv": ["true"], "timeout_seconds": BIG}),
        ("timeout-nan", "POST", exec_path, '{"argv": ["true"], "timeout_seconds": NaN}'),
        ("timeout-inf", "POST", exec_path, '{"argv": ["true"], "timeout_seconds": Infinity}'),
        ("timeout-zero", "POST", exec_path, {"argv": ["true"], "timeout_seconds": 0}),
        ("timeout-negative", "POST", exec_path, {"argv": ["true"], "timeout_seconds": -5}),
        ("timeout-1e-224", "POST", exec_path, {"argv": ["true"], "timeout_seconds": 1e-224}),
        ("timeout-bool", "POST", exec_path, {"argv": ["true"], "timeout_seconds": True}),
        ("argv-string", "POST", exec_path, {"argv": "true", "timeout_seconds": 1}),
        ("argv-empty", "POST", exec_path, {"argv": [], "timeout_seconds": 1}),
        ("argv-int", "POST", exec_path, {"argv": [1], "timeout_seconds": 1}),
        ("argv-nul", "POST", exec_path, {"argv": ["echo", "a\x00b"], "timeout_seconds": 1}),
        ("argv-surrogate", "POST", exec_path, '{"argv": ["echo", "\\ud800"], "timeout_seconds": 1}'),
        ("argv-2MiB", "POST", exec_path, {"argv": ["echo", "x" * (2 << 20)], "timeout_seconds": 1}),
        ("argv-one-200KiB-arg", "POST", exec_path, {"argv": ["echo", "x" * 200_000], "timeout_seconds": 1}),
        ("argv-many-args", "POST", exec_path, {"argv": ["echo", *(["x"] * 300_000)], "timeout_seconds": 1}),
        ("argv0-missing-program", "POST", exec_path, {"argv": ["no-such-program-xyz"], "timeout_seconds": 1}),
        ("argv0-300-chars", "POST", exec_path, {"argv": ["p" * 300], "timeout_seconds": 1}),
        ("env-value-huge", "POST", exec_path, {**ok, "env": {"A": "v" * 200_000}}),
        ("cwd-nul", "POST", exec_path, {**ok, "cwd": "a\x00"}),
        ("cwd-escape", "POST", exec_path, {**ok, "cwd": "../.."}),
        ("cwd-missing", "POST", exec_path, {**ok, "cwd": "no/such/dir"}),
        ("cwd-a-file", "POST", exec_path, {**ok, "cwd": "known/file.txt"}),
        ("cwd-300-chars", "POST", exec_path, {**ok, "cwd": "c" * 300}),
        ("cwd-long-path", "POST", exec_path, {**ok, "cwd": "/".join(["d" * 200] * 30)}),
        ("stdin-b64-bad", "POST", exec_path, {**ok, "stdin_b64": "!!!"}),
        ("stdin-both", "POST", exec_path, {**ok, "stdin": "a", "stdin_b64": "YQ=="}),
        ("stdin-surrogate", "POST", exec_path, '{"argv": ["cat"], "timeout_seconds": 1, "stdin": "\\ud800"}'),
        ("encoding-bad", "POST", exec_path, {**ok, "encoding": "latin-1"}),
        ("pty-on-rest", "POST", exec_path, {**ok, "pty": True}),
        ("file-name-300", "PUT", "/sessions/{sid}/files/" + "f" * 300, b"data"),
        ("file-name-250", "PUT", "/sessions/{sid}/files/" + "f" * 250, b"data"),
        ("file-long-path-put", "PUT", "/sessions/{sid}/files/" + "/".join(["d" * 200] * 30) + "/f", b"x"),
        ("file-long-path-get", "GET", "/sessions/{sid}/files/" + "/".join(["d" * 200] * 30), None),
        ("file-name-300-get", "GET", "/sessions/{sid}/files/" + "f" * 300, None),
        ("file-nul-get", "GET", "/sessions/{sid}/files/a%00b", None),
        ("file-nul-put", "PUT", "/sessions/{sid}/files/a%00b", b"x"),
        ("file-dotdot-put", "PUT", "/sessions/{sid}/files/..%2F..%2Fescape", b"x"),
        ("file-into-a-file", "PUT", "/sessions/{sid}/files/known/file.txt/child", b"x"),
        ("file-over-a-folder", "PUT", "/sessions/{sid}/files/known", b"x"),
        ("file-surrogate-get", "GET", "/sessions/{sid}/files/%ED%A0%80", None),
        ("session-id-300", "GET", "/sessions/" + "s" * 300, None),
        ("session-id-nul", "GET", "/sessions/a%00b", None),
        ("tool-name-300", "PUT", "/tools/" + "t" * 300, {"description": "d"}),
        ("tool-run-10e400", "POST", "/tools/echo_text/run", {"text": BIG}),
        ("tool-run-nul", "POST", "/tools/echo_text/run", {"text": "a\x00b"}),
        (
            "tool-run-exec-10e400",
            "POST",
            "/tools/sandbox_exec/run",
            {"argv": ["true"], "timeout_seconds": BIG},
        ),
        ("tool-run-exec-cpu-10e400", "POST", "/tools/sandbox_exec/run", {"argv": ["true"], "cpu": BIG}),
        ("tool-run-exec-argv-nul", "POST", "/tools/sandbox_exec/run", {"argv": ["echo", "a\x00"]}),
        ("tool-run-exec-200KiB-arg", "POST", "/tools/sandbox_exec/run", {"argv": ["echo", "x" * 200_000]}),
        (
            "preset-timeout-10e400",
            "PUT",
            "/tools/p1",
            {**PRESET, "binding": {**PRESET["binding"], "timeout_seconds": BIG}},
        ),
        ("preset-cpu-10e400", "PUT", "/tools/p2", {**PRESET, "session": {"cpu": BIG}}),
        (
            "preset-schema-deep",
            "PUT",
            "/tools/p3",
            {
                **PRESET,
                "input_schema": json.loads(
                    "{" + '"not": {' * 200 + '"type": "object"' + "}" * 200 + ', "type": "object"}'
                ),
            },
        ),
    ]
    return [(case_id, method, path, body, _route(method, path)) for case_id, method, path, body in cases]


def _route(method: str, path: str) -> str:
    if path.startswith("/sessions/{sid}/files/"):
        return "/sessions/{session_id}/files/{path}"
    if path == "/sessions/{sid}/exec":
        return "/sessions/{session_id}/exec"
    if path.startswith("/sessions/"):
        return "/sessions/{session_id}"
    if path.endswith("/run"):
        return "/tools/{name}/run"
    if path.startswith("/tools/"):
        return "/tools/{name}"
    return path


#: hostile cases that find a server bug: case id -> the bug (each a strict xfail below)
_E2BIG = (
    "server bug: local exec of an argv/env the kernel refuses (one string over 128 KiB, or too many "
    "arguments; under the 1 MiB ExecRequest bound) answers 500 SandboxError 'Argument list too long' "
    "(E2BIG), not a 400 naming argv/env"
)
#: hostile cases that once found a server bug (fixed): each is also its own regression test
FOUND_BUGS: dict[str, str] = {
    "argv-one-200KiB-arg": _E2BIG,
    "argv-many-args": _E2BIG,
    "env-value-huge": _E2BIG,
    "argv0-300-chars": (
        "server bug: local exec of a program name over NAME_MAX answers 500 SandboxError "
        "'File name too long' (ENAMETOOLONG), not a 4xx"
    ),
    "preset-schema-deep": (
        "server bug: PUT tools/{name} with an input_schema nested 200 levels deep answers "
        "500 InternalError (RecursionError in the JSON Schema check), not 400 PresetInvalidError"
    ),
}


def _send_hostile(server: Server, log: ErrorLog, case: tuple[str, str, str, Any, str]) -> list[Finding]:
    case_id, method, path, body, route = case
    server.ensure_preset()
    url_path = path.replace("{sid}", server.live_session()) if "{sid}" in path else path
    kwargs: dict[str, Any] = {}
    if isinstance(body, (bytes, str)):
        kwargs["data"] = body.encode() if isinstance(body, str) else body
    elif body is not None:
        kwargs["data"] = json.dumps(body).encode()
    try:
        answer = server.request(method, url_path, **kwargs)
    except requests.Timeout:
        return [
            Finding("hang", method, route, case_id, None, f"no answer within {REQUEST_TIMEOUT} s", log.take())
        ]
    except requests.ConnectionError as e:
        return [Finding("connection dropped", method, route, case_id, None, str(e)[:300], log.take())]
    content_type = answer.headers.get("Content-Type", "")
    found = judge(
        method, route, case_id, answer.status_code, answer.content, content_type, log, positive=False
    )
    if not found and answer.status_code >= 400 and not content_type.startswith("application/json"):
        found.append(Finding("not JSON", method, route, case_id, answer.status_code, answer.text[:300]))
    return found


@pytest.mark.timeout(120)
async def test_hostile_values_get_a_typed_answer(server, error_log):
    cases = [case for case in hostile_cases() if case[0] not in FOUND_BUGS]

    def send_all() -> list[Finding]:
        return [finding for case in cases for finding in _send_hostile(server, error_log, case)]

    findings = await asyncio.to_thread(send_all)
    assert not findings, f"{len(findings)} finding(s):\n" + "\n".join(str(f) for f in findings)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case_id", list(FOUND_BUGS))
async def test_a_found_bug_stays_fixed(case_id, server, error_log):
    """One request that once found a server bug (see FOUND_BUGS for what it was)."""
    case = next(case for case in hostile_cases() if case[0] == case_id)
    findings = await asyncio.to_thread(_send_hostile, server, error_log, case)
    assert not findings, "\n".join(str(f) for f in findings)


# ------------------------------------------------------------------ the exec websocket


def _ws_schema(name: str) -> dict:
    return {**SPEC["components"]["schemas"][name], "components": SPEC["components"]}


HOSTILE_START_VALUES: dict[str, list[Any]] = {
    "rows": ["abc", 0, -1, 10_001, BIG, 1.5, True, [], {}],
    "cols": ["abc", 0, BIG, -3, 2.0],
    "timeout_seconds": [BIG, 0, -1, "1", None, True, 1e308],
    "argv": [[], "sh", [1], ["a\x00b"], [""], None, ["echo", "x" * (2 << 20)]],
    "env": [{"A": 1}, {"1A": "x"}, {"A": "x\x00"}, [], "A=1"],
    "cwd": ["", "../..", "a\x00", 5, "/".join(["d" * 200] * 30)],
    "pty": ["yes", 1, None],
    "bogus": [1],
}


#: start messages that once found a server bug (fixed: E2BIG / ENAMETOOLONG at spawn ended in the
#: 500 class, not a typed error naming argv); each is also its own regression test
WS_FOUND_BUGS: dict[str, dict[str, Any]] = {
    "argv0-300-chars": {"type": "start", "argv": ["x" * 300], "timeout_seconds": 2},
    "argv-one-200KiB-arg": {"type": "start", "argv": ["echo", "x" * 200_000], "timeout_seconds": 2},
}


def _ws_starts() -> list[dict[str, Any]]:
    """Start messages: valid ones generated from WsStart, then each field broken in turn."""
    starts: list[dict[str, Any]] = []

    @settings(
        max_examples=WS_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(hypothesis_jsonschema.from_schema(_ws_schema("WsStart")))
    def collect(message: dict[str, Any]) -> None:
        starts.append(message)

    collect()
    base = {"type": "start", "argv": ["true"], "timeout_seconds": 2}
    for name, values in HOSTILE_START_VALUES.items():
        for value in values:
            starts.append({**base, name: value})
    starts += [{**base, "pty": True, "rows": 0}, {**base, "pty": True, "cols": BIG}]
    return [start for start in starts if start not in WS_FOUND_BUGS.values()]


async def _one_connection(jp_ws_fetch, sid: str, first: Any) -> list[Any]:
    """Send ``first`` (a start message, or raw text/bytes), kill once started; every text message received."""
    ws = await jp_ws_fetch("api", "sandbox", "sessions", sid, "exec", "ws")
    texts: list[Any] = []
    try:
        payload = first if isinstance(first, (str, bytes)) else json.dumps(first)
        await ws.write_message(payload, binary=isinstance(payload, bytes))
        while (message := await ws.read_message()) is not None:
            if isinstance(message, str):
                texts.append(json.loads(message))
                if texts[-1].get("type") == "started":
                    await ws.write_message(json.dumps({"type": "kill"}))
    finally:
        ws.close()
    return texts


def _ws_problem(first: Any, texts: list[Any]) -> str | None:
    finals = [t for t in texts if t.get("type") in ("exit", "error")]
    if len(finals) != 1 or texts[-1] is not finals[0]:
        return f"not exactly one final exit/error message, last: {texts}"
    validator = Draft202012Validator(
        _rooted({"$ref": "#/components/schemas/WsServerMessage"}), registry=REGISTRY
    )
    for text in texts:
        errors = list(validator.iter_errors(text))
        if errors:
            return f"message off the spec: {text}: {errors[0].message[:200]}"
    started = any(t.get("type") == "started" for t in texts)
    if finals[0]["type"] == "error" and not started:
        status = finals[0].get("error")
        if status in (None, "InternalError", "SandboxError"):
            return f"untyped error for a bad start: {finals[0]}"
    return None


@pytest.mark.timeout(120)
async def test_websocket_start_messages_end_with_one_json_message(jp_fetch, jp_ws_fetch):
    answer = await jp_fetch(
        "api", "sandbox", "sessions", method="POST", body=json.dumps({"ttl_seconds": 600})
    )
    sid = json.loads(answer.body)["id"]
    starts: list[Any] = await asyncio.to_thread(_ws_starts)
    starts += [
        "not json",
        "[1, 2]",
        b"\x01binary first",
        json.dumps({"type": "resize", "rows": 5, "cols": 5}),
        json.dumps({"type": "stdin", "data": "x"}),
        json.dumps({"type": "nope"}),
        '{"type": "start"}',
    ]
    problems = []
    started = time.monotonic()
    for first in starts:
        try:
            texts = await asyncio.wait_for(_one_connection(jp_ws_fetch, sid, first), WS_TIMEOUT)
        except TimeoutError:
            problems.append(f"hang: start {str(first)[:200]}")
            continue
        problem = _ws_problem(first, texts)
        if problem is not None:
            problems.append(f"{problem}\n   start: {str(first)[:300]}")
    print(f"websocket fuzz: {len(starts)} connections in {time.monotonic() - started:.1f} s")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems[:15])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bug", list(WS_FOUND_BUGS))
async def test_a_found_websocket_bug_stays_fixed(bug, jp_fetch, jp_ws_fetch):
    answer = await jp_fetch(
        "api", "sandbox", "sessions", method="POST", body=json.dumps({"ttl_seconds": 600})
    )
    sid = json.loads(answer.body)["id"]
    texts = await asyncio.wait_for(_one_connection(jp_ws_fetch, sid, WS_FOUND_BUGS[bug]), WS_TIMEOUT)
    assert _ws_problem(WS_FOUND_BUGS[bug], texts) is None
