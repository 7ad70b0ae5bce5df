"""The magics' options: declared once for the cell and ``%sandbox new``, typos answered with the closest.

Unit tests of the parsers themselves; tests/magics/test_magics.py runs the same
mistakes through a live kernel (BAD_INPUT).
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_tai_sandbox.magics import SandboxMagics
from jupyter_tai_sandbox.magics.options import (
    SESSION_ARGUMENTS,
    add_session_options,
    closest_option,
    parse,
    spec_body,
    spec_options,
    subparser,
)

CELL = SandboxMagics.sandbox.parser


def long_options(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def new_parser():
    parser = subparser("new", ("name", {"metavar": "NAME"}))
    add_session_options(parser)
    return parser


def test_the_session_options_are_declared_once_and_shared():
    declared = {a.args[0] for a in SESSION_ARGUMENTS}
    assert declared == {"--image", "--persistent", "--network", "--cpu", "--memory", "--ttl", "--timeout"}
    assert declared <= long_options(CELL)
    assert long_options(new_parser()) == declared
    # one group in the help, under the same title for both
    for parser in (CELL, new_parser()):
        [group] = [g for g in parser._action_groups if g.title.startswith("session options")]
        assert {o for a in group._group_actions for o in a.option_strings} == declared


def test_both_parsers_read_session_options_alike():
    words = ["--network", "none", "--memory", "1g", "--cpu", "0.5", "--ttl", "60", "--persistent", "k"]
    cell = parse(CELL, ["python3", *words])
    new = parse(new_parser(), ["notes", *words, "--timeout", "5"])
    assert (
        spec_options(cell)
        == spec_options(new)
        == {
            "network": "none",
            "memory": 1024,
            "cpu": 0.5,
            "ttl": 60.0,
            "persistent": "k",
        }
    )
    assert new.timeout == 5.0 and "timeout" not in spec_options(new)  # a deadline picks no session
    assert spec_body(spec_options(cell)) == {
        "ttl_seconds": 60.0,
        "network": "none",
        "memory_mb": 1024,
        "cpu": 0.5,
        "durability": "persistent",
        "workspace_key": "k",
    }


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("--netwrok", "--network"),
        ("--netwrok=none", "--network"),
        ("--sesion", "--session"),
        ("--timout", "--timeout"),
        ("--persistant", "--persistent"),
        ("-network", "--network"),
        ("--trusted-output", "--trusted-outputs"),
        ("--raise-error", "--raise"),
    ],
)
def test_closest_option(typo, meant):
    assert closest_option(CELL, typo) == meant


def test_far_typos_and_positionals_get_no_suggestion():
    assert closest_option(CELL, "--frobnicate") is None
    assert closest_option(CELL, "python3") is None
    with pytest.raises(UsageError) as caught:
        parse(CELL, ["--frobnicate"])
    assert str(caught.value) == "unrecognized arguments: --frobnicate"


def test_unknown_options_name_the_closest_in_the_error():
    with pytest.raises(UsageError, match=r"^unrecognized arguments: --netwrok \(did you mean --network\?\)$"):
        parse(CELL, ["--netwrok", "none"])
    with pytest.raises(UsageError, match=r"did you mean: --sesion -> --session, --timout -> --timeout\?"):
        parse(CELL, ["--sesion", "x", "--timout", "3"])
    with pytest.raises(UsageError, match=r"did you mean --persistent\?"):
        parse(new_parser(), ["notes", "--persistant", "k"])
    assert parse(CELL, ["--netw", "none"]).network == "none"  # an unambiguous prefix still works
