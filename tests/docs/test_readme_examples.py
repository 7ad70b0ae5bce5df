"""README's `%%sandbox` example runs as written, on both providers: the cells are read out of README.md
and executed in a kernel a live server started (the docker run uses the Python image, as README says)."""

from __future__ import annotations

import re

import pytest

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from jupyter_tai_sandbox.providers.docker.images.packages import LABEL_PIP
from tests.support import REPO
from tests.support.live_server import LOCAL_ARGS, LiveServer

README = REPO / "README.md"


def readme_session() -> list[tuple[str, str | None]]:
    """The IPython session in README's magics section: (cell code, what it shows) pairs."""
    text = README.read_text()
    section = text[text.index("## Notebook magics") :]
    block = section[section.index("```\n") + 4 :]
    block = block[: block.index("```")]
    cells: list[list[str]] = []
    shown: list[list[str]] = []
    for line in block.splitlines():
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


def run_readme(kernel) -> None:
    for code, shown in readme_session():
        if shown is not None and code.isidentifier():  # an expression cell: compare its repr
            assert kernel.ok(f"print(repr({code}))").stdout.strip() == shown, code
            continue
        run = kernel.run(code, timeout=120)
        assert not run.errors or "--raise" in code, (code, run.errors, run.stderr)
        if shown is not None:
            assert (run.stdout + run.stderr).strip().splitlines() == shown.splitlines(), (code, run.streams)


def test_the_session_is_read_out_of_readme():
    cells = readme_session()
    assert cells[0][0] == "%load_ext jupyter_tai_sandbox" and any("%%sandbox python3" in c for c, _ in cells)


def test_readme_magics_run_as_written_on_local(tmp_path):
    live = LiveServer(tmp_path, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}")).start()
    try:
        kernel = live.start_kernel()
        try:
            run_readme(kernel)
        finally:
            kernel.shutdown()
    finally:
        live.stop()


def test_readme_magics_run_as_written_on_docker(tmp_path):
    from tests.support.docker import RUN_LABEL, docker_client, in_ci

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
    ((key, value),) = RUN_LABEL.items()
    # the server's default configuration: no image named, so sessions get the Python image
    live = LiveServer(
        tmp_path, args=("--SandboxApp.provider=docker", f"--DockerSandbox.extra_labels={key}={value}")
    ).start()
    try:
        kernel = live.start_kernel()
        try:
            run_readme(kernel)
        finally:
            kernel.shutdown()
    finally:
        live.stop()


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_every_file_a_readme_curl_uploads_is_made_before_it():
    for block in _code_blocks("bash"):
        for match in re.finditer(r"--data-binary @([\w./-]+)", block):
            before = block[: match.start()]
            assert re.search(rf"> *{re.escape(match.group(1))}\b", before), (
                f"README uploads {match.group(1)} without making it first:\n{block}"
            )


def test_a_readme_snippet_with_top_level_await_says_it_is_for_a_notebook():
    text = README.read_text()
    for block in _code_blocks("python"):
        top_level = [line for line in block.splitlines() if re.match(r"(async with|async for|await) ", line)]
        if top_level:
            start = text.index(block)
            said = text[max(0, start - 600) : start + len(block)]
            assert "notebook" in said and "asyncio.run" in said, block
