"""Presets, the bind kernel, the chokepoints, the store and the stream scrubber, without a server."""

import asyncio
import json
import os
import random

import pytest

from jupyter_tai_sandbox import cli, sandboxes, tools
from jupyter_tai_sandbox.contract import SandboxNotFoundError
from jupyter_tai_sandbox.errors import error_status
from jupyter_tai_sandbox.policy import SCRUBBED, SandboxPolicy, StreamScrubber
from jupyter_tai_sandbox.providers.local import LocalSandbox
from jupyter_tai_sandbox.tools import (
    BASE_TOOLS,
    OPERATOR_CLI,
    OPERATOR_CONFIG,
    Decided,
    PresetConflictError,
    PresetInvalidError,
    PresetStore,
    ToolAccessDeniedError,
    ToolInputError,
    ToolRegistry,
    parse_preset,
    validate_input,
)

WORD_COUNT = {
    "name": "word_count",
    "description": "Count the words in a text.",
    "input_schema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}
ADMIN = Decided(name="admin", allowed=frozenset({"read", "write", "execute"}))
USER = Decided(name="user", allowed=frozenset())


def with_(original: dict, /, **changes) -> dict:
    return {**json.loads(json.dumps(original)), **changes}


@pytest.fixture
def registry(tmp_path) -> ToolRegistry:
    return ToolRegistry(PresetStore(tmp_path / "store" / "presets.json"))


# ------------------------------------------------------------------ base tools


def test_the_difference_between_base_tools_is_explicit():
    assert BASE_TOOLS["sandbox_exec"].accepts_input_schema is True
    assert BASE_TOOLS["sandbox_exec"].fenced is True
    assert BASE_TOOLS["sandbox_status"].accepts_input_schema is False
    assert BASE_TOOLS["sandbox_status"].fenced is False
    # a fixed-schema base tool refuses a declared schema; sandbox_exec requires one
    with pytest.raises(PresetInvalidError, match="fixed input schema"):
        parse_preset(
            {"name": "st", "description": "d", "base": "sandbox_status", "input_schema": {"type": "object"}}
        )
    assert parse_preset({"name": "st", "description": "d", "base": "sandbox_status"}).schema() == (
        BASE_TOOLS["sandbox_status"].input_schema
    )
    with pytest.raises(PresetInvalidError, match="declares input_schema"):
        parse_preset({"name": "x", "description": "d", "binding": {"argv": ["true"]}})


def test_the_base_schema_defaults_network_to_egress():
    data = validate_input(BASE_TOOLS["sandbox_exec"].input_schema, {"argv": ["true"]})
    assert data["network"] == "egress" and data["timeout_seconds"] == 60


# ------------------------------------------------------------ authoring refusals


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        (with_(WORD_COUNT, base="no_such_tool"), "unknown base tool 'no_such_tool'"),
        (
            with_(WORD_COUNT, input_schema={"type": "object", "properties": {"text": {"type": 7}}}),
            "not valid JSON Schema at properties/text/type",
        ),
        (with_(WORD_COUNT, input_schema={"type": "string"}), '"type": "object"'),
        (
            with_(WORD_COUNT, binding={"argv": ["wc", {"field": "txt"}]}),
            "references field 'txt', which input_schema does not declare",
        ),
        (with_(WORD_COUNT, binding={"argv": ["wc"], "stdin": {"field": "missing"}}), "'missing'"),
        (with_(WORD_COUNT, binding={"script": "cat", "env": {"X": {"field": "nope"}}}), "'nope'"),
        (with_(WORD_COUNT, binding={"argv": [{"field": "text"}]}), "argv[0], the program, is fixed"),
        (with_(WORD_COUNT, binding={"argv": ["a"], "script": "b"}), "exactly one of argv"),
        (with_(WORD_COUNT, binding={"argv": ["a"], "shell": "b"}), "unknown binding field(s): shell"),
        (with_(WORD_COUNT, binding={"script": "cat", "env": {"1X": "v"}}), "invalid environment variable"),
        (with_(WORD_COUNT, binding={"argv": ["cat"], "stdin": {"field": "text", "spread": True}}), "spread"),
        (with_(WORD_COUNT, session={"network": "moon"}), "unknown network 'moon'"),
        (with_(WORD_COUNT, session={"ttl_seconds": 5}), "unknown session setting(s): ttl_seconds"),
        (with_(WORD_COUNT, name="no spaces"), "invalid preset name"),
        (with_(WORD_COUNT, description=""), "needs a description"),
        (with_(WORD_COUNT, extra=1), "unknown preset field(s): extra"),
        ([1, 2], "a preset is a JSON object"),
    ],
)
def test_bad_presets_are_refused_at_authoring_and_nothing_is_stored(registry, definition, message):
    with pytest.raises(PresetInvalidError) as refused:
        registry.author(definition, principal=ADMIN)
    assert message in str(refused.value)
    assert not registry.store.path.exists()


def test_every_problem_of_a_definition_is_named_at_once(registry):
    """Issue 20.7: three mistakes, one PresetInvalidError (400) naming all three, one a line."""
    bad = with_(
        WORD_COUNT,
        colour="red",
        name="no spaces",
        binding={"argv": ["wc", {"field": "txt"}], "stdin": {"field": "text"}, "timeout_seconds": -1},
    )
    with pytest.raises(PresetInvalidError) as refused:
        registry.author(bad, principal=ADMIN)
    error = refused.value
    assert error_status(error) == 400
    expected = [
        "unknown preset field(s): colour",
        "invalid preset name 'no spaces'",
        "references field 'txt'",
        "binding.timeout_seconds is a positive number",
    ]
    assert len(error.problems) == len(expected) and error.details == {"problems": error.problems}
    for words, problem, line in zip(expected, error.problems, str(error).splitlines()[1:], strict=True):
        assert words in problem and line == f"- {problem}"
    assert str(error).startswith("the preset definition has 4 problems:")
    assert not registry.store.path.exists()


def test_problems_in_every_part_are_gathered():
    """Name, description, schema, session and binding are each checked, whatever the others hold."""
    with pytest.raises(PresetInvalidError) as refused:
        parse_preset(
            {
                "name": "7up",
                "description": " ",
                "base": "sandbox_exec",
                "input_schema": {"type": "object", "properties": {"text": {"type": 7}}, "required": "text"},
                "session": {"network": "moon", "ttl_seconds": 5},
                "binding": {"script": "", "env": {"1X": {"field": "nope"}}, "shell": "sh"},
            }
        )
    problems = refused.value.problems
    for words in [
        "invalid preset name '7up'",
        "needs a description",
        "at properties/text/type",
        "at required",
        "unknown session setting(s): ttl_seconds",
        "session: ",
        "unknown network 'moon'",
        "unknown binding field(s): shell",
        "binding.script is fixed shell text",
        "invalid environment variable name '1X'",
        "references field 'nope'",
    ]:
        assert any(words in p for p in problems), (words, problems)
    # one problem stays the message itself, as before
    with pytest.raises(PresetInvalidError) as one:
        parse_preset(with_(WORD_COUNT, description=""))
    assert str(one.value) == "a preset needs a description: the text a caller (or a model) reads"
    assert one.value.problems == [str(one.value)]


def test_the_config_door_names_every_problem_too(registry):
    with pytest.raises(PresetInvalidError) as refused:
        registry.apply_manifest({"bad": with_(WORD_COUNT, name="bad", base="nope", extra=1)})
    assert str(refused.value).startswith("SandboxApp.presets['bad']: the preset definition has 2 problems:")
    assert len(refused.value.problems) == 2 and registry.config == {}


def test_name_clashes_are_refused(registry):
    registry.author(WORD_COUNT, principal=ADMIN)
    before = registry.store.path.read_bytes()
    with pytest.raises(PresetConflictError, match="exists"):
        registry.author(with_(WORD_COUNT, description="other"), principal=ADMIN)
    assert registry.store.path.read_bytes() == before
    with pytest.raises(PresetConflictError, match="base tool"):
        registry.author(with_(WORD_COUNT, name="sandbox_exec"), principal=ADMIN)
    registry.apply_manifest({"from_config": with_(WORD_COUNT, name="from_config")})
    with pytest.raises(PresetConflictError, match=r"SandboxApp\.presets"):
        registry.author(with_(WORD_COUNT, name="from_config"), principal=ADMIN)
    with pytest.raises(PresetConflictError, match=r"SandboxApp\.presets"):
        registry.remove("from_config", principal=ADMIN)
    with pytest.raises(PresetConflictError, match="base tool"):
        registry.remove("sandbox_exec", principal=ADMIN)
    # replace is explicit
    registry.author(with_(WORD_COUNT, description="v2"), principal=ADMIN, replace=True)
    assert registry.get("word_count").description == "v2"
    assert registry.store.path.read_bytes() != before


def test_a_failed_write_leaves_the_store_and_its_folder_as_they_were(registry, monkeypatch):
    registry.author(WORD_COUNT, principal=ADMIN)
    before = registry.store.path.read_bytes()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tools.store.os, "replace", broken_replace)
    with pytest.raises(tools.PresetStoreError, match="No space left"):
        registry.author(with_(WORD_COUNT, name="second"), principal=ADMIN)
    assert registry.store.path.read_bytes() == before
    assert sorted(p.name for p in registry.store.path.parent.iterdir()) == [
        "presets.json",
        "presets.json.lock",
    ]


def test_the_store_is_reread_when_another_process_changes_it(registry, tmp_path):
    other = ToolRegistry(PresetStore(registry.store.path))  # e.g. the CLI beside a running server
    assert [t["name"] for t in registry.list_json()] == ["sandbox_exec", "sandbox_status"]
    other.author(WORD_COUNT, principal=OPERATOR_CLI)
    assert "word_count" in [t["name"] for t in registry.list_json()]
    other.remove("word_count", principal=OPERATOR_CLI)
    with pytest.raises(SandboxNotFoundError):
        registry.get("word_count")


def test_a_corrupt_store_is_reported_loudly(registry):
    registry.store.path.parent.mkdir(parents=True)
    registry.store.path.write_text("{not json")
    with pytest.raises(tools.PresetStoreError, match="cannot read the preset store"):
        registry.list_json()


# --------------------------------------------------------------- input + bind


@pytest.mark.parametrize(
    ("inputs", "field"),
    [({}, "text"), ({"text": 5}, "text"), ({"text": "a", "extra": 1}, "extra"), ([], "")],
)
def test_input_errors_name_the_failing_field(inputs, field):
    with pytest.raises(ToolInputError) as refused:
        validate_input(WORD_COUNT["input_schema"], inputs)
    assert refused.value.field == field and error_status(refused.value) == 422
    assert (repr(field) if field else "the input") in str(refused.value)


def test_nested_fields_are_named_by_path():
    schema = {
        "type": "object",
        "properties": {"opts": {"type": "object", "properties": {"n": {"type": "integer"}}}},
    }
    with pytest.raises(ToolInputError) as refused:
        validate_input(schema, {"opts": {"n": "x"}})
    assert refused.value.field == "opts.n"


def test_the_bind_kernel_routes_fields_into_argv_stdin_and_env_only():
    preset = parse_preset(
        {
            "name": "p",
            "description": "d",
            "input_schema": {
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "n": {"type": "integer", "default": 3},
                    "files": {"type": "array", "items": {"type": "string"}},
                    "opt": {"type": "string"},
                },
            },
            "session": {"network": "none", "image": "img"},
            "binding": {
                "script": 'printf "%s" "$1"',
                "args": [
                    {"field": "a"},
                    {"field": "n"},
                    {"field": "files", "spread": True},
                    {"field": "opt"},
                ],
                "stdin": {"field": "a"},
                "env": {"A": {"field": "a"}, "FIXED": "x"},
            },
        }
    )
    evil = "'; rm -rf / $(id) `id`\n\"x"
    data = validate_input(preset.schema(), {"a": evil, "files": ["f 1", "f;2"]})
    bound = BASE_TOOLS["sandbox_exec"].bind(preset, data)
    assert bound == {
        "network": "none",
        "image": "img",
        "script": 'printf "%s" "$1"',  # the shell text is the author's, untouched
        "args": [evil, "3", "f 1", "f;2"],  # the absent optional field is dropped
        "stdin": evil,
        "env": {"A": evil, "FIXED": "x"},
    }


def test_nul_cannot_travel_in_argv_or_env_but_can_in_stdin():
    preset = parse_preset(with_(WORD_COUNT, binding={"argv": ["echo", {"field": "text"}]}))
    with pytest.raises(ToolInputError) as refused:
        BASE_TOOLS["sandbox_exec"].bind(preset, {"text": "a\x00b"})
    assert refused.value.field == "text" and "NUL" in str(refused.value)
    preset = parse_preset(WORD_COUNT)
    assert BASE_TOOLS["sandbox_exec"].bind(preset, {"text": "a\x00b"})["stdin"] == "a\x00b"


# ------------------------------------------------------------------- the fence


def test_the_fence_refuses_authoring_removing_and_running_without_admin(registry):
    with pytest.raises(ToolAccessDeniedError, match="jupyter_tai_sandbox:admin"):
        registry.author(WORD_COUNT, principal=USER)
    # fenced before validation: a refused user learns nothing about its definition
    with pytest.raises(ToolAccessDeniedError):
        registry.author({"base": "sandbox_exec", "junk": 1}, principal=USER)
    assert not registry.store.path.exists()
    registry.author(WORD_COUNT, principal=ADMIN)
    with pytest.raises(ToolAccessDeniedError):
        registry.remove("word_count", principal=USER)
    with pytest.raises(ToolAccessDeniedError, match="run the tool 'word_count'"):
        asyncio.run(registry.run("word_count", {"text": "a"}, principal=USER))
    with pytest.raises(ToolAccessDeniedError):
        asyncio.run(registry.run("sandbox_exec", {"argv": ["true"]}, principal=USER))
    # the open tier runs for anyone
    assert asyncio.run(registry.run("sandbox_status", {}, principal=USER))["kind"] == "off"


def test_operators_pass_the_fence():
    assert OPERATOR_CLI.may("write") and OPERATOR_CONFIG.may("execute")
    assert OPERATOR_CLI.name == "operator (cli)"


def test_a_config_preset_is_applied_in_memory_not_stored(registry):
    registry.apply_manifest({"word_count": WORD_COUNT})
    assert registry.get("word_count").source == "config"
    assert not registry.store.path.exists()
    with pytest.raises(PresetInvalidError, match=r"SandboxApp.presets\['bad'\]: unknown base tool"):
        registry.apply_manifest(
            {"ok": with_(WORD_COUNT, name="ok"), "bad": with_(WORD_COUNT, name="bad", base="nope")}
        )
    assert [p["name"] for p in registry.list_json()][2:] == ["word_count"]  # all or nothing


# ------------------------------------------------------------- running (local)


@pytest.fixture
def local(tmp_path):
    sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "sbx")), policy=SandboxPolicy(isolation="none")
    )


def test_run_goes_through_require_sandbox_and_the_policy(registry, local, monkeypatch):
    calls = []
    real = sandboxes.require_sandbox

    def spy():
        calls.append(1)
        return real()

    monkeypatch.setattr(sandboxes, "require_sandbox", spy)
    registry.author(WORD_COUNT, principal=ADMIN)
    result = asyncio.run(registry.run("word_count", {"text": "one two three"}, principal=ADMIN))
    assert (result["exit_code"], result["stdout"].strip(), result["stderr"]) == (0, "3", "")
    assert calls == [1]


def test_local_rejects_a_preset_pinning_network_none_loudly(registry, local):
    registry.author(with_(WORD_COUNT, session={"network": "none"}), principal=ADMIN)
    with pytest.raises(tools.SandboxSpecRejectedError, match="network='none'"):
        asyncio.run(registry.run("word_count", {"text": "x"}, principal=ADMIN))


# ------------------------------------------------------------------- the CLI


@pytest.fixture
def store_args(tmp_path):
    return ["preset", "--store", str(tmp_path / "cli" / "presets.json")]


def test_cli_add_list_run_rm(store_args, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TAI_MCP_SANDBOX_ISOLATION", "none")
    monkeypatch.setenv("SANDBOX_LOCAL_ROOT", str(tmp_path / "sbx"))
    path = tmp_path / "wc.json"
    path.write_text(json.dumps(WORD_COUNT))
    assert cli.main([*store_args, "add", str(path)]) == 0
    assert cli.main([*store_args, "add", str(path)]) == 1
    assert "PresetConflictError" in capsys.readouterr().err
    assert cli.main([*store_args, "add", str(path), "--replace"]) == 0
    assert cli.main([*store_args, "list"]) == 0
    assert "word_count" in capsys.readouterr().out
    code = cli.main(
        [*store_args, "run", "word_count", "--provider", "local", "--input", '{"text": "a b c d"}']
    )
    assert (code, capsys.readouterr().out.strip()) == (0, "4")
    assert (
        cli.main([*store_args, "run", "word_count", "--provider", "local", "--input", '{"text": 1}']) == 125
    )
    assert "input field 'text'" in capsys.readouterr().err
    assert cli.main([*store_args, "rm", "word_count"]) == 0
    assert cli.main([*store_args, "rm", "word_count"]) == 1
    assert sandboxes.installed() is None


def test_cli_refuses_bad_presets_and_stores_nothing(store_args, tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(with_(WORD_COUNT, binding={"argv": ["wc", {"field": "nope"}]})))
    assert cli.main([*store_args, "add", str(path)]) == 1
    assert "'nope'" in capsys.readouterr().err
    path.write_text("{")
    assert cli.main([*store_args, "add", str(path)]) == 1
    assert not (tmp_path / "cli" / "presets.json").exists()


def test_build_image_is_still_a_command():
    with pytest.raises(SystemExit) as shown:
        cli.main(["build-image", "--help"])
    assert shown.value.code == 0


def test_every_door_reaches_the_one_fence(registry, tmp_path, monkeypatch, capsys):
    """With the fence itself denying, the CLI and config doors (operators) are refused too."""
    seen = []

    def deny(principal, action, what):
        seen.append((principal.door, action))
        raise ToolAccessDeniedError(f"denied: {what}")

    registry.author(WORD_COUNT, principal=ADMIN)
    monkeypatch.setattr(tools.registry, "fence", deny)  # the chokepoints look it up there
    path = tmp_path / "wc.json"
    path.write_text(json.dumps(with_(WORD_COUNT, name="other")))
    store = ["preset", "--store", str(registry.store.path)]
    assert cli.main([*store, "add", str(path)]) == 1
    assert cli.main([*store, "rm", "word_count"]) == 1
    assert cli.main([*store, "run", "word_count", "--input", '{"text": "x"}']) == 125
    with pytest.raises(PresetInvalidError, match="denied"):
        registry.apply_manifest({"other": with_(WORD_COUNT, name="other")})
    assert seen == [("cli", "write"), ("cli", "write"), ("cli", "execute"), ("config", "write")]
    assert [t["name"] for t in registry.list_json()] == ["sandbox_exec", "sandbox_status", "word_count"]


# --------------------------------------------------------------- the scrubber


SECRETS = ["s3cr3t-Value-42", "tok_ABCDEF", "tok_ABCDEFGHIJ", "aaab"]


def scrub_in_chunks(data: bytes, cuts: list[int], values=SECRETS) -> tuple[bytes, int]:
    scrubber = StreamScrubber(values)
    out, most_held, prev = bytearray(), 0, 0
    for cut in [*cuts, len(data)]:
        out += scrubber.feed(data[prev:cut])
        most_held = max(most_held, len(scrubber._pending))
        prev = cut
    out += scrubber.flush()
    return bytes(out), most_held


def whole(data: bytes, values=SECRETS) -> bytes:
    scrubber = StreamScrubber(values)
    return scrubber._pattern.sub(SCRUBBED.encode(), data)


def test_a_value_split_across_chunks_is_scrubbed():
    data = b"before s3cr3t-Value-42 after"
    for cut in range(len(data) + 1):
        assert scrub_in_chunks(data, [cut])[0] == b"before [scrubbed] after"


def test_scrubbing_in_chunks_equals_scrubbing_whole_and_holds_little():
    rng = random.Random(5)
    longest = max(len(s) for s in SECRETS)
    alphabet = [b"a", b"b", b"s3cr3t-", b"Value-42", b"tok_", b"ABCDEF", b"GHIJ", b"\x00", b"\xff", b"\n"]
    for _ in range(400):
        data = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6)))
        got, held = scrub_in_chunks(data, cuts)
        assert got == whole(data), (data, cuts)
        assert held <= longest - 1


def test_the_longest_value_wins_across_a_split():
    assert scrub_in_chunks(b"x tok_ABCDEFGHIJ y", [8])[0] == b"x [scrubbed] y"
    assert scrub_in_chunks(b"x tok_ABCDEF", [8])[0] == b"x [scrubbed]"


def test_binary_data_without_secrets_passes_through_exactly():
    data = os.urandom(1 << 16)
    got, _ = scrub_in_chunks(data, list(range(0, len(data), 1000)))
    assert got == whole(data)


def test_no_scrubber_when_scrub_is_off_or_nothing_is_injected(monkeypatch):
    monkeypatch.setenv("SECRET_X", "value")
    assert SandboxPolicy(credentials={"*": ["SECRET_X"]}).stream_scrubber() is None
    assert SandboxPolicy(scrub_transcript=True).stream_scrubber() is None
    scrubber = SandboxPolicy(scrub_transcript=True, credentials={"*": ["SECRET_X"]}).stream_scrubber()
    assert scrubber.feed(b"a valu") == b"a " and scrubber.feed(b"e!") == b"[scrubbed]!"
