"""``%%sandbox`` and ``%sandbox``: notebook cells that run inside a sandbox session.

Load with ``%load_ext jupyter_tai_sandbox``. A cell::

    %%sandbox python3 --in data --out result
    import json, os
    print(sum(json.load(open(os.environ["data"]))))

runs in a session of the server's sandbox provider, its output streamed into
the cell as it arrives (through the exec websocket). The kernel's own event
loop belongs to ipykernel, so the async client runs on a private loop in a
background thread; the cell waits in the main thread, where a kernel
interrupt (``KeyboardInterrupt``) arrives and kills the remote command.

Errors a user can cause (bad options, no server, provider off, a path outside
the workspace...) show as one line in the cell, never a traceback.

The modules, each standing on the one before: ``named_sessions`` (the
sessions by name, the client and its loop thread), ``subcommands`` (the line
magics), ``magic`` (this one: the cell magic and the entry point); beside them
``options`` (the options, declared once, and what turns them into requests),
``stream`` (the loop thread and a command's output streamed into the cell),
``outputs`` (files under ``outputs/``, found and displayed inert) and ``frames``
(DataFrames across the ``--in`` / ``--out-df`` handoff).
"""

from __future__ import annotations

import contextlib
import posixpath
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from ..contract import SandboxError, SandboxNotFoundError
from ..images import missing_program_hint
from .frames import out_frame_targets, read_frame, serialise_input
from .named_sessions import NamedSession
from .options import (
    DEFAULT_TIMEOUT,
    HANDOFF_DIR,
    SandboxMagicError,
    command,
    env_pairs,
    identifier,
    parse,
    session_options,
    spec_options,
    split,
    workspace_path,
)
from .outputs import Snapshot, changed_outputs, display_outputs, inert_display, snapshot
from .stream import SandboxInterrupted, stream_command
from .subcommands import SUBCOMMANDS, LineSubcommands


class SandboxCommandError(subprocess.CalledProcessError):
    """``--raise``: the cell's command exited non-zero (or hit its deadline)."""

    def __str__(self) -> str:
        if self.returncode is None:
            return f"the sandboxed command {self.cmd!r} was killed at its deadline"
        return f"the sandboxed command {self.cmd!r} exited with status {self.returncode}"

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mSandboxCommandError:\x1b[0m {self}"]


# ------------------------------------------------------------------ the magics


@magics_class
class SandboxMagics(LineSubcommands):
    """``%%sandbox`` runs a cell in a sandbox session; ``%sandbox`` manages sessions."""

    # ---------------------------------------------------------------- entry point

    @line_cell_magic
    @magic_arguments()
    @kwds(epilog=SUBCOMMANDS)
    @argument("interpreter", nargs="?", default=None, help="the program running the cell body (default: sh)")
    @argument("--session", metavar="NAME", help="a named session: created on first use, then reused")
    @argument(
        "--env", action="append", metavar="K=V", help="an environment variable for the command (repeatable)"
    )
    @argument(
        "--in",
        dest="inputs",
        action="append",
        metavar="VAR",
        help="hand the kernel's VAR to the command (repeatable)",
    )
    @argument("--out", metavar="VAR", help="capture stdout into VAR instead of printing it")
    @argument("--err", metavar="VAR", help="capture stderr into VAR instead of printing it")
    @argument(
        "--out-df",
        dest="out_frames",
        action="append",
        metavar="VAR[=PATH]",
        help="read the Parquet file the cell wrote at PATH (default .sandbox/out/VAR.parquet, in $VAR) into "
        "a DataFrame VAR (repeatable; pandas and pyarrow in the kernel)",
    )
    @argument(
        "--raise", dest="raise_error", action="store_true", help="a non-zero exit raises SandboxCommandError"
    )
    @argument(
        "--trusted-outputs",
        action="store_true",
        help="show outputs/ HTML, Markdown and SVG as active content (their scripts run in this page, as you): "
        "only for a sandbox whose every writer you trust",
    )
    @session_options
    def sandbox(self, line: str, cell: str | None = None) -> None:
        """%%sandbox [INTERPRETER] [options]: run the cell in a sandbox session, like %%script.

        With no interpreter the body runs under sh; `%%sandbox python3` runs it under the
        session's python3. Output streams into the cell as it arrives (stdout to stdout,
        stderr to stderr); a non-zero exit status is shown. Session options (--image,
        --persistent, --network, --cpu, --memory, --ttl) apply when a session starts: a cell
        giving them without --session runs in a session started with exactly those options.
        """
        try:
            if cell is None:
                self._line(line)
            else:
                self._cell(line, cell)
        except UsageError as e:
            raise SandboxMagicError(f"{e} (usage: %sandbox?)") from None
        except SandboxError as e:
            raise SandboxMagicError(str(e)) from None

    # ---------------------------------------------------------------- the cell

    def _cell(self, line: str, cell: str) -> None:
        args = parse(self.sandbox.parser, split(line))
        interpreter = shlex.split(args.interpreter) if args.interpreter else ["sh"]
        if not interpreter:
            raise SandboxMagicError("the interpreter is empty")
        env = {"PYTHONUNBUFFERED": "1", **env_pairs(args.env)}
        out_var = identifier(args.out, "--out") if args.out else None
        err_var = identifier(args.err, "--err") if args.err else None
        inputs: list[tuple[str, str, bytes]] = []
        for name in args.inputs or []:
            identifier(name, "--in")
            if name not in self.shell.user_ns:
                raise SandboxMagicError(f"--in {name}: no variable {name!r} in the kernel")
            inputs.append((name, *serialise_input(name, self.shell.user_ns[name])))
        out_frames = out_frame_targets(args.out_frames)
        known = self._session_for(args.session, spec_options(args))
        # a path outside the workspace is refused before the cell runs
        out_frames = [(var, workspace_path(path, known.workspace, known.name)) for var, path in out_frames]
        for var, path in out_frames:
            env[var] = posixpath.join(known.workspace, path) if known.workspace else path
        timeout = args.timeout or known.timeout or DEFAULT_TIMEOUT

        script = f"{HANDOFF_DIR}/cell-{self._token}"
        argv, upload_body = command(interpreter, cell, script)
        folders = sorted({posixpath.dirname(path) for _, path in out_frames} - {""})
        before = self._run(self._prelude(known, inputs, env, cell if upload_body else None, script, folders))

        assert self._loop is not None
        try:
            outcome = stream_command(
                self._loop,
                self._get_client,
                known.id,
                known.name,
                argv,
                timeout,
                env,
                capture_out=out_var is not None,
                capture_err=err_var is not None,
            )
        except SandboxMagicError as e:
            # a provider that names an absent program (the session agent) refuses the start: the same hint
            # as a shell's 127 gets
            hint = (
                missing_program_hint(str(e), interpreter, known.image, known.kind)
                if "no such program" in str(e)
                else None
            )
            if hint is None:
                raise
            raise SandboxMagicError(f"{e}; {hint}") from None
        if out_var:
            self.shell.user_ns[out_var] = outcome.stdout
        if err_var:
            self.shell.user_ns[err_var] = outcome.stderr
        display_outputs(self._run(self._changed_outputs(known.id, before)), trusted=args.trusted_outputs)
        for var, path in out_frames:
            self._read_frame(known, var, path)
        exit_code, timed_out = outcome.exit_code, outcome.timed_out
        if timed_out is not None:
            print(f"sandbox: {timed_out} (set --timeout to allow longer)", file=sys.stderr, flush=True)
        elif exit_code:
            reason = f" ({outcome.exit_reason})" if outcome.exit_reason else ""
            print(f"sandbox: exit status {exit_code}{reason}", file=sys.stderr, flush=True)
            hint = (
                missing_program_hint(outcome.stderr_tail, interpreter, known.image, known.kind)
                if exit_code == 127
                else None
            )
            if hint:
                print(f"sandbox: {hint}", file=sys.stderr, flush=True)
        if args.raise_error and (exit_code or timed_out is not None):
            raise SandboxCommandError(
                exit_code if timed_out is None else None,  # type: ignore[arg-type]  # None: killed at its deadline
                shlex.join(interpreter),
                outcome.stdout,
                outcome.stderr,
            )

    def _read_frame(self, known: NamedSession, var: str, path: str) -> None:
        """``--out-df VAR=PATH``: the Parquet file at PATH into the DataFrame VAR (one line when it cannot)."""

        async def download() -> bytes | None:
            client = await self._get_client()
            with contextlib.suppress(SandboxNotFoundError):
                return await client.download(known.id, path)
            return None

        data = self._run(download())
        if data is None:
            print(
                f"sandbox: --out-df {var}: the cell wrote no {path}; {var} is unchanged",
                file=sys.stderr,
                flush=True,
            )
            return
        try:
            self.shell.user_ns[var] = read_frame(data)
        except Exception as e:
            print(
                f"sandbox: --out-df {var}: {path} is not a Parquet file pandas reads ({type(e).__name__}: "
                f"{str(e)[:200]}); {var} is unchanged",
                file=sys.stderr,
                flush=True,
            )

    async def _prelude(
        self,
        known: NamedSession,
        inputs: list[tuple[str, str, bytes]],
        env: dict[str, str],
        body: str | None,
        script: str,
        folders: Sequence[str] = (),
    ) -> Snapshot:
        client = await self._get_client()
        for folder in folders:  # where --out-df files go, so the cell can write them at once
            await client.make_folder(known.id, folder)
        for name, ext, data in inputs:
            path = f"{HANDOFF_DIR}/in/{name}.{ext}"
            await client.upload(known.id, path, data)
            env[name] = posixpath.join(known.workspace, path) if known.workspace else path
        if body is not None:
            await client.upload(known.id, script, body.encode())
        return await snapshot(client, known.id)

    async def _changed_outputs(self, session_id: str, before: Snapshot) -> list[tuple[str, bytes]]:
        return await changed_outputs(await self._get_client(), session_id, before)


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(SandboxMagics)


__all__ = [
    "SandboxCommandError",
    "SandboxInterrupted",
    "SandboxMagicError",
    "SandboxMagics",
    "inert_display",
    "load_ipython_extension",
]
