"""The code-tools page's command-line lines run as written: ``preset add`` stores the page's word_count
definition and ``preset run ... --provider docker`` answers what the page's REST comment shows (the REST
lines are tests/docs/test_readme_examples.py's). The operator's Jupyter config (here a temporary one) gives
the sessions this run's label and test image, as a deployment's config would give its own."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.support import docker
from tests.support.doc_blocks import block

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def _cli_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", "", text)
    return [line for line in joined.splitlines() if line.startswith("jupyter tai-sandbox ")]


def test_the_code_tools_pages_cli_lines_author_and_run_the_preset(tmp_path):
    docker.docker_client().close()  # an engine and the test image, or skip (fail under CI)
    work, config, data = tmp_path / "work", tmp_path / "config", tmp_path / "data"
    for folder in (work, config, data):
        folder.mkdir()
    (work / "word_count.json").write_text(block("users/code-tools.md", "preset-word-count"))
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"DockerSandbox": {"image": docker.TEST_IMAGE, "extra_labels": docker.RUN_LABEL}})
    )
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(data)}
    (add,) = _cli_lines(block("users/code-tools.md", "preset-author"))
    run_block = block("users/code-tools.md", "preset-run")
    (run,) = _cli_lines(run_block)
    answers = []
    for line in (add, run):
        argv = shlex.split(line)
        assert argv[:2] == ["jupyter", "tai-sandbox"]
        ran = subprocess.run(
            [sys.executable, "-m", "jupyter_tai_sandbox.cli", *argv[2:]],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert ran.returncode == 0, (line, ran.stdout, ran.stderr)
        answers.append(ran.stdout)
    assert (data / "tai_sandbox" / "presets.json").is_file()  # the page's store, under the data dir
    shown = json.loads(re.search(r"^# (\{.*\})$", run_block, re.M).group(1))
    assert answers[1].strip() == shown["stdout"].strip(), answers[1]
