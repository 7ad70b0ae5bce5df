"""``%sandbox SUBCOMMAND``: the line magics (status, sessions, new, use, rm, extend, pause, resume, fork, put,
get, ports, open, transcript, connect).

:class:`LineSubcommands` stands on :class:`~.named_sessions.NamedSessions` (the sessions by
name and the client); :class:`~.magic.SandboxMagics` stands on it and adds the cell magic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import os
import posixpath
import sys
import tempfile
import urllib.parse
from typing import Any

from ..client import SandboxClient
from ..contract import SandboxNotFoundError, SandboxUnavailableError
from ..contract.durations import duration_type
from ..suggest import did_you_mean
from ..transcripts import notebook_filename
from .named_sessions import NamedSession, NamedSessions
from .options import (
    SandboxMagicError,
    add_session_options,
    describe,
    parse,
    spec_body,
    spec_options,
    split,
    subparser,
    workspace_path,
)

SUBCOMMAND_NAMES = (
    "status",
    "sessions",
    "new",
    "use",
    "rm",
    "extend",
    "pause",
    "resume",
    "fork",
    "put",
    "get",
    "ports",
    "open",
    "transcript",
    "connect",
)
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
  %sandbox pause NAME                 freeze every process of the session where it is (its TTL
                                      still runs; cells in it are refused until resume)
  %sandbox resume NAME                let a paused session run on from where it was
  %sandbox fork NAME NEW              start NEW from NAME's state now (vm: memory and processes)
                                      and make it current; the two then run on apart
  %sandbox put LOCAL [REMOTE]         upload a kernel-side file into the session's workspace
  %sandbox get REMOTE [LOCAL]         download a workspace file next to the kernel
  %sandbox ports NAME                 the TCP ports something listens on in the session
  %sandbox open NAME PORT [PATH]      a link to the web preview of PORT in the session (no token
                                      in it: the browser's Jupyter login opens it); --iframe
                                      also shows it in the cell
  %sandbox transcript NAME [PATH]     save the session's commands and their output as a notebook
                                      (PATH: a .ipynb file or a folder; default: the kernel's cwd)
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


def _port_type(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"a TCP port number 1-65535, not {text!r}")
    return port


class LineSubcommands(NamedSessions):
    """The line subcommands: ``%sandbox NAME ...`` calls ``_do_NAME``."""

    def _line(self, line: str) -> None:
        words = split(line)
        if not words:
            words = ["status"]
        name, rest = words[0], words[1:]
        handler = getattr(self, f"_do_{name}", None) if name in SUBCOMMAND_NAMES else None
        if handler is None:
            hint = did_you_mean(name, SUBCOMMAND_NAMES, quote="")
            raise SandboxMagicError(
                f"unknown subcommand {name!r}: {hint}use status, sessions, new, use, rm, extend, pause, resume, fork, "
                "put, get, ports, open, transcript or connect "
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
            rows.append(
                (
                    name,
                    info["id"],
                    info.get("kind", ""),
                    info.get("network", ""),
                    workspace,
                    f"{info.get('seconds_left', 0):.0f} s",
                    info.get("consumer", ""),
                )
            )
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())

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
            raise SandboxMagicError(
                f"no session named {args.name!r} in this kernel, nor a server session with that id"
            )
        gone = self._run(remove()) if known is not None else True
        with self._lock:
            self._sessions.pop(args.name, None)
        if self._current == args.name:
            self._current = "default"
        print(f"session {args.name!r} " + ("removed" if gone else "was already gone"))

    def _do_extend(self, argv: list[str]) -> None:
        parser = subparser(
            "extend",
            ("name", {"metavar": "NAME"}),
            (
                "duration",
                {
                    "metavar": "DURATION",
                    "type": duration_type("the duration"),
                    "help": "added to the TTL: 90, 90s, 30m, 1h, 1h30m",
                },
            ),
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
        print(
            f"session {args.name!r} now ends in {info['seconds_left']:.0f} s (TTL {ttl:.0f} s from its start)"
        )

    def _do_pause(self, argv: list[str]) -> None:
        self._pause_or_resume("pause", argv)

    def _do_resume(self, argv: list[str]) -> None:
        self._pause_or_resume("resume", argv)

    def _pause_or_resume(self, action: str, argv: list[str]) -> None:
        args = parse(subparser(action, ("name", {"metavar": "NAME"})), argv)
        with self._lock:
            known = self._sessions.get(args.name)
        session_id = known.id if known is not None else args.name

        async def change() -> dict[str, Any]:
            client = await self._get_client()
            try:
                return await (client.pause(session_id) if action == "pause" else client.resume(session_id))
            except SandboxNotFoundError:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id"
                ) from None

        info = self._run(change())
        print(
            f"session {args.name!r} is "
            + ("paused: `%sandbox resume` lets it run on" if info["paused"] else "running")
        )

    def _do_fork(self, argv: list[str]) -> None:
        args = parse(subparser("fork", ("name", {"metavar": "NAME"}), ("new", {"metavar": "NEW"})), argv)
        with self._lock:
            known = self._sessions.get(args.name)
            if args.new in self._sessions:
                raise SandboxMagicError(f"session {args.new!r} already exists: name the fork otherwise")
        session_id = known.id if known is not None else args.name

        async def fork() -> NamedSession:
            client = await self._get_client()
            try:
                info = await client.fork(session_id)
            except SandboxNotFoundError:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id"
                ) from None
            options = dict(known.options) if known is not None else {}
            made = NamedSession(
                args.new,
                info["id"],
                options,
                info.get("workspace", ""),
                info.get("kind", ""),
                options.get("timeout"),
                image=info.get("image"),
            )
            with self._lock:
                self._sessions[args.new] = made
            return made

        made = self._run(fork())
        self._current = args.new
        print(f"session {args.new!r} forked from {args.name!r} (id {made.id}); cells now run in it")

    def _do_put(self, argv: list[str]) -> None:
        parser = subparser(
            "put", ("local", {"metavar": "LOCAL"}), ("remote", {"metavar": "REMOTE", "nargs": "?"})
        )
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
        parser = subparser(
            "get", ("remote", {"metavar": "REMOTE"}), ("local", {"metavar": "LOCAL", "nargs": "?"})
        )
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

    def _do_ports(self, argv: list[str]) -> None:
        args = parse(subparser("ports", ("name", {"metavar": "NAME"})), argv)
        session_id = self._session_id(args.name)

        async def ports() -> list[dict[str, Any]]:
            client = await self._get_client()
            try:
                return await client.listening_ports(session_id)
            except SandboxNotFoundError:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id"
                ) from None

        listed = self._run(ports())
        if not listed:
            print(f"nothing listens on a TCP port in session {args.name!r}")
            return
        rows = [("PORT", "ADDRESS", "PREVIEW")]
        rows += [(str(p["port"]), p["address"], self._preview_href(session_id, p["port"])) for p in listed]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())

    def _do_open(self, argv: list[str]) -> None:
        parser = subparser(
            "open",
            ("name", {"metavar": "NAME"}),
            ("port", {"metavar": "PORT", "type": _port_type}),
            ("path", {"metavar": "PATH", "nargs": "?", "default": "", "help": "the app's own path"}),
        )
        parser.add_argument("--iframe", action="store_true", help="also show the preview in the cell")
        parser.add_argument("--height", type=int, default=480, help="the iframe's height in pixels")
        args = parse(parser, argv)
        session_id = self._session_id(args.name)

        async def listening() -> bool:
            client = await self._get_client()
            try:
                return any(p["port"] == args.port for p in await client.listening_ports(session_id))
            except SandboxNotFoundError:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id"
                ) from None

        if not self._run(listening()):
            print(
                f"note: nothing listens on port {args.port} in session {args.name!r} yet: the preview answers "
                "502 until something does",
                file=sys.stderr,
            )
        from IPython.display import display

        href = self._preview_href(session_id, args.port, args.path)
        link = html.escape(href, quote=True)
        bundle = {
            "text/html": f'<a href="{link}" target="_blank" rel="noopener noreferrer">{link}</a>',
            "text/plain": href,
        }
        display(bundle, raw=True)
        if args.iframe:
            display(
                {
                    "text/html": f'<iframe src="{link}" width="100%" height="{max(args.height, 50)}" '
                    'style="border: 1px solid #ccc"></iframe>',
                    "text/plain": f"(a preview of port {args.port} in session {args.name!r})",
                },
                raw=True,
            )

    def _do_transcript(self, argv: list[str]) -> None:
        args = parse(
            subparser(
                "transcript", ("name", {"metavar": "NAME"}), ("path", {"metavar": "PATH", "nargs": "?"})
            ),
            argv,
        )
        session_id = self._session_id(args.name)
        target = os.path.expanduser(args.path or "")
        if not target or os.path.isdir(target):
            target = os.path.join(target, notebook_filename(args.name))
        folder = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(folder):
            raise SandboxMagicError(f"no local folder {folder!r} to write {os.path.basename(target)!r} into")

        async def transcript() -> dict[str, Any]:
            client = await self._get_client()
            try:
                return await client.transcript(session_id)
            except SandboxNotFoundError:
                raise SandboxMagicError(
                    f"no session named {args.name!r} in this kernel, nor a server session with that id "
                    "(a destroyed session's transcript is kept a while, then forgotten)"
                ) from None

        notebook = self._run(transcript())
        fd, tmp = tempfile.mkstemp(prefix=".sandbox-transcript-", suffix=".ipynb", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as sink:
                json.dump(notebook, sink, indent=1, ensure_ascii=False)
                sink.write("\n")
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        count = notebook.get("metadata", {}).get("jupyter_tai_sandbox", {}).get("commands", 0)
        print(
            f"the transcript of session {args.name!r} ({count} command{'' if count == 1 else 's'}) -> "
            f"{os.path.abspath(target)} (it opens untrusted)"
        )

    def _session_id(self, name: str) -> str:
        with self._lock:
            known = self._sessions.get(name)
        return known.id if known is not None else name

    def _preview_href(self, session_id: str, port: int, path: str = "") -> str:
        """The preview's link: the server-relative path (with the server's base_url) for the server this
        kernel was started by or found, which the browser's page shares; the full URL for one
        `%sandbox connect` named. Never a token."""
        assert self._client is not None
        url = self._client.port_url(session_id, port, path)
        if self._explicit is not None:
            return url
        parts = urllib.parse.urlsplit(url)
        return urllib.parse.urlunsplit(("", "", parts.path, parts.query, parts.fragment))

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
        except TimeoutError:
            raise SandboxUnavailableError(f"no answer from {args.url} within 30 s") from None
        if not isinstance(status, dict) or "kind" not in status:
            raise SandboxUnavailableError(
                f"{args.url} is not a Jupyter server with the jupyter_tai_sandbox extension"
            )
        with self._lock:
            dropped = sorted(self._sessions)
            self._sessions.clear()
        self._client, self._explicit, self._client_source = client, (args.url, args.token), "%sandbox connect"
        self._current = "default"
        print(f"connected to {client.url} (provider {status.get('kind')})")
        if dropped:
            print(f"sessions of the previous server are no longer tracked here: {', '.join(dropped)}")
