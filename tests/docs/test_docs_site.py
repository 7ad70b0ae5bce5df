"""The docs site (docs/, issue 51): it builds with no warning under nitpicky mode, and its generated reference
covers the code: every configurable trait (with help) by its anchor, every error of the error table with its
status, every environment variable the policy reads, every command of the CLI, every operation of api.yaml;
its internal links resolve; a dangling setting name fails a build.

The site is built once for the module (into a temporary folder, as .ci/docs builds it: -n --keep-going, the
warnings collected rather than raised at once, so each test says what it checks). Outside CI the module
skips without the docs extra (pip install -e ".[docs]"); with CI=true it fails instead.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO

pytestmark = [pytest.mark.slow(90), pytest.mark.timeout(600)]

DOCS = REPO / "docs"
EXT = DOCS / "_ext"
WARNING = re.compile(r"\bWARNING\b|\bERROR\b")


@pytest.fixture(scope="module")
def ext() -> Iterator[None]:
    """docs/_ext importable (the extensions' own functions find what the site documents)."""
    for module in ("sphinx", "myst_parser", "pydata_sphinx_theme", "sphinx_copybutton"):
        try:
            __import__(module)
        except ImportError:
            message = f"the docs site needs {module}: pip install -e '.[docs]'"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
    sys.path.insert(0, str(EXT))
    try:
        yield
    finally:
        sys.path.remove(str(EXT))


def sphinx_build(source: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-n",
            "--keep-going",
            "-q",
            "-b",
            "html",
            *options,
            str(source),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def benchmark_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder as `python benchmarks/run.py` writes it (its own Report, two rows and a target)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from _bench import Report, Row
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    report = Report(quick=True)
    report.add(Row("local", "docs-check exec true: raw", "ms", [1.0, 1.2, 1.1]))
    report.add(
        Row(
            "local", "docs-check exec true: ours", "ms", [1.3, 1.4, 1.5], baseline="docs-check exec true: raw"
        )
    )
    report.target("docs-check within 1.5x of raw", True, "1.27x")
    report.meta = {"seconds": 1.0, "python": "3", "machine": "x86_64", "cpus": 2, "quick": True}
    folder = tmp_path_factory.mktemp("bench")
    (folder / "latest.json").write_text(json.dumps(report.to_json()))
    return folder


@pytest.fixture(scope="module")
def site(ext: None, tmp_path_factory: pytest.TempPathFactory, benchmark_results: Path) -> dict[str, Any]:
    """The built site: its folder and the build's warnings."""
    out = tmp_path_factory.mktemp("docs") / "html"
    done = sphinx_build(DOCS, out, "-D", f"tai_benchmark_results={benchmark_results}")
    warnings = [line for line in done.stderr.splitlines() if WARNING.search(line)]
    assert done.returncode == 0 or warnings, done.stderr[-3000:]
    return {"html": out, "warnings": warnings, "stderr": done.stderr}


class Page(HTMLParser):
    """A built page's ids, each with the text of the element it names (for a table row: the row)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: dict[str, list[str]] = {}
        self.hrefs: list[str] = []
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "a" and values.get("href"):
            self.hrefs.append(values["href"] or "")
        ident = values.get("id")
        if ident is not None:
            self.ids.setdefault(ident, [])
        if tag not in ("br", "img", "meta", "link", "input", "hr", "col", "source", "wbr"):
            self._open.append((tag, ident))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            open_tag, _ = self._open.pop()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, ident in self._open:
            if ident is not None:
                self.ids[ident].append(data)

    def text(self, ident: str) -> str:
        return " ".join("".join(self.ids[ident]).split())


def page(site: dict[str, Any], name: str) -> Page:
    parsed = Page()
    parsed.feed((site["html"] / name).read_text(encoding="utf-8"))
    return parsed


# ------------------------------------------------------------------ the build


def test_the_site_builds_with_no_warning(site):
    assert site["warnings"] == [], "\n".join(site["warnings"])
    for name in (
        "index.html",
        "changelog.html",
        "search.html",
        "reference/configuration.html",
        "reference/environment.html",
        "reference/errors.html",
        "reference/cli.html",
        "reference/api.html",
        "reference/benchmarks.html",
        "developers/rest-api.html",
        "developers/agent-protocol.html",
    ):
        assert (site["html"] / name).is_file(), name


def test_every_internal_link_resolves(site):
    from tai_links import check

    checked, broken, _external, pages = check(site["html"])
    assert pages > 10 and checked > 1000
    assert broken == []


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(ext, tmp_path):
    from tai_links import check

    (tmp_path / "a.html").write_text(
        '<p id="here"><a href="b.html#nowhere">b</a> <a href="#here">self</a></p>'
    )
    (tmp_path / "b.html").write_text(
        '<p id="there"><a href="c.html">gone</a> <a href="https://x.invalid/">x</a></p>'
    )
    checked, broken, external, pages = check(tmp_path)
    assert (checked, pages, external) == (3, 2, {"https://x.invalid/"})
    assert len(broken) == 2
    assert "no id 'nowhere' on b.html" in broken[0]
    assert "b.html: c.html (no file" in broken[1]


# ------------------------------------------------------------ the configuration


def configurable_settings() -> Iterator[tuple[str, Any, bool]]:
    """(Class.trait, trait, defined by this package) for every configurable trait, found as
    tests/contract/test_setting_names.py finds the classes."""
    from jupyter_tai_sandbox.app import SandboxApp, _provider_classes
    from jupyter_tai_sandbox.kernels.provisioner import SandboxProvisioner

    for cls in [SandboxApp, *_provider_classes(), SandboxProvisioner]:
        for name, trait in cls.class_traits(config=True).items():
            ours = (trait.this_class or cls).__module__.startswith("jupyter_tai_sandbox")
            yield f"{cls.__name__}.{name}", trait, ours


def test_every_setting_has_help_text():
    settings = list(configurable_settings())
    assert len([s for s in settings if s[2]]) > 100  # every class was read
    assert [name for name, trait, ours in settings if ours and not (trait.help or "").strip()] == []


def test_every_setting_has_its_entry_in_the_configuration_reference(site):
    reference = page(site, "reference/configuration.html")
    for name, trait, ours in configurable_settings():
        assert name in reference.ids, f"{name} has no anchor in the configuration reference"
        assert reference.text(name).startswith(name)
        if ours:  # its help, as text (backticked code shown as code)
            help_start = "".join((trait.help or "").replace("`", "").split())[:40]  # spacing aside
            assert help_start in "".join(_entry_body(site, name).split()), (
                f"{name}: its help is not in its entry"
            )


def _entry_body(site: dict[str, Any], name: str) -> str:
    """The text of a setting's entry (its <dt> has the id; the help is in the <dd> after it)."""
    text = site.setdefault(
        "_configuration", (site["html"] / "reference/configuration.html").read_text("utf-8")
    )
    start = text.index(f'id="{name}"')
    following = text.find('class="sig sig-object', start + len(name) + 5)
    end = following if following > 0 else len(text)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text[start:end])).split())


def test_a_policy_setting_shows_its_default_type_and_environment_variable(site):
    body = _entry_body(site, "SandboxPolicy.max_ttl_seconds")
    assert "Float" in body and "86400.0" in body
    assert "TAI_MCP_SANDBOX_MAX_TTL_SECONDS" in body
    html = (site["html"] / "reference/configuration.html").read_text(encoding="utf-8")
    assert 'href="environment.html#TAI_MCP_SANDBOX_MAX_TTL_SECONDS"' in html


def test_every_environment_variable_of_the_policy_is_in_the_environment_reference(site):
    source = (REPO / "jupyter_tai_sandbox" / "policy.py").read_text(encoding="utf-8")
    names = set(re.findall(r'"(TAI_MCP_SANDBOX_[A-Z_]+)"', source))
    assert len(names) >= 9
    reference = page(site, "reference/environment.html")
    assert sorted(names - set(reference.ids)) == []
    row = reference.text("TAI_MCP_SANDBOX_ISOLATION")
    assert "SandboxPolicy.isolation" in row


# ------------------------------------------------------------- the other pages


def test_every_error_of_the_table_is_in_the_errors_page_with_its_status(site):
    from jupyter_tai_sandbox.errors import ERROR_CLASSES, STATUS_TABLE, error_status

    reference = page(site, "reference/errors.html")
    classes = {*ERROR_CLASSES.values(), *(kind for kind, _ in STATUS_TABLE)}
    for cls in classes:
        assert cls.__name__ in reference.ids, f"{cls.__name__} is not in the errors page"
        status = next(code for kind, code in STATUS_TABLE if issubclass(cls, kind))
        assert reference.text(cls.__name__).startswith(f"{cls.__name__} {status} ")
    # the status the page gives is the one the server answers with
    from jupyter_tai_sandbox.errors import SandboxQuotaError

    assert (
        f"SandboxQuotaError {error_status(SandboxQuotaError('x'))} "
        in reference.text("SandboxQuotaError") + " "
    )


def test_every_command_of_the_cli_has_its_section(site):
    from tai_cli import _subcommands, command_parser

    reference = page(site, "reference/cli.html")
    seen = []

    def walk(parser, words):
        for name, _help, sub in _subcommands(parser):
            anchor = "-".join(["cli", *words, name])
            seen.append(anchor)
            assert anchor in reference.ids, anchor
            for action in sub._actions:
                for option in action.option_strings:
                    if option not in ("-h", "--help"):
                        assert option in reference.text(anchor), f"{anchor}: {option}"
            walk(sub, [*words, name])

    walk(command_parser(), [])
    assert {"cli-build-image", "cli-kernelspec-install", "cli-preset-run", "cli-serve"} <= set(seen)


def test_every_operation_of_api_yaml_has_its_section(site):
    from tai_openapi import METHODS, operation_anchor

    spec = yaml.safe_load((REPO / "jupyter_tai_sandbox" / "api.yaml").read_text(encoding="utf-8"))
    reference = page(site, "developers/rest-api.html")
    operations = [(m, p) for p, item in spec["paths"].items() for m in METHODS if m in item]
    assert len(operations) > 20
    for method, path in operations:
        assert operation_anchor(method, path) in reference.ids, f"{method.upper()} {path}"
    for name in spec["components"]["schemas"]:
        assert f"rest-schema-{name}" in reference.ids, name


def test_the_api_reference_documents_every_public_name_of_the_root(site):
    import jupyter_tai_sandbox

    reference = page(site, "reference/api.html")
    public = [n for n in jupyter_tai_sandbox.__all__ if not n.startswith("_")]
    documented = {i.rsplit(".", 1)[-1] for i in reference.ids if i.startswith("jupyter_tai_sandbox.")}
    assert sorted(set(public) - documented) == []


def test_the_benchmarks_page_shows_the_latest_results(site):
    page_text = (site["html"] / "reference/benchmarks.html").read_text(encoding="utf-8")
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page_text)).split())
    assert "docs-check exec true: ours 1.40 1.49 ms 1.27x docs-check exec true: raw" in text
    assert "PASS docs-check within 1.5x of raw 1.27x" in text


def test_the_agent_protocol_and_the_changelog_are_included(site):
    protocol = (site["html"] / "developers/agent-protocol.html").read_text(encoding="utf-8")
    assert "Handshake" in protocol and "Framing" in protocol
    changelog = (site["html"] / "changelog.html").read_text(encoding="utf-8")
    assert "0.1.0" in changelog


# ---------------------------------------------------------------- the checks


def test_a_dangling_setting_name_fails_the_build(ext, tmp_path):
    """Inline code, text and {confval} naming no setting of a configured class: each a warning (-W: an error)."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(EXT)!r})\n"
        'extensions = ["myst_parser", "tai_settings"]\nnitpicky = True\n'
    )
    (source / "index.md").write_text(
        "# Check\n\n"
        "Set `SandboxPolicy.isolation` (real), `SandboxPolicy.effective_spec` (a method: real).\n\n"
        "Set `SandboxPolicy.no_such_ceiling` and DockerSandbox.max_cpus in text.\n\n"
        "A link: {confval}`SandboxPolicy.max_ttl_secs`.\n\n"
        "```python\nc.SandboxApp.provider_name = 'local'\n```\n"
    )
    done = sphinx_build(source, tmp_path / "out", "-W")
    assert done.returncode != 0
    said = done.stderr
    for name in ("SandboxPolicy.no_such_ceiling", "DockerSandbox.max_cpus", "SandboxApp.provider_name"):
        assert f"{name} is no setting" in said, said[-2000:]
    assert "SandboxPolicy.max_ttl_secs" in said
    for real in ("SandboxPolicy.isolation is", "SandboxPolicy.effective_spec is"):
        assert real not in said
