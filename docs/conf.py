"""Sphinx configuration of the jupyter-tai-sandbox docs site (issue 51).

Build: ``bash .ci/docs`` (``python3 -m sphinx -W -n --keep-going -b html docs docs/_build/html`` and the internal
link check), or that sphinx command alone. The reference pages are generated at build time by the extensions in
``docs/_ext`` (see its README.md): nothing generated is committed.

Linking a setting from any page: ``{confval}`SandboxPolicy.isolation``` (MyST) links its entry in the
configuration reference, whose HTML anchor is the name itself (``reference/configuration.html#SandboxPolicy.isolation``);
``{ref}`SandboxPolicy.isolation``` works too. Inline code naming a setting of a documented class
(`` `SandboxPolicy.isolation` ``, ``--SandboxPolicy.isolation=none``, ``c.SandboxPolicy.isolation``) is
checked and linked as well. A name that is no setting (nor another attribute) of its class fails the build
under ``-W``; so does a dangling ``{confval}``, ``{ref}`` or Python cross-reference (``-n``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from jupyter_tai_sandbox import __version__  # noqa: E402

project = "jupyter-tai-sandbox"
author = "jupyter-tai-sandbox contributors"
copyright = "2026, jupyter-tai-sandbox contributors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_copybutton",
    # ours (docs/_ext): each generates a reference page's content from the code at build time
    "tai_settings",  # configuration, environment variables; checks every `Class.trait` named in the pages
    "tai_errors",  # the error table
    "tai_cli",  # the `jupyter tai-sandbox` parser
    "tai_openapi",  # jupyter_tai_sandbox/api.yaml
    "tai_benchmarks",  # benchmarks/results/latest.json
    "tai_api",  # autodoc of the package root, the contract and the client
    "tai_pyrefs",  # Python cross-references: every one must name a real object
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

nitpicky = True
# no typographic quotes and dashes: `--flag` in text (a parser's help, a setting's help) stays as typed
smartquotes = False
# every warning is an error (-W); these names are the one kind tolerated: none.
suppress_warnings: list[str] = []

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist", "attrs_inline"]
# `#` to `###` headings get anchors that [text](page.md#anchor) links can use
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
autodoc_preserve_defaults = True

html_theme = "pydata_sphinx_theme"
html_title = f"jupyter-tai-sandbox {release}"
html_static_path = ["_static"]
html_css_files = ["tai.css"]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    # offline: no external icons, fonts or analytics
    "icon_links": [],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"changelog": []}
html_last_updated_fmt = None

copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True

# linkcheck cannot go online here: .ci/docs checks internal links over the built HTML and lists external ones
linkcheck_ignore = [r"https?://.*"]
