"""The command-line reference, generated from ``jupyter tai-sandbox``'s argparse parser at build time.

``jupyter_tai_sandbox.cli.build_parser`` is the parser the command uses, so the page shows exactly what it
parses. Each (sub)command is a section whose HTML id is ``cli-`` and its words
(``cli.html#cli-kernelspec-install``), with its usage, help and a table of its arguments.
"""

from __future__ import annotations

import argparse
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from tai_nodes import inline, literal_text, paragraphs, section, table


def command_parser() -> argparse.ArgumentParser:
    """The parser ``jupyter tai-sandbox`` uses."""
    from jupyter_tai_sandbox import cli

    return cli.build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _argument_rows(parser: argparse.ArgumentParser) -> list[tuple[Any, ...]]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or action.dest.upper()
                names += f" {metavar if isinstance(metavar, str) else ' '.join(metavar)}"
                if action.nargs in ("+", "*"):
                    names += " ..."
        else:
            names = str(action.metavar or action.dest)
        default = (
            ""
            if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0
            else repr(action.default)
        )
        choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices else ""
        help_text = " ".join((action.help or "").split()) % {"default": action.default, "prog": parser.prog}
        rows.append(([literal_text(names)], help_text + choices, [literal_text(default)] if default else ""))
    return rows


def _render(
    parser: argparse.ArgumentParser, words: list[str], help_text: str, document: nodes.document
) -> nodes.section:
    title = " ".join(["jupyter tai-sandbox", *words])
    sec = section(title, "-".join(["cli", *words]) if words else "cli-jupyter-tai-sandbox", document)
    if help_text:
        sec += nodes.paragraph("", "", *inline(" ".join(help_text.split())))
    elif parser.description and words:
        sec += paragraphs(parser.description)
    usage = parser.format_usage().strip().removeprefix("usage: ")
    sec += nodes.literal_block(usage, usage, language="text")
    rows = _argument_rows(parser)
    if rows:
        sec += table(["argument", "what it does", "default"], rows, widths=[3, 7, 2])
    for name, sub_help, sub in _subcommands(parser):
        sec += _render(sub, [*words, name], sub_help, document)
    return sec


class CliDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from jupyter_tai_sandbox import cli

        self.env.note_dependency(cli.__file__)
        parser = command_parser()
        out: list[nodes.Node] = paragraphs(parser.description)
        usage = parser.format_usage().strip().removeprefix("usage: ")
        out.append(nodes.literal_block(usage, usage, language="text"))
        for name, sub_help, sub in _subcommands(parser):
            out.append(_render(sub, [name], sub_help, self.state.document))
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("tai-cli", CliDirective)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
