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
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import codecs
import concurrent.futures
import contextlib
import json
import os
import pickle
import posixpath
import queue
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser, argument, kwds, magic_arguments

from .client import SandboxClient
from .contract import (
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxNotFoundError,
    SandboxUnavailableError,
    SessionSpec,
)

T = TypeVar("T")

#: the folder of the workspace whose new or changed files are displayed after a cell
OUTPUTS_DIR = "outputs"
#: where --in values and long cell bodies are written in the workspace
HANDOFF_DIR = ".sandbox"
DEFAULT_TIMEOUT = 3600.0
#: sessions the magics start live this long unless --ttl says otherwise (a reaped one is restarted)
DEFAULT_TTL = 8 * 3600.0
DISPLAY_MAX_BYTES = 10 << 20
#: how long an interrupted cell waits for the killed command's exit before dropping the connection
KILL_WAIT_SECONDS = 10.0

MIME_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".svg": "image/svg+xml",
    ".html": "text/html",
    ".htm": "text/html",
    ".json": "application/json",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
}
_C_INTERPRETERS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "python", "pypy")
_INLINE_MAX = 64 << 10
_SPEC_OPTIONS = ("image", "persistent", "network", "cpu", "memory", "ttl")

SUBCOMMANDS = """\
line magics:
  %sandbox status                     the server, its provider and policy, the current session
  %sandbox sessions                   every session on the server (* marks the current one)
  %sandbox new NAME [options]         start a named session (--image, --persistent, --network,
                                      --cpu, --memory, --ttl, --timeout) and make it current
  %sandbox use NAME                   make NAME (a session name, or a session id from
                                      `%sandbox sessions`) the one cells run in
  %sandbox rm NAME [--workspace]      destroy a session (--workspace: also its persistent workspace)
  %sandbox put LOCAL [REMOTE]         upload a kernel-side file into the session's workspace
  %sandbox get REMOTE [LOCAL]         download a workspace file next to the kernel
  %sandbox connect URL [--token T]    talk to another Jupyter server's sandbox API
  (put and get take --session NAME)

Data handoff: --in VAR writes the kernel's VAR into the workspace (JSON when it
serialises as JSON, else a pickle) and sets the environment variable VAR to the
file's path; --out VAR / --err VAR capture the output into Python variables.
Files the cell writes under outputs/ in the workspace (PNG, JPEG, SVG, HTML,
JSON, Markdown) are displayed in the cell. A kernel interrupt kills the command.

The server is the one that started this kernel (TAI_SANDBOX_URL and
TAI_SANDBOX_TOKEN), else the first running Jupyter server, else `%sandbox connect`.
"""


class SandboxMagicError(Exception):
    """A failure shown as one line in the cell (the kernel carries on)."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31msandbox:\x1b[0m {self}"]


class SandboxCommandError(subprocess.CalledProcessError):
    """``--raise``: the cell's command exited non-zero (or hit its deadline)."""

    def __str__(self) -> str:
        if self.returncode is None:
            return f"the sandboxed command {self.cmd!r} was killed at its deadline"
        return f"the sandboxed command {self.cmd!r} exited with status {self.returncode}"

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mSandboxCommandError:\x1b[0m {self}"]


class SandboxInterrupted(KeyboardInterrupt):
    """The kernel was interrupted; the sandboxed command was killed."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31mKeyboardInterrupt:\x1b[0m {self}"]


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


@dataclass
class _Run:
    """One streamed command, shared between the kernel's thread and the loop thread."""

    output: queue.Queue[Any] = field(default_factory=queue.Queue)
    remote: Any = None
    kill_requested: bool = False
    tasks: set[asyncio.Future[Any]] = field(default_factory=set)

    def request_kill(self) -> None:  # on the loop thread
        self.kill_requested = True
        if self.remote is not None:
            task = asyncio.ensure_future(self.remote.kill())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def disconnect(self) -> None:  # on the loop thread: the server kills a disconnected command
        self.kill_requested = True
        if self.remote is not None:
            self.remote.disconnect()


_DONE = object()


class _LoopThread:
    """A private asyncio loop on a daemon thread (the kernel's own loop is ipykernel's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="jupyter-tai-sandbox-magics", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Wait for ``coro`` in the calling thread, interruptibly (KeyboardInterrupt passes through)."""
        future = self.submit(coro)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return future.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if deadline is not None and time.monotonic() > deadline:
                    future.cancel()
                    raise SandboxMagicError(f"no answer from the sandbox API within {timeout:g} s") from None


# ------------------------------------------------------------------ parsing


def _memory_mb(text: str) -> int:
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    if value.endswith("g"):
        value, scale = value[:-1], 1024
    elif value.endswith("m"):
        value = value[:-1]
    try:
        mb = int(float(value) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--memory takes MiB (512) or a size like 512m or 1g, not {text!r}") from None
    if mb <= 0:
        raise argparse.ArgumentTypeError("--memory must be positive")
    return mb


def _positive(what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} takes a number of seconds, not {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{what} must be a positive number")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpu takes a number of CPUs, not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("--cpu must be positive")
    return value


def _add_spec_options(parser: MagicArgumentParser) -> None:
    parser.add_argument("--image", help="the session's image (docker provider)")
    parser.add_argument("--persistent", metavar="KEY", help="a persistent workspace named KEY, kept after the session")
    parser.add_argument("--network", choices=["egress", "internal", "none"], help="the session's network")
    parser.add_argument("--cpu", type=_positive_float, help="CPU cap, in CPUs")
    parser.add_argument("--memory", type=_memory_mb, help="memory cap: MiB, or 512m / 1g")
    parser.add_argument("--ttl", type=_positive("--ttl"), help=f"session lifetime in seconds (default {DEFAULT_TTL:g})")
    parser.add_argument("--timeout", type=_positive("--timeout"), help="default command deadline, in seconds")


def _parser(prog: str, *positionals: tuple[str, dict[str, Any]]) -> MagicArgumentParser:
    parser = MagicArgumentParser(prog=f"%sandbox {prog}")
    for name, options in positionals:
        parser.add_argument(name, **options)
    return parser


def _spec_options(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _SPEC_OPTIONS if getattr(args, name, None) is not None}


def _spec_body(options: dict[str, Any]) -> dict[str, Any]:
    """The POST /sessions body for magic options, validated here first (a bad spec creates nothing)."""
    body: dict[str, Any] = {"ttl_seconds": options.get("ttl", DEFAULT_TTL)}
    if "image" in options:
        body["image"] = options["image"]
    if "persistent" in options:
        body.update(durability="persistent", workspace_key=options["persistent"])
    if "network" in options:
        body["network"] = options["network"]
    if "cpu" in options:
        body["cpu"] = options["cpu"]
    if "memory" in options:
        body["memory_mb"] = options["memory"]
    SessionSpec(**body)  # raises SandboxSpecRejectedError with the contract's message
    return body


def _options_label(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(options.items()))


def _identifier(name: str, option: str) -> str:
    if not name.isidentifier():
        raise SandboxMagicError(f"{option} takes a Python variable name, not {name!r}")
    return name


def _env_pairs(pairs: list[str] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise SandboxMagicError(f"--env takes NAME=VALUE, not {pair!r}")
        env[name] = value
    return env


def _serialise(name: str, value: Any) -> tuple[str, bytes]:
    """(file extension, bytes) of a value handed to the session: JSON when it is JSON, else a pickle."""
    try:
        return "json", json.dumps(value, allow_nan=False).encode()
    except (TypeError, ValueError):
        pass
    try:
        return "pkl", pickle.dumps(value)
    except Exception as e:
        raise SandboxMagicError(f"--in {name}: the value is neither JSON nor picklable ({e})") from None


def _argv(interpreter: list[str], body: str, script_path: str) -> tuple[list[str], bool]:
    """The command for a cell, and whether the body must be uploaded to ``script_path`` first."""
    base = posixpath.basename(interpreter[0])
    if len(body.encode()) <= _INLINE_MAX and any(
        base == name or (name in ("python", "pypy") and base.startswith(name)) for name in _C_INTERPRETERS
    ):
        return [*interpreter, "-c", body], False
    return [*interpreter, script_path], True


# ------------------------------------------------------------------ the magics


@magics_class
class SandboxMagics(Magics):
    """``%%sandbox`` runs a cell in a sandbox session; ``%sandbox`` manages sessions."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        self._loop: _LoopThread | None = None
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
    @argument("--image", help="the session's image (docker provider)")
    @argument("--persistent", metavar="KEY", help="a persistent workspace named KEY, kept after the session")
    @argument("--network", choices=["egress", "internal", "none"], help="the session's network")
    @argument("--cpu", type=_positive_float, help="CPU cap, in CPUs")
    @argument("--memory", type=_memory_mb, help="memory cap: MiB, or 512m / 1g")
    @argument("--ttl", type=_positive("--ttl"), help=f"session lifetime in seconds (default {DEFAULT_TTL:g})")
    @argument("--timeout", type=_positive("--timeout"), help=f"command deadline in seconds (default {DEFAULT_TIMEOUT:g})")
    @argument("--env", action="append", metavar="K=V", help="an environment variable for the command (repeatable)")
    @argument("--in", dest="inputs", action="append", metavar="VAR", help="hand the kernel's VAR to the command (repeatable)")
    @argument("--out", metavar="VAR", help="capture stdout into VAR instead of printing it")
    @argument("--err", metavar="VAR", help="capture stderr into VAR instead of printing it")
    @argument("--raise", dest="raise_error", action="store_true", help="a non-zero exit raises SandboxCommandError")
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

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop is None:
            self._loop = _LoopThread()
        return self._loop.run(coro, timeout)

    async def _get_client(self) -> SandboxClient:
        if self._client is None:
            if self._explicit is not None:
                url, token = self._explicit
                self._client_source = "%sandbox connect"
            else:
                self._client_source = (
                    "TAI_SANDBOX_URL" if os.environ.get("TAI_SANDBOX_URL") else "a running Jupyter server"
                )
                url, token = None, None  # type: ignore[assignment]
            self._client = SandboxClient(url, token)
        return self._client

    async def _create(self, name: str, options: dict[str, Any], body: dict[str, Any]) -> _Session:
        client = await self._get_client()
        info = await client.create(**body)
        known = _Session(name, info["id"], dict(options), info.get("workspace", ""), info.get("kind", ""),
                         options.get("timeout"))
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
            return known, ""
        except SandboxNotFoundError:
            if not known.created_here:
                with self._lock:
                    self._sessions.pop(name, None)
                raise SandboxMagicError(f"session {name!r} is gone from the server") from None
        spec_options = {k: v for k, v in known.options.items() if k in _SPEC_OPTIONS}
        again = await self._create(name, known.options, _spec_body(spec_options))
        note = f"session {name!r} had expired or was removed; started a new one (its workspace is new"
        note += ", the persistent one is back)" if "persistent" in known.options else ")"
        return again, note

    def _pick(self, session: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The session name a cell or transfer runs in, and the options to start it with."""
        with self._lock:
            if session is not None:
                known = self._sessions.get(session)
                if known is not None and options and _options_differ(known.options, options):
                    raise SandboxMagicError(
                        f"session {session!r} was started with {_options_label(_spec_only(known.options)) or 'no options'}; "
                        f"session options apply when a session starts: use another --session or `%sandbox rm {session}`"
                    )
                return session, options
            current = self._sessions.get(self._current)
            if not options or (current is not None and not _options_differ(current.options, options)):
                return self._current, options if current is None else current.options
            return f"default({_options_label(options)})", options

    def _session_for(self, session: str | None, options: dict[str, Any] | None = None) -> _Session:
        name, opts = self._pick(session, options or {})
        body = _spec_body(_spec_only(opts))
        known, note = self._run(self._ensure(name, opts, body))
        if note:
            print(f"sandbox: {note}", file=sys.stderr)
        return known

    # ---------------------------------------------------------------- the cell

    def _cell(self, line: str, cell: str) -> None:
        args = self.sandbox.parser.parse_args(_split(line))
        interpreter = shlex.split(args.interpreter) if args.interpreter else ["sh"]
        if not interpreter:
            raise SandboxMagicError("the interpreter is empty")
        env = {"PYTHONUNBUFFERED": "1", **_env_pairs(args.env)}
        out_var = _identifier(args.out, "--out") if args.out else None
        err_var = _identifier(args.err, "--err") if args.err else None
        inputs: list[tuple[str, str, bytes]] = []
        for name in args.inputs or []:
            _identifier(name, "--in")
            if name not in self.shell.user_ns:
                raise SandboxMagicError(f"--in {name}: no variable {name!r} in the kernel")
            inputs.append((name, *_serialise(name, self.shell.user_ns[name])))
        known = self._session_for(args.session, _spec_options(args))
        timeout = args.timeout or known.timeout or DEFAULT_TIMEOUT

        script = f"{HANDOFF_DIR}/cell-{self._token}"
        argv, upload_body = _argv(interpreter, cell, script)
        before = self._run(self._prelude(known, inputs, env, cell if upload_body else None, script))

        out, err, exit_code, timed_out = self._stream(known, argv, timeout, env, out_var, err_var)
        if out_var:
            self.shell.user_ns[out_var] = out
        if err_var:
            self.shell.user_ns[err_var] = err
        self._display_outputs(known, before)
        if timed_out is not None:
            print(f"sandbox: {timed_out} (set --timeout to allow longer)", file=sys.stderr, flush=True)
        elif exit_code:
            print(f"sandbox: exit status {exit_code}", file=sys.stderr, flush=True)
        if args.raise_error and (exit_code or timed_out is not None):
            raise SandboxCommandError(exit_code if timed_out is None else None, shlex.join(interpreter), out, err)

    async def _prelude(
        self, known: _Session, inputs: list[tuple[str, str, bytes]], env: dict[str, str], body: str | None, script: str
    ) -> dict[str, tuple[Any, Any]]:
        client = await self._get_client()
        for name, ext, data in inputs:
            path = f"{HANDOFF_DIR}/in/{name}.{ext}"
            await client.upload(known.id, path, data)
            env[name] = posixpath.join(known.workspace, path) if known.workspace else path
        if body is not None:
            await client.upload(known.id, script, body.encode())
        return await self._snapshot(client, known.id)

    async def _snapshot(self, client: SandboxClient, session_id: str) -> dict[str, tuple[Any, Any]]:
        """``{path: (size, mtime)}`` of the files under outputs/ (three levels, 500 entries at most)."""
        found: dict[str, tuple[Any, Any]] = {}
        folders = [(OUTPUTS_DIR, 0)]
        while folders and len(found) < 500:
            folder, depth = folders.pop()
            try:
                entries = await client.list_files(session_id, folder + "/")
            except SandboxNotFoundError:
                continue
            except SandboxError:
                if folder == OUTPUTS_DIR:
                    continue  # outputs is a file, or leads outside the workspace: nothing to show
                raise
            for entry in entries:
                path = f"{folder}/{entry['name']}"
                if entry.get("type") == "directory" and depth < 2:
                    folders.append((path, depth + 1))
                elif entry.get("type") == "file":
                    found[path] = (entry.get("size"), entry.get("mtime"))
        return found

    def _stream(
        self, known: _Session, argv: list[str], timeout: float, env: dict[str, str],
        out_var: str | None, err_var: str | None,
    ) -> tuple[str, str, int | None, str | None]:
        """Run ``argv``, writing its output into the cell as it arrives; (out, err, exit, timeout message)."""
        assert self._loop is not None
        run = _Run()
        future = self._loop.submit(self._pump(known.id, argv, timeout, env, run))
        decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
        captured: dict[str, list[str]] = {"stdout": [], "stderr": []}
        sinks = {"stdout": None if out_var else sys.stdout, "stderr": None if err_var else sys.stderr}
        exit_code: int | None = None
        timed_out: str | None = None

        def take(item: Any) -> None:
            nonlocal exit_code, timed_out
            if isinstance(item, OutputChunk):
                text = decoders[item.stream].decode(item.data)
                sink = sinks[item.stream]
                if sink is None:
                    captured[item.stream].append(text)
                elif text:
                    sink.write(text)
                    sink.flush()
            elif isinstance(item, ExitItem):
                exit_code = item.exit_code
            elif isinstance(item, SandboxExecTimeoutError):
                timed_out = str(item)
            elif isinstance(item, SandboxError):
                raise SandboxMagicError(str(item))
            elif isinstance(item, BaseException):
                raise item

        try:
            while True:
                try:
                    item = run.output.get(timeout=0.2)
                except queue.Empty:
                    continue
                if item is _DONE:
                    break
                take(item)
        except KeyboardInterrupt:
            self._loop.call(run.request_kill)
            deadline = time.monotonic() + KILL_WAIT_SECONDS
            while not future.done() and time.monotonic() < deadline:
                try:
                    future.result(timeout=0.1)
                except concurrent.futures.TimeoutError:
                    continue
                except KeyboardInterrupt:
                    break  # a second interrupt: drop the connection at once
            if not future.done():
                self._loop.call(run.disconnect)
            with contextlib.suppress(queue.Empty, SandboxMagicError):
                while (item := run.output.get_nowait()) is not _DONE:
                    take(item)
            for stream in ("stdout", "stderr"):
                if sinks[stream] is not None:
                    sinks[stream].flush()
            raise SandboxInterrupted(
                f"the command was killed in session {known.name!r}" + (f" (exit {exit_code})" if exit_code else "")
            ) from None
        for stream, decoder in decoders.items():
            tail = decoder.decode(b"", final=True)
            if sinks[stream] is None:
                captured[stream].append(tail)
            elif tail:
                sinks[stream].write(tail)
        return "".join(captured["stdout"]), "".join(captured["stderr"]), exit_code, timed_out

    async def _pump(self, session_id: str, argv: list[str], timeout: float, env: dict[str, str], run: _Run) -> None:
        try:
            client = await self._get_client()
            run.remote = await client.exec_start(session_id, argv, timeout_seconds=timeout, env=env)
            if run.kill_requested:
                await run.remote.kill()
            with contextlib.suppress(SandboxError):
                await run.remote.close_stdin()
            async for item in run.remote.output:
                run.output.put(item)
        except Exception as e:
            run.output.put(e)
        finally:
            run.output.put(_DONE)

    def _display_outputs(self, known: _Session, before: dict[str, tuple[Any, Any]]) -> None:
        from IPython.display import display

        for path, data in self._run(self._changed_outputs(known.id, before)):
            mime = MIME_TYPES[posixpath.splitext(path)[1].lower()]
            bundle: dict[str, Any] = {"text/plain": f"<sandbox {path}>"}
            if mime in ("image/png", "image/jpeg"):
                bundle[mime] = base64.b64encode(data).decode()
            elif mime == "application/json":
                try:
                    bundle[mime] = json.loads(data)
                except ValueError:
                    print(f"sandbox: {path} is not valid JSON; not shown", file=sys.stderr)
                    continue
            else:
                bundle[mime] = data.decode(errors="replace")
            display(bundle, raw=True, metadata={"sandbox_path": path})

    async def _changed_outputs(
        self, session_id: str, before: dict[str, tuple[Any, Any]]
    ) -> list[tuple[str, bytes]]:
        client = await self._get_client()
        after = await self._snapshot(client, session_id)
        shown = []
        for path in sorted(after):
            if after[path] == before.get(path):
                continue
            if posixpath.splitext(path)[1].lower() not in MIME_TYPES:
                continue
            size = after[path][0] or 0
            if size > DISPLAY_MAX_BYTES:
                print(f"sandbox: {path} is {size} bytes; too large to show (use %sandbox get)", file=sys.stderr)
                continue
            with contextlib.suppress(SandboxNotFoundError):
                shown.append((path, await client.download(session_id, path)))
        return shown

    # ---------------------------------------------------------------- line magics

    def _line(self, line: str) -> None:
        words = _split(line)
        if not words:
            words = ["status"]
        command, rest = words[0], words[1:]
        handler = getattr(self, f"_do_{command}", None)
        if handler is None:
            raise SandboxMagicError(
                f"unknown subcommand {command!r}: use status, sessions, new, use, rm, put, get or connect "
                "(or a %%sandbox cell); %sandbox? shows usage"
            )
        handler(rest)

    def _do_status(self, argv: list[str]) -> None:
        _parser("status").parse_args(argv)

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
            print(f"session   {self._current}  {_describe(info)}")

    def _do_sessions(self, argv: list[str]) -> None:
        _parser("sessions").parse_args(argv)
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
        parser = _parser("new", ("name", {"metavar": "NAME", "help": "the session's name in this kernel"}))
        _add_spec_options(parser)
        args = parser.parse_args(argv)
        with self._lock:
            if args.name in self._sessions:
                raise SandboxMagicError(
                    f"session {args.name!r} already exists: `%sandbox use {args.name}` to run cells in it, "
                    f"or `%sandbox rm {args.name}` first"
                )
        options = _spec_options(args)
        if args.timeout is not None:
            options["timeout"] = args.timeout
        known = self._run(self._create(args.name, options, _spec_body(_spec_only(options))))
        self._current = args.name
        print(f"session {args.name!r} started ({known.kind}, id {known.id}); cells now run in it")

    def _do_use(self, argv: list[str]) -> None:
        args = _parser("use", ("name", {"metavar": "NAME"})).parse_args(argv)
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
                         created_here=False)
        with self._lock:
            self._sessions[session_id] = known
        return known

    def _do_rm(self, argv: list[str]) -> None:
        parser = _parser("rm", ("name", {"metavar": "NAME"}))
        parser.add_argument("--workspace", action="store_true", help="also remove a persistent workspace")
        args = parser.parse_args(argv)
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

    def _do_put(self, argv: list[str]) -> None:
        parser = _parser("put", ("local", {"metavar": "LOCAL"}), ("remote", {"metavar": "REMOTE", "nargs": "?"}))
        parser.add_argument("--session", metavar="NAME")
        args = parser.parse_args(argv)
        local = os.path.expanduser(args.local)
        if not os.path.exists(local):
            raise SandboxMagicError(f"no local file {args.local!r} (the kernel's folder is {os.getcwd()})")
        if not os.path.isfile(local):
            raise SandboxMagicError(f"{args.local!r} is not a file: put copies one file")
        remote = args.remote or os.path.basename(local)
        if remote.endswith("/"):
            remote += os.path.basename(local)
        known = self._session_for(args.session)
        remote = _workspace_path(known, remote)

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
        parser = _parser("get", ("remote", {"metavar": "REMOTE"}), ("local", {"metavar": "LOCAL", "nargs": "?"}))
        parser.add_argument("--session", metavar="NAME")
        args = parser.parse_args(argv)
        base = posixpath.basename(posixpath.normpath(args.remote))
        local = os.path.expanduser(args.local or base)
        if os.path.isdir(local):
            local = os.path.join(local, base)
        folder = os.path.dirname(os.path.abspath(local))
        if not os.path.isdir(folder):
            raise SandboxMagicError(f"no local folder {folder!r} to write {os.path.basename(local)!r} into")
        known = self._session_for(args.session)
        remote = _workspace_path(known, args.remote)

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
        parser = _parser("connect", ("url", {"metavar": "URL"}))
        parser.add_argument("--token", default="", help="the server's token")
        args = parser.parse_args(argv)
        if not args.url.startswith(("http://", "https://")):
            raise SandboxMagicError(f"connect takes the server's http(s) URL, not {args.url!r}")

        async def connect() -> tuple[SandboxClient, dict[str, Any]]:
            client = SandboxClient(args.url, args.token)
            return client, await asyncio.wait_for(client.status(), 30)

        try:
            client, status = self._run(connect())
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

        Plain blocking requests: by the time atexit runs, the executors the async client
        resolves names with are shut down.
        """
        with self._lock:
            ids = [s.id for s in self._sessions.values() if s.created_here]
            self._sessions.clear()
        client = self._client
        if not ids or client is None:
            return
        import urllib.request

        for session_id in ids:
            request = urllib.request.Request(
                f"{client.url}api/sandbox/sessions/{session_id}", method="DELETE", headers=client._headers()
            )
            with contextlib.suppress(Exception), urllib.request.urlopen(request, timeout=3):
                pass


def _workspace_path(known: _Session, path: str) -> str:
    """``path`` relative to the workspace; a path leading out of it is refused here, before any request."""
    normal = posixpath.normpath(path)
    if posixpath.isabs(normal):
        workspace = known.workspace.rstrip("/")
        if not workspace or not (normal == workspace or normal.startswith(workspace + "/")):
            raise SandboxMagicError(
                f"path {path!r} is outside the workspace of session {known.name!r} ({known.workspace or '?'}): "
                "give a path relative to it"
            )
        normal = posixpath.relpath(normal, workspace)
    if normal == ".." or normal.startswith("../"):
        raise SandboxMagicError(f"path {path!r} leads outside the workspace of session {known.name!r}")
    return normal


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as e:
        raise SandboxMagicError(f"cannot parse {line!r}: {e}") from None


def _spec_only(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k in _SPEC_OPTIONS and k != "timeout"}


def _options_differ(started: dict[str, Any], given: dict[str, Any]) -> bool:
    return _spec_only(started) != _spec_only(given)


def _describe(info: dict[str, Any]) -> str:
    workspace = info.get("durability", "")
    if info.get("workspace_key"):
        workspace += f" workspace {info['workspace_key']!r}"
    return (
        f"{info['id']}  ({info.get('kind')}, isolation {info.get('isolation')}, network {info.get('network')}, "
        f"{workspace}; {info.get('seconds_left', 0):.0f} s left; workspace {info.get('workspace')})"
    )


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(SandboxMagics)


__all__ = ["SandboxCommandError", "SandboxMagicError", "SandboxMagics", "load_ipython_extension"]
