"""The tools REST doors, end to end, on every provider (and the CLI door beside the server)."""

import asyncio
import json
import os
import sys

import pytest

from jupyter_tai_sandbox import cli
from tests.support.api_spec import check
from tests.support.server import call, server_config

WORD_COUNT = {
    "description": "Count the words in a text.",
    "input_schema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}
#: every way caller input could try to become shell syntax
EVIL = 'it\'s "quoted"; echo PWNED; $(touch {marker}) `touch {marker}` && exit 3\nline two $HOME ${{IFS}} | > * é✓'
ECHO_ALL = {
    "description": "Echo a value back through argv, the script's $1, env and stdin.",
    "input_schema": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]},
    "binding": {
        "script": 'printf "[%s]" "$1"; printf "[%s]" "$2"; printf "[%s]" "$VALUE"; printf "["; cat; printf "]"',
        "args": ["fixed", {"field": "value"}],
        "env": {"VALUE": {"field": "value"}},
        "stdin": {"field": "value"},
    },
}
ARGV_ECHO = {
    "description": "printf each value as an argv element.",
    "input_schema": {
        "type": "object",
        "properties": {"values": {"type": "array", "items": {"type": "string"}}},
    },
    "binding": {"argv": ["printf", "<%s>", {"field": "values", "spread": True}]},
}


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "data" / "presets.json"


@pytest.fixture
def jp_server_config(provider, tmp_path, store_path):
    return server_config(provider, tmp_path / "sandboxes", SandboxApp={"presets_path": str(store_path)})


async def do(jp_fetch, path, method, *parts, **kwargs):
    """A call whose response must match api.yaml."""
    status, body = await call(jp_fetch, *parts, method=method.upper(), **kwargs)
    check(path, method, status, body)
    return status, body


async def put(jp_fetch, name, definition, **kwargs):
    return await do(jp_fetch, "/tools/{name}", "put", "tools", name, body=definition, **kwargs)


async def run(jp_fetch, name, inputs):
    return await do(jp_fetch, "/tools/{name}/run", "post", "tools", name, "run", body=inputs)


async def test_the_worked_preset_end_to_end_over_rest(jp_fetch):
    status, tool = await put(jp_fetch, "word_count", WORD_COUNT)
    assert status == 201 and tool["kind"] == "preset" and tool["fenced"] and tool["source"] == "store"
    status, listing = await do(jp_fetch, "/tools", "get", "tools")
    assert [t["name"] for t in listing["tools"]] == ["sandbox_exec", "sandbox_status", "word_count"]
    assert (await do(jp_fetch, "/tools/{name}", "get", "tools", "word_count"))[1]["input_schema"] == (
        WORD_COUNT["input_schema"]
    )
    status, result = await run(jp_fetch, "word_count", {"text": "the quick brown fox"})
    assert status == 200, result
    assert (result["exit_code"], result["stdout"].strip(), result["stderr"]) == (0, "4", "")


async def test_input_failing_the_schema_gets_422_naming_the_field(jp_fetch):
    await put(jp_fetch, "word_count", WORD_COUNT)
    for inputs, field in (({}, "text"), ({"text": 4}, "text"), ({"text": "a", "lang": "en"}, "lang")):
        status, body = await run(jp_fetch, "word_count", inputs)
        assert (status, body["error"], body["field"]) == (422, "ToolInputError", field), body
        assert repr(field) in body["message"]
    status, body = await call(jp_fetch, "tools", "word_count", "run", method="POST", raw=b"[1]")
    assert status == 400


async def test_inputs_reach_the_command_only_as_argv_stdin_or_env(jp_fetch, tmp_path):
    marker = tmp_path / "pwned"
    value = EVIL.format(marker=marker)
    await put(jp_fetch, "echo_all", ECHO_ALL)
    status, result = await run(jp_fetch, "echo_all", {"value": value})
    assert status == 200, result
    assert result["stdout"] == f"[fixed][{value}][{value}][{value}]" and result["exit_code"] == 0
    await put(jp_fetch, "argv_echo", ARGV_ECHO)
    values = [value, "", "-n", "%s%d", "a\nb"]
    status, result = await run(jp_fetch, "argv_echo", {"values": values})
    assert result["stdout"] == "".join(f"<{v}>" for v in values)
    assert not marker.exists()


async def test_nul_goes_through_stdin_and_is_refused_in_argv(jp_fetch):
    await put(jp_fetch, "echo_all", ECHO_ALL)
    status, body = await run(jp_fetch, "echo_all", {"value": "a\x00b"})
    assert (status, body["field"]) == (422, "value") and "NUL" in body["message"]
    cat = {**WORD_COUNT, "binding": {"argv": ["cat"], "stdin": {"field": "text"}}}
    await put(jp_fetch, "cat", cat)
    status, result = await run(jp_fetch, "cat", {"text": "a\x00b;$(x)\n"})
    assert result["stdout"] == "a\x00b;$(x)\n"


@pytest.mark.parametrize(
    ("definition", "status", "words"),
    [
        ({**WORD_COUNT, "base": "nope"}, 400, "unknown base tool 'nope'"),
        (
            {**WORD_COUNT, "input_schema": {"type": "object", "required": "text"}},
            400,
            "not valid JSON Schema",
        ),
        ({**WORD_COUNT, "binding": {"argv": ["wc", {"field": "words"}]}}, 400, "references field 'words'"),
        ({**WORD_COUNT, "name": "other"}, 400, "differs from 'word_count'"),
    ],
)
async def test_bad_presets_are_refused_and_nothing_is_persisted(
    jp_fetch, store_path, definition, status, words
):
    got, body = await put(jp_fetch, "word_count", definition)
    assert (got, body["error"]) == (status, "PresetInvalidError") and words in body["message"], body
    assert not store_path.exists()
    assert (await call(jp_fetch, "tools", "word_count"))[0] == 404


async def test_every_problem_of_a_preset_is_in_one_400(jp_fetch, store_path):
    """Issue 20.7 over REST: the body's message names each problem, and ``problems`` lists them."""
    bad = {
        **WORD_COUNT,
        "extra": 1,
        "session": {"cpu": -1},
        "binding": {"argv": ["wc", {"field": "words"}], "timeout_seconds": "soon"},
    }
    got, body = await put(jp_fetch, "word_count", bad)
    assert (got, body["error"]) == (400, "PresetInvalidError"), body
    problems = body["problems"]
    assert len(problems) == 4 and all(f"- {p}" in body["message"] for p in problems), body
    for words, problem in zip(
        [
            "unknown preset field(s): extra",
            "session: ",
            "references field 'words'",
            "binding.timeout_seconds",
        ],
        problems,
        strict=True,
    ):
        assert words in problem
    assert not store_path.exists()


async def test_name_clash_replace_and_delete(jp_fetch, store_path):
    assert (await put(jp_fetch, "word_count", WORD_COUNT))[0] == 201
    before = store_path.read_bytes()
    status, body = await put(jp_fetch, "word_count", {**WORD_COUNT, "description": "v2"})
    assert (status, body["error"]) == (409, "PresetConflictError") and "replace=1" in body["message"]
    assert store_path.read_bytes() == before
    assert (await put(jp_fetch, "sandbox_exec", WORD_COUNT))[0] == 409
    status, body = await put(
        jp_fetch, "word_count", {**WORD_COUNT, "description": "v2"}, params={"replace": "1"}
    )
    assert (status, body["description"]) == (200, "v2")
    assert (await do(jp_fetch, "/tools/{name}", "delete", "tools", "word_count"))[0] == 204
    assert (await do(jp_fetch, "/tools/{name}", "delete", "tools", "word_count"))[0] == 404
    assert (await do(jp_fetch, "/tools/{name}", "delete", "tools", "sandbox_exec"))[0] == 409
    assert json.loads(store_path.read_text())["presets"] == {}


async def test_the_base_tool_runs_directly_for_an_admin(jp_fetch):
    status, result = await run(jp_fetch, "sandbox_exec", {"script": 'echo "$1"', "args": ["a;b"]})
    assert (status, result["stdout"]) == (200, "a;b\n")
    status, _body = await run(jp_fetch, "sandbox_exec", {"argv": ["true"], "script": "x"})
    assert status == 422
    status, result = await run(jp_fetch, "sandbox_status", {})
    assert status == 200 and result["kind"] in ("local", "docker")


async def test_network_portability(jp_fetch, provider):
    await put(jp_fetch, "unset", WORD_COUNT)
    await put(jp_fetch, "egress", {**WORD_COUNT, "session": {"network": "egress"}})
    for name in ("unset", "egress"):
        status, result = await run(jp_fetch, name, {"text": "a b"})
        assert (status, result["stdout"].strip()) == (200, "2"), result
    for network in ("none", "internal"):
        await put(jp_fetch, f"pinned_{network}", {**WORD_COUNT, "session": {"network": network}})
        status, body = await run(jp_fetch, f"pinned_{network}", {"text": "a b"})
        if provider == "docker":
            assert (status, body["stdout"].strip()) == (200, "2"), body
        else:
            assert (status, body["error"]) == (400, "SandboxSpecRejectedError"), body
            assert f"network={network!r}" in body["message"]


async def test_limits_are_honoured_by_docker_and_refused_loudly_by_local(jp_fetch, provider):
    await put(jp_fetch, "capped", {**WORD_COUNT, "session": {"cpu": 0.5, "memory_mb": 64}})
    status, body = await run(jp_fetch, "capped", {"text": "a b"})
    if provider == "docker":
        assert (status, body["stdout"].strip()) == (200, "2"), body
    else:
        assert (status, body["error"]) == (400, "SandboxSpecRejectedError") and "caps" in body["message"]


async def test_a_preset_can_ask_for_a_durable_workspace(jp_fetch, provider):
    key = f"tools-test-{provider}"
    counter = {
        "description": "Count runs in a durable workspace.",
        "input_schema": {"type": "object", "properties": {}},
        "session": {"durability": "persistent", "workspace_key": key},
        "binding": {"script": "echo x >> runs; wc -l < runs"},
    }
    await put(jp_fetch, "counter", counter)
    try:
        outputs = [(await run(jp_fetch, "counter", {}))[1]["stdout"].strip() for _ in range(2)]
        assert outputs == ["1", "2"]
    finally:
        # remove the workspace: a session with the same key, destroyed with remove_workspace
        _status, info = await call(
            jp_fetch, "sessions", method="POST", body={"durability": "persistent", "workspace_key": key}
        )
        await call(jp_fetch, "sessions", info["id"], method="DELETE", params={"remove_workspace": "1"})


async def test_a_timeout_is_a_504(jp_fetch):
    await put(jp_fetch, "slow", {**WORD_COUNT, "binding": {"argv": ["sleep", "30"], "timeout_seconds": 0.5}})
    status, body = await run(jp_fetch, "slow", {"text": "x"})
    assert (status, body["error"]) == (504, "SandboxExecTimeoutError")


async def test_the_cli_door_authors_into_the_store_the_server_reads(jp_fetch, store_path, tmp_path, provider):
    path = tmp_path / "wc.json"
    path.write_text(json.dumps({"name": "word_count", **WORD_COUNT}))
    assert cli.main(["preset", "--store", str(store_path), "add", str(path)]) == 0
    status, result = await run(jp_fetch, "word_count", {"text": "seen by the server"})
    assert (status, result["stdout"].strip()) == (200, "4")
    # the CLI runs it too, as its own process on the same provider (the operator's environment)
    env = {**os.environ, "TAI_MCP_SANDBOX_ISOLATION": "none", "SANDBOX_LOCAL_ROOT": str(tmp_path / "cli-sbx")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jupyter_tai_sandbox.cli",
        "preset",
        "--store",
        str(store_path),
        "run",
        "word_count",
        "--provider",
        provider,
        "--input",
        '{"text": "one two three"}',
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert (proc.returncode, out.decode().strip()) == (0, "3"), err.decode()
