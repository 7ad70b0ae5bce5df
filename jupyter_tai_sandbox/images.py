"""The session images' names, which magics, kernels, the CLI and the container base use, and what a missing
program in one means. The images are built by :mod:`jupyter_tai_sandbox.providers.docker.images`."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: the minimal image: busybox and /workspace, built offline from Debian's busybox-static
DEFAULT_IMAGE = "jupyter-tai-sandbox/minimal:latest"
#: the Python image: python3 and ipykernel from Debian
PYTHON_IMAGE = "jupyter-tai-sandbox/python:latest"
#: the coding agents' image: the Python image's Debian base with Node.js and the ACP agents from npm
AGENTS_IMAGE = "jupyter-tai-sandbox/agents:latest"

#: programs the Python image has and the minimal one lacks
PYTHON_PROGRAMS = frozenset({"python3", "python3.11", "pydoc3"})
#: programs the agents image has and the others lack
AGENT_PROGRAMS = frozenset({"node", "nodejs", "claude-code-acp", "codex-acp"})
#: a shell's word that it found no such program: dash ("sh: 1: python3: not found"), busybox
#: ("sh: python3: not found"), bash ("bash: line 1: python3: command not found")
_NOT_FOUND = re.compile(r"(?:^|[\s:])([^\s:/]+(?:/[^\s:]+)*): (?:command )?not found\s*$")


def missing_program_hint(stderr_tail: str, argv: Sequence[str], image: str | None, kind: str) -> str | None:
    """What to do about an exit status 127: which program was missing, and the image that has it.

    ``stderr_tail`` is the end of the command's stderr, ``argv`` what was run, ``image`` the session's
    image and ``kind`` its provider. None when the 127 was not a missing program.
    """
    found = _NOT_FOUND.search(stderr_tail.rstrip("\n").rsplit("\n", 1)[-1])
    program = found.group(1) if found else (argv[0] if argv and argv[0] in stderr_tail else None)
    if not program:
        return None
    name = program.rsplit("/", 1)[-1]
    if kind == "local":
        return f"{name} was not found on this host's PATH (the local provider runs commands on the host)"
    where = f"the session's image {image}" if image else "the session's image"
    if name in PYTHON_PROGRAMS and image != PYTHON_IMAGE:
        return (
            f"{name} is not in {where}; {PYTHON_IMAGE} has it: build it with "
            f"`jupyter tai-sandbox build-image --python`, then start the session with --image {PYTHON_IMAGE} "
            "(a docker server with no DockerSandbox.image set uses it by default once built and restarted)"
        )
    if name in AGENT_PROGRAMS and image != AGENTS_IMAGE:
        return (
            f"{name} is not in {where}; {AGENTS_IMAGE} has it: build it with "
            f"`jupyter tai-sandbox build-image --agents`, then start the session with --image {AGENTS_IMAGE}"
        )
    return f"{name} is not in {where}: start the session with an --image that has it"
