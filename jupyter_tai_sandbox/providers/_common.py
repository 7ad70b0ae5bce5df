"""Argument checks and path confinement shared by the providers."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import io
import posixpath
import secrets

from traitlets import MetaHasTraits

from ..contract import (
    MAX_PATH_BYTES,
    MAX_PATH_DEPTH,
    ExecHandle,
    ExecResult,
    OutputChunk,
    OutputTooLargeError,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxPathError,
    SandboxPathTooDeepError,
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


async def run_to_end(handle: ExecHandle, output_limit: int | None = None) -> ExecResult:
    """A one-shot's result: read the handle's output to its exit; stop the command on any failure.

    Past ``output_limit`` bytes (stdout and stderr together) the command is stopped and
    :class:`~jupyter_tai_sandbox.errors.OutputTooLargeError` says how much it had given.
    """
    # BytesIO hands its buffer over at getvalue() without a copy: the output is held about once,
    # where a list of chunks joined at the end held it twice at the peak
    out, err = io.BytesIO(), io.BytesIO()
    counts = {"stdout": 0, "stderr": 0}
    try:
        async for item in handle.output:
            if isinstance(item, OutputChunk):
                counts[item.stream] += len(item.data)
                if output_limit is not None and counts["stdout"] + counts["stderr"] > output_limit:
                    raise _too_much_output(output_limit, counts)
                (out if item.stream == "stdout" else err).write(item.data)
            else:
                return ExecResult(item.exit_code, out.getvalue(), err.getvalue(), item.reason)
    except BaseException:
        with contextlib.suppress(SandboxError):
            await asyncio.shield(handle.kill())
        raise
    raise SandboxError("the command's output ended without an exit status")  # pragma: no cover


def spill_overflow_error(counts: dict[str, int]) -> OutputTooLargeError:
    """Why a command was stopped when its unread output passed the server's disk cap."""
    return OutputTooLargeError(
        "the command's unread output passed the most the server keeps on disk for one command "
        "(SandboxApp.max_spill_bytes): it was stopped. Read its output as it comes, or write "
        "large output to a workspace file",
        stdout_bytes=counts.get("stdout", 0),
        stderr_bytes=counts.get("stderr", 0),
    )


def _too_much_output(limit: int, counts: dict[str, int]) -> SandboxError:
    return OutputTooLargeError(
        f"the command gave more than {limit} bytes of output, the most a one-shot call keeps "
        "(SandboxApp.max_output_bytes): it was stopped. Write large output to a workspace file and "
        "download it, or use the exec websocket, which streams",
        stdout_bytes=counts["stdout"],
        stderr_bytes=counts["stderr"],
    )


def workspace_relative(path: str, workspace: str) -> str:
    """``path`` as a normalised path relative to ``workspace`` ('' for the workspace itself).

    Lexical only: ``..`` that climbs out, or an absolute path outside the
    workspace, raises SandboxError. Symlinks are the provider's to check.
    Every provider's paths pass here, so the contract's size caps are checked here, once:
    more than MAX_PATH_BYTES bytes or MAX_PATH_DEPTH components is SandboxPathTooDeepError.
    """
    if not isinstance(path, str) or "\x00" in path:
        raise SandboxPathError(f"invalid path {path!r}")
    size = len(path.encode("utf-8", "surrogateescape"))
    if size > MAX_PATH_BYTES:
        raise SandboxPathTooDeepError(
            f"path {path[:40]!r}... is {size} bytes; a workspace path takes at most {MAX_PATH_BYTES}"
        )
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
    if rel.count("/") >= MAX_PATH_DEPTH:
        raise SandboxPathTooDeepError(
            f"path {path[:40]!r}... has more than {MAX_PATH_DEPTH} components, the most a workspace path "
            "may have: use a shallower folder"
        )
    return rel


class ProviderMeta(MetaHasTraits, abc.ABCMeta):
    """Lets a provider be both a traitlets Configurable (its metaclass is MetaHasTraits) and a contract ABC."""
