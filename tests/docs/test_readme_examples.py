"""The user pages' examples run as written: the `%%sandbox` session of docs/users/magics.md, found by its
label (``<!-- example: magics-session -->``), on both providers, executed in a kernel a live server started
(the docker run uses the Python image, as the page says); and rules every page's shell and Python blocks
keep (README's and docs/'s)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.providers.docker.images.packages import LABEL_PIP
from tests.support.doc_blocks import DOCS, README, block, fenced_blocks, pages
from tests.support.live_server import LOCAL_ARGS, LiveServer

MAGICS_PAGE = "users/magics.md"


def magics_session() -> list[tuple[str, str | None]]:
    """The IPython session of the magics page: (cell code, what it shows) pairs."""
    cells: list[list[str]] = []
    shown: list[list[str]] = []
    for line in block(MAGICS_PAGE, "magics-session").splitlines():
        if match := re.match(r"In \[\d+\]: ?(.*)", line):
            cells.append([match.group(1)])
            shown.append([])
        elif match := re.match(r"\s+\.\.\.: ?(.*)", line):
            cells[-1].append(match.group(1))
        elif match := re.match(r"Out\[\d+\]: (.*)", line):
            shown[-1].append(match.group(1))
        elif line.strip():
            shown[-1].append(line)
    return [("\n".join(code), "\n".join(out) or None) for code, out in zip(cells, shown, strict=True)]


def run_magics_session(kernel) -> None:
    for code, shown in magics_session():
        if shown is not None and code.isidentifier():  # an expression cell: compare its repr
            assert kernel.ok(f"print(repr({code}))").stdout.strip() == shown, code
            continue
        run = kernel.run(code, timeout=120)
        assert not run.errors or "--raise" in code, (code, run.errors, run.stderr)
        if shown is not None:
            assert (run.stdout + run.stderr).strip().splitlines() == shown.splitlines(), (code, run.streams)


def test_the_session_is_read_out_of_the_magics_page():
    cells = magics_session()
    assert cells[0][0] == "%load_ext jupyter_tai_sandbox" and any("%%sandbox python3" in c for c, _ in cells)


def test_the_magics_page_runs_as_written_on_local(tmp_path):
    live = LiveServer(tmp_path, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}")).start()
    try:
        kernel = live.start_kernel()
        try:
            run_magics_session(kernel)
        finally:
            kernel.shutdown()
    finally:
        live.stop()


def test_the_magics_page_runs_as_written_on_docker(tmp_path):
    from tests.support.docker import docker_client, in_ci, server_args

    client = docker_client()  # skips without an engine (fails in CI)
    try:
        pip = client.images.get(PYTHON_IMAGE).labels.get(LABEL_PIP, "").split()
    except Exception:
        if in_ci():
            raise
        pytest.skip(
            f"{PYTHON_IMAGE} is not built: jupyter tai-sandbox build-image --python --pip pandas pyarrow"
        )
    if not {"pandas", "pyarrow"} <= set(pip):
        message = f"{PYTHON_IMAGE} lacks pandas or pyarrow: jupyter tai-sandbox build-image --python --pip pandas pyarrow"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    # the server's default configuration: no image named, so sessions get the Python image
    live = LiveServer(tmp_path, args=server_args(image=None)).start()
    try:
        kernel = live.start_kernel()
        try:
            run_magics_session(kernel)
        finally:
            kernel.shutdown()
    finally:
        live.stop()


def test_every_file_a_curl_uploads_is_made_before_it():
    for path in pages():
        for text in fenced_blocks(path, "bash"):
            for match in re.finditer(r"--data-binary @([\w./-]+)", text):
                before = text[: match.start()]
                assert re.search(rf"> *{re.escape(match.group(1))}\b", before), (
                    f"{path} uploads {match.group(1)} without making it first:\n{text}"
                )


def test_a_snippet_with_top_level_await_says_it_is_for_a_notebook():
    for path in pages():
        text = path.read_text()
        for code in fenced_blocks(path, "python"):
            top_level = [
                line for line in code.splitlines() if re.match(r"(async with|async for|await) ", line)
            ]
            if top_level:
                start = text.index(code)
                said = text[max(0, start - 600) : start + len(code)]
                assert "notebook" in said and "asyncio.run" in said, (path, code)


def test_the_quickstarts_shell_walk_through_runs_as_written(tmp_path):
    """docs/users/quickstart.md's curl block, run by bash against a live local server: the only change is
    the server's address (the page's http://localhost:8888 becomes the test server's); the token comes from
    `jupyter server list`, as the page says."""
    live = LiveServer(tmp_path, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}")).start()
    try:
        script = block("users/quickstart.md", "rest-curl").replace(
            "http://localhost:8888", live.url.rstrip("/")
        )
        work = tmp_path / "work"
        work.mkdir()
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], env=live.env, cwd=work, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        answers, text = [], ran.stdout.strip()
        while text:  # curl prints each JSON answer as it came, without a newline
            value, end = json.JSONDecoder().raw_decode(text)
            answers.append(value)
            text = text[end:].lstrip()
        status, executed, uploaded, listing = answers  # the DELETE answers no body
        assert status["kind"] == "local", status
        assert executed == {"exit_code": 0, "encoding": "utf-8", "stdout": "hello\n", "stderr": ""}, executed
        assert uploaded == {"path": "data.csv", "size": 8}, uploaded
        assert [e["name"] for e in listing["entries"]] == ["data.csv"], listing
        assert live.session_ids() == set()  # the walk-through destroyed its session
    finally:
        live.stop()


def _curl_lines(text: str, url: str) -> list[str]:
    """The curl commands of a shell block (continuation lines joined), the page's server address replaced."""
    joined = re.sub(r"\\\n\s*", "", text)
    return [
        line.replace("http://localhost:8888", url) for line in joined.splitlines() if line.startswith("curl ")
    ]


def test_the_code_tools_page_authors_and_runs_its_preset_over_rest(tmp_path):
    """docs/users/code-tools.md: its word_count definition, PUT by the page's curl line and run by the
    page's curl line against a live local server, answers what the page's comment shows."""
    live = LiveServer(
        tmp_path,
        args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}",
              f"--SandboxApp.presets_path={tmp_path / 'presets.json'}"),
    ).start()  # fmt: skip
    try:
        work = tmp_path / "work"
        work.mkdir()
        (work / "word_count.json").write_text(block("users/code-tools.md", "preset-word-count"))
        env = {**live.env, "TOKEN": live.token}
        url = live.url.rstrip("/")
        (author,) = _curl_lines(block("users/code-tools.md", "preset-author"), url)
        run_block = block("users/code-tools.md", "preset-run")
        (run,) = _curl_lines(run_block, url)
        for line in (author, run):
            ran = subprocess.run(
                ["bash", "-c", f"{line} -sS --fail-with-body"], env=env, cwd=work, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert ran.returncode == 0, (line, ran.stdout, ran.stderr)
        shown = re.search(r"^# (\{.*\})$", run_block, re.M)
        assert shown and json.loads(ran.stdout) == json.loads(shown.group(1)), ran.stdout
    finally:
        live.stop()


@pytest.mark.parametrize(
    ("page", "label", "last"),
    [
        ("users/python-api.md", "python-api", "b'a,b\\n1,2\\n'"),
        (README, "readme-python", "0 b'hello\\ndata'"),
    ],
    ids=["python-api-page", "readme"],
)
def test_the_python_examples_run_as_written_on_local(tmp_path, page, label, last):
    """The Python API page's example and README's, run the way they say (the local provider, the floor
    lowered)."""
    script = tmp_path / "example.py"
    script.write_text(block(page, label))
    env = {
        **os.environ,
        "TAI_MCP_SANDBOX": "local",
        "TAI_MCP_SANDBOX_ISOLATION": "none",
        "SANDBOX_LOCAL_ROOT": str(tmp_path / "sandboxes"),
    }
    ran = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "0 b'hello\\ndata'", lines
    assert lines[-1] == last, lines


_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _trait(cls_name: str, name: str):
    """The configurable trait ``cls_name.name`` of a settings class the docs name, or None."""
    from jupyter_tai_sandbox.app import SandboxApp
    from jupyter_tai_sandbox.mcp_door import SandboxMCP
    from jupyter_tai_sandbox.policy import SandboxPolicy
    from jupyter_tai_sandbox.providers.docker import DockerSandbox
    from jupyter_tai_sandbox.providers.local import LocalSandbox
    from jupyter_tai_sandbox.providers.remote import RemoteSandbox
    from jupyter_tai_sandbox.providers.swarm import SwarmSandbox
    from jupyter_tai_sandbox.providers.vm import VmSandbox

    classes = {c.__name__: c for c in (SandboxApp, SandboxMCP, SandboxPolicy, DockerSandbox, LocalSandbox,
                                       RemoteSandbox, SwarmSandbox, VmSandbox)}  # fmt: skip
    cls = classes.get(cls_name)
    return None if cls is None else cls.class_traits(config=True).get(name)


def test_the_limits_page_gives_each_caps_default_as_the_code_has_it():
    """docs/operators/limits.md is the one hand-written table of settings: each numeric default it gives is
    the trait's own (a bare `name` after `Class.other` in a row is Class's; sizes in KiB/MiB/GiB are bytes
    for a *_bytes setting, MiB for a *_mb one)."""
    checked = 0
    for row in (DOCS / "operators" / "limits.md").read_text().splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] == "cap" or set(cells[0]) <= {"-", " "} or "`" in cells[1]:
            continue
        settings: list[tuple[str, str]] = []
        current = ""
        for name in re.findall(r"`([A-Za-z_.*]+)`", cells[2]):
            cls_name, _, trait = name.rpartition(".")
            current = cls_name or current
            if _trait(current, trait) is not None and _trait(current, trait).__class__.__name__ in (
                "Int",
                "Float",
            ):
                settings.append((current, trait))
        numbers = re.findall(r"(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB)?", cells[1])
        if not settings or not numbers:
            continue
        if len(numbers) == 1:
            numbers = numbers * len(settings)
        for (cls_name, trait), (number, unit) in zip(settings, numbers, strict=False):
            value = float(number)
            if unit and trait.endswith("_bytes"):
                value *= _UNITS[unit]
            default = getattr(_trait(cls_name, trait), "default_value", None)
            assert value == default, (
                f"limits.md gives {cls_name}.{trait} = {cells[1]!r}; the code's is {default!r}"
            )
            checked += 1
    assert checked >= 40, checked  # every numeric row is read
