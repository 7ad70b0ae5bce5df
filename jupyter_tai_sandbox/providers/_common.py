"""Argument checks and path confinement shared by the providers."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import math
import posixpath
import secrets
from collections.abc import Mapping, Sequence

from traitlets.config import Configurable

from ..contract import (
    ExecHandle,
    ExecResult,
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxPathError,
    SandboxSpecRejectedError,
)

#: Exit status reported for a command stopped by SIGKILL (128 + 9), as a shell reports it.
KILLED_EXIT_CODE = 137
#: How long a stop waits for the command's output to end once its group is dead.
OUTPUT_GRACE_SECONDS = 0.5


_HELD_OUTPUT_NOTE = (
    "a process the command started still held its output after the kill; "
    "the byte counts cover the output received up to the stop"
)


def deadline_error(timeout_seconds: float, counts: dict[str, int], held: bool) -> SandboxExecTimeoutError:
    """The timeout of a command killed at its deadline: byte counts, and a note when its output was still held."""
    return SandboxExecTimeoutError(
        f"the command was still running at its {timeout_seconds:g} s deadline and was killed",
        stdout_bytes=counts["stdout"],
        stderr_bytes=counts["stderr"],
        note=_HELD_OUTPUT_NOTE if held else None,
    )


def new_session_id() -> str:
    return "sbx-" + secrets.token_hex(8)


def check_exec_args(
    argv: Sequence[str],
    timeout_seconds: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> list[str]:
    """Validate exec arguments; return argv as a list. Raises SandboxSpecRejectedError."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise SandboxSpecRejectedError(
            "argv must be a list of strings (e.g. ['sh', '-c', 'echo hi']), not a single string"
        )
    argv = list(argv)
    if not argv:
        raise SandboxSpecRejectedError("argv is empty: name the program to run")
    for arg in argv:
        if not isinstance(arg, str):
            raise SandboxSpecRejectedError(f"argv elements must be strings, got {type(arg).__name__}")
        if "\x00" in arg:
            raise SandboxSpecRejectedError("argv elements cannot contain NUL bytes")
    if not argv[0]:
        raise SandboxSpecRejectedError("argv[0] is empty: name the program to run")
    if (
        isinstance(timeout_seconds, bool)
        or not isinstance(timeout_seconds, (int, float))
        or not math.isfinite(timeout_seconds)
        or timeout_seconds <= 0
    ):
        raise SandboxSpecRejectedError(
            f"timeout_seconds must be a positive number of seconds, not {timeout_seconds!r}"
        )
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
            raise SandboxSpecRejectedError(f"invalid environment variable name {name!r}")
        if not isinstance(value, str) or "\x00" in value:
            raise SandboxSpecRejectedError(f"environment variable {name} must be a string without NUL")
    if cwd is not None and (not isinstance(cwd, str) or "\x00" in cwd):
        raise SandboxSpecRejectedError("cwd must be a path string")
    return argv


def check_stdin(stdin: object) -> bytes | None:
    """A one-shot's stdin as bytes (or None for no input); SandboxSpecRejectedError otherwise."""
    if isinstance(stdin, (bytearray, memoryview)):
        stdin = bytes(stdin)
    if stdin is not None and not isinstance(stdin, bytes):
        raise SandboxSpecRejectedError("stdin must be bytes (or None for no input)")
    return stdin


async def run_to_end(handle: ExecHandle) -> ExecResult:
    """A one-shot's result: read the handle's output to its exit; stop the command on any failure."""
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        async for item in handle.output:
            if isinstance(item, OutputChunk):
                (out if item.stream == "stdout" else err).append(item.data)
            else:
                return ExecResult(item.exit_code, b"".join(out), b"".join(err))
    except BaseException:
        with contextlib.suppress(SandboxError):
            await asyncio.shield(handle.kill())
        raise
    raise SandboxError("the command's output ended without an exit status")  # pragma: no cover


def workspace_relative(path: str, workspace: str) -> str:
    """``path`` as a normalised path relative to ``workspace`` ('' for the workspace itself).

    Lexical only: ``..`` that climbs out, or an absolute path outside the
    workspace, raises SandboxError. Symlinks are the provider's to check.
    """
    if not isinstance(path, str) or "\x00" in path:
        raise SandboxPathError(f"invalid path {path!r}")
    workspace = posixpath.normpath(workspace)
    if posixpath.isabs(path):
        full = posixpath.normpath(path)
        if full != workspace and not full.startswith(workspace.rstrip("/") + "/"):
            raise SandboxPathError(
                f"path {path!r} lies outside the session workspace {workspace}: use a path inside it"
            )
        rel = posixpath.relpath(full, workspace)
    else:
        rel = posixpath.normpath(path)
    if rel == ".":
        return ""
    if rel == ".." or rel.startswith("../"):
        raise SandboxPathError(f"path {path!r} climbs out of the session workspace: use a path inside it")
    return rel


class ProviderMeta(type(Configurable), abc.ABCMeta):
    """Lets a provider be both a traitlets Configurable and a contract ABC."""
