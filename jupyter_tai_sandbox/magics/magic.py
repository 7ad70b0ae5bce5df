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

The modules: ``magics`` (this one: the magics, sessions by name, the line
subcommands), ``magics_options`` (the options, declared once, and what turns
them into requests), ``magics_stream`` (the loop thread and a command's output
streamed into the cell), ``magics_outputs`` (files under ``outputs/``, found
and displayed inert).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import difflib
import os
import posixpath
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from ..client import SandboxClient, SeveralServersWarning, discover_server
from ..contract import SandboxError, SandboxNotFoundError, SandboxUnavailableError
from ..image import PYTHON_IMAGE, missing_program_hint
from .frames import out_frame_targets, read_frame, serialise_input
from .options import (
    DEFAULT_TIMEOUT,
    HANDOFF_DIR,
    SandboxMagicError,
    add_session_options,
    command,
    describe,
    duration,
    env_pairs,
    identifier,
    options_differ,
    options_label,
    parse,
    session_options,
    spec_body,
    spec_only,
    spec_options,
    split,
    subparser,
    workspace_path,
)
from .outputs import Snapshot, changed_outputs, display_outputs, inert_display, snapshot
from .stream import LoopThread, SandboxInterrupted, stream_command

T = TypeVar("T")

SUBCOMMAND_NAMES = ("status", "sessions", "new", "use", "rm", "extend", "put", "get", "connect")
SUBCOMMANDS = """\
line magics:
  %sandbox status                     the server, its provider and policy, the current session
  %sandbox sessions                   every session on the server (* marks the current one)
  %sandbox new NAME [options]         start a named session (--image, --persistent, --network,
                                      --cpu, --memory, --ttl, --timeout) and make it current
  %sandbox use NAME                   make NAME (a session name, or a session id from
                                      `%sandbox sessions`) the one cells run in
  %sandbox rm NAME [--workspace]      destroy a session (--workspace: also its persistent workspace)
  %sandbox extend NAME DURATION       add DURATION (90, 90s, 30m, 1h) to the session's TTL, within
                                      the operator's maximum
  %sandbox put LOCAL [REMOTE]         upload a kernel-side file into the session's workspace
  %sandbox get REMOTE [LOCAL]         download a workspace file next to the kernel
  %sandbox connect URL [--token T]    talk to another Jupyter server's sandbox API
  (put and get take --session NAME)

Data handoff: --in VAR writes the kernel's VAR into the workspace (a pandas
DataFrame as Parquet when pyarrow is in the kernel; else JSON when it serialises
as JSON, else a pickle) and sets the environment variable VAR to the file's path;
--out VAR / --err VAR capture the output into Python variables as text;
--out-df VAR[=PATH] reads the Parquet file the cell wrote at PATH (default
.sandbox/out/VAR.parquet, named by $VAR) into a DataFrame (pandas and pyarrow
in the kernel).
Files the cell writes under outputs/ in the workspace (PNG, JPEG, SVG, HTML,
JSON, Markdown) are displayed in the cell, inert: HTML in a sandboxed iframe
with scripts off, SVG as an image, Markdown as text (--trusted-outputs shows
them as active content: only for a sandbox whose every writer you trust).
A kernel interrupt kills the command.

The server is the one that started this kernel (TAI_SANDBOX_URL and
TAI_SANDBOX_TOKEN), else the first running Jupyter server (the one started
first; a warning says so when several run), else `%sandbox connect`.
"""


class SandboxCommandError(subprocess.CalledProcessError):
    """``--raise``: the cell's command exited non-zero (or hit its deadline)."""

    def __str__(self) -> str:
        if self.returncode is None:
            return f"the sandboxed command {self.cmd!r} was killed at its deadline"
        return f"the sandboxed command {self.cmd!r} exited with status {self.returncode}"

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mSandboxCommandError:\x1b[0m {self}"]


@dataclass
class _Session:
    """A session this kernel knows by name."""

    name: str
    id: str
    options: dict[str, Any]
    workspace: str
    kind: str = ""
    timeout: float | None = None
    created_here: bool = True
    image: str | None = None


# ------------------------------------------------------------------ the magics


@magics_class
class SandboxMagics(Magics):
    """``%%sandbox`` runs a cell in a sandbox session; ``%sandbox`` manages sessions."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self._loop: LoopThread | None = None
        self._client: SandboxClient | None = None
        self._client_source = ""
        self._explicit: tuple[str, str] | None = None
        self._sessions: dict[str, _Session] = {}
        self._current = "default"
        self._lock = threading.Lock()
        self._token = secrets.token_hex(4)
        atexit.register(self._cleanup)

    # ---------------------------------------------------------------- entry point

    @line_cell_magic
    @magic_arguments()
    @kwds(epilog=SUBCOMMANDS)
    @argument("interpreter", nargs="?", default=None, help="the program running the cell body (default: sh)")
    @argument("--session", metavar="NAME", help="a named session: created on first use, then reused")
    @argument("--env", action="append", metavar="K=V", help="an environment variable for the command (repeatable)")
    @argument("--in", dest="inputs", action="append", metavar="VAR", help="hand the kernel's VAR to the command (repeatable)")
    @argument("--out", metavar="VAR", help="capture stdout into VAR instead of printing it")
    @argument("--err", metavar="VAR", help="capture stderr into VAR instead of printing it")
    @argument(
        "--out-df", dest="out_frames", action="append", metavar="VAR[=PATH]",
        help="read the Parquet file the cell wrote at PATH (default .sandbox/out/VAR.parquet, in $VAR) into "
        "a DataFrame VAR (repeatable; pandas and pyarrow in the kernel)",
    )
    @argument("--raise", dest="raise_error", action="store_true", help="a non-zero exit raises SandboxCommandError")
    @argument(
        "--trusted-outputs", action="store_true",
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

    # ---------------------------------------------------------------- plumbing

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *, find_server: bool = True) -> T:
        """Run ``coro`` on the loop thread and wait for it here (the server found first, in this thread)."""
        if self._loop is None:
            self._loop = LoopThread()
        if find_server:
            try:
                self._ensure_client()
            except BaseException:
                coro.close()
                raise
        return self._loop.run(coro, timeout)

    def _ensure_client(self) -> SandboxClient:
        """The client, found here in the kernel's thread (so a note on the choice prints in the cell)."""
        if self._client is None:
            if self._explicit is not None:
                url, token = self._explicit
                source = "%sandbox connect"
            elif os.environ.get("TAI_SANDBOX_URL"):
                url, token = os.environ["TAI_SANDBOX_URL"], os.environ.get("TAI_SANDBOX_TOKEN", "")
                source = "TAI_SANDBOX_URL"
            else:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", SeveralServersWarning)
                    url, token = discover_server()
                several = [w for w in caught if issubclass(w.category, SeveralServersWarning)]
                source = "a running Jupyter server"
                for warning in several:
                    print(f"sandbox: {warning.message}", file=sys.stderr, flush=True)
                    source = "the first started of several running Jupyter servers"
            self._client = SandboxClient(url, token)
            self._client_source = source
        return self._client

    async def _get_client(self) -> SandboxClient:
        return self._ensure_client()

    async def _create(self, name: str, options: dict[str, Any], body: dict[str, Any]) -> _Session:
        client = await self._get_client()
        info = await client.create(**body)
        if body.get("image") not in (None, PYTHON_IMAGE) and info.get("kind") == "local":
            # the contract keeps image inert on local (recorded, not used): say so rather than accept it
            # silently (the project's Python image is what README's cells name to run on both providers)
            print(
                f"sandbox: --image {body['image']} has no effect on the local provider (commands run on this "
                f"host, not in an image); session {name!r} started without it",
                file=sys.stderr,
                flush=True,
            )
        known = _Session(name, info["id"], dict(options), info.get("workspace", ""), info.get("kind", ""),
                         options.get("timeout"), image=info.get("image"))
        with self._lock:  # registered here, on the loop thread, even if the cell was interrupted meanwhile
            self._sessions[name] = known
        return known

    async def _ensure(self, name: str, options: dict[str, Any], body: dict[str, Any]) -> tuple[_Session, str]:
        """The live session called ``name``, started (or restarted after a reap) when needed."""
        with self._lock:
            known = self._sessions.get(name)
        if known is None:
            return await self._create(name, options, body), ""
        client = await self._get_client()
        try:
            info = await client.info(known.id)
            known.workspace = info.get("workspace", known.workspace)
            known.image = info.get("image", known.image)
            return known, ""
        except SandboxNotFoundError:
            if not known.created_here:
                with self._lock:
                    self._sessions.pop(name, None)
                raise SandboxMagicError(f"session {name!r} is gone from the server") from None
        again = await self._create(name, known.options, spec_body(known.options))
        note = f"session {name!r} had expired or was removed; started a new one (its workspace is new"
        note += ", the persistent one is back)" if "persistent" in known.options else ")"
        return again, note

    def _pick(self, session: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The session name a cell or transfer runs in, and the options to start it with."""
        with self._lock:
            if session is not None:
                known = self._sessions.get(session)
                if known is not None and options and options_differ(known.options, options):
                    raise SandboxMagicError(
                        f"session {session!r} was started with {options_label(spec_only(known.options)) or 'no options'}; "
                        f"session options apply when a session starts: use another --session or `%sandbox rm {session}`"
                    )
                return session, options
            current = self._sessions.get(self._current)
            if not options or (current is not None and not options_differ(current.options, options)):
                return self._current, options if current is None else current.options
            return f"default({options_label(options)})", options

    def _session_for(self, session: str | None, options: dict[str, Any] | None = None) -> _Session:
        name, opts = self._pick(session, options or {})
        body = spec_body(opts)
        known, note = self._run(self._ensure(name, opts, body))
        if note:
            print(f"sandbox: {note}", file=sys.stderr)
        return known

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
        outcome = stream_command(
            self._loop, self._get_client, known.id, known.name, argv, timeout, env,
            capture_out=out_var is not None, capture_err=err_var is not None,
        )
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
            print(f"sandbox: exit status {exit_code}", file=sys.stderr, flush=True)
            hint = missing_program_hint(outcome.stderr_tail, interpreter, known.image, known.kind) if exit_code == 127 else None
            if hint:
                print(f"sandbox: {hint}", file=sys.stderr, flush=True)
        if args.raise_error and (exit_code or timed_out is not None):
            raise SandboxCommandError(
                exit_code if timed_out is None else None, shlex.join(interpreter), outcome.stdout, outcome.stderr
            )

    def _read_frame(self, known: _Session, var: str, path: str) -> None:
        """``--out-df VAR=PATH``: the Parquet file at PATH into the DataFrame VAR (one line when it cannot)."""

        async def download() -> bytes | None:
            client = await self._get_client()
            with contextlib.suppress(SandboxNotFoundError):
                return await client.download(known.id, path)
            return None

        data = self._run(download())
        if data is None:
            print(f"sandbox: --out-df {var}: the cell wrote no {path}; {var} is unchanged", file=sys.stderr, flush=True)
            return
        try:
            self.shell.user_ns[var] = read_frame(data)
        except Exception as e:
            print(f"sandbox: --out-df {var}: {path} is not a Parquet file pandas reads ({type(e).__name__}: "
                  f"{str(e)[:200]}); {var} is unchanged", file=sys.stderr, flush=True)

    async def _prelude(
        self, known: _Session, inputs: list[tuple[str, str, bytes]], env: dict[str, str], body: str | None, script: str,
        folders: list[str] = (),  # type: ignore[assignment]
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

    # ---------------------------------------------------------------- line magics

    def _line(self, line: str) -> None:
        words = split(line)
        if not words:
            words = ["status"]
        name, rest = words[0], words[1:]
        handler = getattr(self, f"_do_{name}", None) if name in SUBCOMMAND_NAMES else None
        if handler is None:
            close = difflib.get_close_matches(name, SUBCOMMAND_NAMES, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise SandboxMagicError(
                f"unknown subcommand {name!r}: {hint}use status, sessions, new, use, rm, extend, put, get or connect "
                "(or a %%sandbox cell); %sandbox? shows usage"
            )
        handler(rest)

    def _do_status(self, argv: list[str]) -> None:
        parse(subparser("status"), argv)

        async def status() -> tuple[dict[str, Any], dict[str, Any] | None]:
            client = await self._get_client()
            data = await client.status()
            with self._lock:
                known = self._sessions.get(self._current)
            info = None
            if known is not None:
                with contextlib.suppress(SandboxNotFoundError):
                    info = await client.info(known.id)
            return data, info

        data, info = self._run(status())
        assert self._client is not None
        print(f"server    {self._client.url}  (found via {self._client_source})")
        if data.get("kind") == "off":
            print(f"provider  off: {data.get('message', '')}")
        else:
            policy = data.get("policy", {})
            print(
                f"provider  {data['kind']}  (isolation floor {policy.get('isolation')}, "
                f"egress ceiling {policy.get('egress')}, durable {'on' if policy.get('durable') else 'off'})"
            )
        if info is None:
            print(f"session   {self._current} (starts with the next %%sandbox cell)")
        else:
            print(f"session   {self._current}  {describe(info)}")

    def _do_sessions(self, argv: list[str]) -> None:
        parse(subparser("sessions"), argv)
        listed = self._run(self._list())
        with self._lock:
            names = {s.id: s.name for s in self._sessions.values()}
            current = self._sessions.get(self._current)
        if not listed:
            print("no sessions on the server")
            return
        rows = [("NAME", "ID", "KIND", "NETWORK", "WORKSPACE", "LEFT", "CONSUMER")]
        for info in listed:
            name = names.get(info["id"], "-")
            if current is not None and info["id"] == current.id:
                name += " *"
            workspace = info.get("durability", "")
            if info.get("workspace_key"):
                workspace += f" {info['workspace_key']}"
            rows.append((name, info["id"], info.get("kind", ""), info.get("network", ""), workspace,
                         f"{info.get('seconds_left', 0):.0f} s", info.get("consumer", "")))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())

    async def _list(self) -> list[dict[str, Any]]:
        return await (await self._get_client()).sessions()

    def _do_new(self, argv: list[str]) -> None:
        parser = subparser("new", ("name", {"metavar": "NAME", "help": "the session's name in this kernel"}))
        add_session_options(parser)
        args = parse(parser, argv)
        with self._lock:
            if args.name in self._sessions:
                raise SandboxMagicError(
                    f"session {args.name!r} already exists: `%sandbox use {args.name}` to run cells in it, "
                    f"or `%sandbox rm {args.name}` first"
                )
        options = spec_options(args)
        if args.timeout is not None:
            options["timeout"] = args.timeout
        known = self._run(self._create(args.name, options, spec_body(options)))
        self._current = args.name
        print(f"session {args.name!r} started ({known.kind}, id {known.id}); cells now run in it")

    def _do_use(self, argv: list[str]) -> None:
        args = parse(subparser("use", ("name", {"metavar": "NAME"})), argv)
        with self._lock:
            known = self._sessions.get(args.name)
        if known is None:
            adopted = self._run(self._adopt(args.name))
            if adopted is None:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id: "
                    f"`%sandbox new {args.name}` starts one, `%sandbox sessions` lists them"
                )
        self._current = args.name
        print(f"cells now run in session {args.name!r}")

    async def _adopt(self, session_id: str) -> _Session | None:
        client = await self._get_client()
        try:
            info = await client.info(session_id)
        except SandboxNotFoundError:
            return None
        known = _Session(session_id, info["id"], {}, info.get("workspace", ""), info.get("kind", ""), None,
                         created_here=False, image=info.get("image"))
        with self._lock:
            self._sessions[session_id] = known
        return known

    def _do_rm(self, argv: list[str]) -> None:
        parser = subparser("rm", ("name", {"metavar": "NAME"}))
        parser.add_argument("--workspace", action="store_true", help="also remove a persistent workspace")
        args = parse(parser, argv)
        with self._lock:
            known = self._sessions.get(args.name)
        session_id = known.id if known is not None else args.name

        async def remove() -> bool:
            client = await self._get_client()
            try:
                await client.destroy(session_id, remove_workspace=args.workspace)
                return True
            except SandboxNotFoundError:
                return False

        if known is None and not self._run(remove()):
            raise SandboxMagicError(f"no session named {args.name!r} in this kernel, nor a server session with that id")
        gone = self._run(remove()) if known is not None else True
        with self._lock:
            self._sessions.pop(args.name, None)
        if self._current == args.name:
            self._current = "default"
        print(f"session {args.name!r} " + ("removed" if gone else "was already gone"))

    def _do_extend(self, argv: list[str]) -> None:
        parser = subparser(
            "extend", ("name", {"metavar": "NAME"}),
            ("duration", {"metavar": "DURATION", "type": duration, "help": "added to the TTL: 90, 90s, 30m, 1h"}),
        )
        args = parse(parser, argv)
        with self._lock:
            known = self._sessions.get(args.name)
        session_id = known.id if known is not None else args.name

        async def extend() -> dict[str, Any]:
            client = await self._get_client()
            try:
                info = await client.info(session_id)
            except SandboxNotFoundError:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id"
                ) from None
            return await client.extend(session_id, info["expires_at"] - info["created_at"] + args.duration)

        info = self._run(extend())
        ttl = info["expires_at"] - info["created_at"]
        print(f"session {args.name!r} now ends in {info['seconds_left']:.0f} s (TTL {ttl:.0f} s from its start)")

    def _do_put(self, argv: list[str]) -> None:
        parser = subparser("put", ("local", {"metavar": "LOCAL"}), ("remote", {"metavar": "REMOTE", "nargs": "?"}))
        parser.add_argument("--session", metavar="NAME")
        args = parse(parser, argv)
        local = os.path.expanduser(args.local)
        if not os.path.exists(local):
            raise SandboxMagicError(f"no local file {args.local!r} (the kernel's folder is {os.getcwd()})")
        if not os.path.isfile(local):
            raise SandboxMagicError(f"{args.local!r} is not a file: put copies one file")
        remote = args.remote or os.path.basename(local)
        if remote.endswith("/"):
            remote += os.path.basename(local)
        known = self._session_for(args.session)
        remote = workspace_path(remote, known.workspace, known.name)

        async def upload() -> dict[str, Any]:
            client = await self._get_client()

            async def chunks():  # streamed, so a large file is never held whole
                with open(local, "rb") as f:
                    while chunk := f.read(1 << 20):
                        yield chunk

            return await client.upload(known.id, remote, chunks())

        result = self._run(upload())
        print(f"{args.local} -> {known.name}:{remote} ({result.get('size', '?')} bytes)")

    def _do_get(self, argv: list[str]) -> None:
        parser = subparser("get", ("remote", {"metavar": "REMOTE"}), ("local", {"metavar": "LOCAL", "nargs": "?"}))
        parser.add_argument("--session", metavar="NAME")
        args = parse(parser, argv)
        base = posixpath.basename(posixpath.normpath(args.remote))
        local = os.path.expanduser(args.local or base)
        if os.path.isdir(local):
            local = os.path.join(local, base)
        folder = os.path.dirname(os.path.abspath(local))
        if not os.path.isdir(folder):
            raise SandboxMagicError(f"no local folder {folder!r} to write {os.path.basename(local)!r} into")
        known = self._session_for(args.session)
        remote = workspace_path(args.remote, known.workspace, known.name)

        async def download() -> int:
            client = await self._get_client()
            parent, name = posixpath.split(remote)
            if remote == ".":
                raise SandboxMagicError("get copies one file, not the workspace")
            entries = await client.list_files(known.id, (parent or ".") + "/")
            entry = next((e for e in entries if e["name"] == name), None)
            if entry is None:
                raise SandboxNotFoundError(f"no file {remote!r} in session {known.name!r}")
            if entry["type"] != "file":
                raise SandboxMagicError(f"{remote!r} is a {entry['type']}: get copies one file")
            fd, tmp = tempfile.mkstemp(prefix=".sandbox-get-", dir=folder)
            try:
                with os.fdopen(fd, "wb") as sink:
                    size = await client.download_to(known.id, remote, sink)
                os.replace(tmp, local)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return size

        size = self._run(download())
        print(f"{known.name}:{remote} -> {local} ({size} bytes)")

    def _do_connect(self, argv: list[str]) -> None:
        parser = subparser("connect", ("url", {"metavar": "URL"}))
        parser.add_argument("--token", default="", help="the server's token")
        args = parse(parser, argv)
        if not args.url.startswith(("http://", "https://")):
            raise SandboxMagicError(f"connect takes the server's http(s) URL, not {args.url!r}")

        async def connect() -> tuple[SandboxClient, dict[str, Any]]:
            client = SandboxClient(args.url, args.token)
            return client, await asyncio.wait_for(client.status(), 30)

        try:
            client, status = self._run(connect(), find_server=False)
        except asyncio.TimeoutError:
            raise SandboxUnavailableError(f"no answer from {args.url} within 30 s") from None
        if not isinstance(status, dict) or "kind" not in status:
            raise SandboxUnavailableError(f"{args.url} is not a Jupyter server with the jupyter_tai_sandbox extension")
        with self._lock:
            dropped = sorted(self._sessions)
            self._sessions.clear()
        self._client, self._explicit, self._client_source = client, (args.url, args.token), "%sandbox connect"
        self._current = "default"
        print(f"connected to {client.url} (provider {status.get('kind')})")
        if dropped:
            print(f"sessions of the previous server are no longer tracked here: {', '.join(dropped)}")

    # ---------------------------------------------------------------- teardown

    def _cleanup(self) -> None:
        """At kernel exit: destroy the sessions this kernel started (persistent workspaces stay).

        Blocking requests (``SandboxClient.destroy_blocking``): by the time atexit runs, the
        executors the async client resolves names with are shut down.
        """
        with self._lock:
            ids = [s.id for s in self._sessions.values() if s.created_here]
            self._sessions.clear()
        client = self._client
        if not ids or client is None:
            return
        for session_id in ids:
            with contextlib.suppress(Exception):
                client.destroy_blocking(session_id, timeout=3)


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
