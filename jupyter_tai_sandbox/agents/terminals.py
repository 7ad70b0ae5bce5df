"""ACP terminals as commands of the agent's sandbox session, never processes of the server.

An ACP agent asks its client to run commands (``terminal/create``, ``terminal/output``,
``terminal/wait_for_exit``, ``terminal/kill``, ``terminal/release``). jupyter-ai's client runs them on the
server (``jupyter_ai_acp_client.terminal_manager.TerminalManager``); :class:`SessionTerminals` keeps that
manager's semantics and runs each one in the session (``session.exec_start``):

- ``command`` with ``args`` is the argv; without ``args`` the command is a shell line, run by the session's
  ``sh -c``: agents send whole lines (claude-code-acp's Bash tool sends ``"cat a | head && ls $HOME"``), which
  splitting them into words (jupyter-ai's ``shlex``) would break; the shell is the session's, so this gives
  the agent nothing it could not run anyway.
- ``env`` adds to the session's environment (never the server's); the loader and interpreter injection
  names jupyter-ai refuses (``LD_PRELOAD``, ``PYTHONPATH``, ...) are refused the same way.
- ``cwd`` must be absolute and inside the session's workspace (default: the agent's working directory).
- stdout and stderr are kept together in arrival order; past ``output_byte_limit`` (default and ceiling
  :data:`DEFAULT_OUTPUT_BYTE_LIMIT`) the oldest bytes are dropped at a UTF-8 character boundary and the
  output says ``truncated``.
- the exit status: ``exit_code`` as the provider reports it, or ``signal`` ``SIGKILL`` (no exit code) for a
  command this side killed (``terminal/kill``, ``terminal/release``, the deadline).
- at most ``max_terminals`` at once; a released terminal's command is killed first; every call is checked
  against the ACP session that created the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from acp import RequestError
from acp.schema import (
    CreateTerminalResponse,
    EnvVariable,
    KillTerminalResponse,
    ReleaseTerminalResponse,
    TerminalExitStatus,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
)

from ..contract import (
    ExecHandle,
    ExitItem,
    OutputChunk,
    SandboxError,
    SandboxExecTimeoutError,
    SandboxPathError,
    SandboxSession,
)

_LOG = logging.getLogger(__name__)

#: a terminal's output kept when the agent names no limit, and the most it may name (jupyter-ai's default)
DEFAULT_OUTPUT_BYTE_LIMIT = 10 << 20

#: environment names an agent may not set (jupyter-ai's list: loader, interpreter and shell injection)
DENIED_ENV_VARS = frozenset(
    {
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "DYLD_INSERT_LIBRARIES",
        "DYLD_LIBRARY_PATH",
        "DYLD_FRAMEWORK_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "NODE_OPTIONS",
        "BASH_ENV",
        "ENV",
    }
)


@dataclass
class _Terminal:
    session_id: str
    handle: ExecHandle
    limit: int
    output: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    exit_code: int | None = None
    signal: str | None = None
    killed: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    def take(self, data: bytes) -> None:
        self.output += data
        if len(self.output) > self.limit:
            self.truncated = True
            del self.output[: len(self.output) - self.limit]
            skip = 0  # never start inside a UTF-8 character
            while skip < len(self.output) and (self.output[skip] & 0xC0) == 0x80:
                skip += 1
            del self.output[:skip]

    def exit_status(self) -> TerminalExitStatus | None:
        if not self.done.is_set():
            return None
        return TerminalExitStatus(exit_code=self.exit_code, signal=self.signal)


class SessionTerminals:
    """The ACP terminals of one agent's sandbox session (see the module's docstring)."""

    def __init__(
        self,
        session: SandboxSession,
        *,
        cwd: str,
        timeout_seconds: float,
        max_terminals: int = 16,
        max_output_bytes: int = DEFAULT_OUTPUT_BYTE_LIMIT,
        log: logging.Logger | None = None,
    ) -> None:
        self._session = session
        self._cwd = cwd
        self._timeout_seconds = timeout_seconds
        self._max_terminals = max_terminals
        self._max_output_bytes = max_output_bytes
        self._log = log or _LOG
        self._terminals: dict[str, _Terminal] = {}
        self._creating = 0

    def __len__(self) -> int:
        return len(self._terminals)

    # ------------------------------------------------------------ helpers

    def _terminal(self, terminal_id: str, session_id: str) -> _Terminal:
        term = self._terminals.get(terminal_id)
        if term is None:
            raise RequestError.resource_not_found(terminal_id)
        if term.session_id != session_id:
            raise RequestError.invalid_request({"terminal_id": "terminal belongs to different session"})
        return term

    @staticmethod
    def _argv(command: str, args: Sequence[str] | None) -> list[str]:
        if not command or not command.strip():
            raise RequestError.invalid_params({"command": "command cannot be empty"})
        if args:
            return [command, *args]
        return ["sh", "-c", command]

    async def _resolve_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self._cwd
        if not posixpath.isabs(cwd):
            raise RequestError.invalid_params({"cwd": "cwd must be an absolute path"})
        try:
            return await self._session.resolve_path(cwd)
        except SandboxError as e:
            raise RequestError.invalid_params(
                {"cwd": f"a terminal runs inside the session's workspace only: {e}"}
            ) from None

    @staticmethod
    def _env(env: Sequence[EnvVariable] | None) -> dict[str, str]:
        out: dict[str, str] = {}
        for var in env or ():
            if var.name.upper() in DENIED_ENV_VARS:
                raise RequestError.invalid_params({"env": f"setting {var.name!r} is not allowed"})
            out[var.name] = var.value
        return out

    async def _read(self, term: _Terminal) -> None:
        try:
            async for item in term.handle.output:
                if isinstance(item, OutputChunk):
                    term.take(item.data)
                elif isinstance(item, ExitItem):
                    if term.killed:
                        term.signal = "SIGKILL"
                    else:
                        term.exit_code = item.exit_code
        except SandboxExecTimeoutError as e:
            term.signal = "SIGKILL"
            term.take(f"\n[{e}]\n".encode())
        except SandboxError as e:
            self._log.warning("an agent terminal's output ended with an error: %s", e)
            if term.killed:
                term.signal = "SIGKILL"
            term.take(f"\n[the command's output ended with an error: {e}]\n".encode())
        finally:
            term.done.set()

    async def _stop(self, term: _Terminal) -> None:
        if term.done.is_set():
            return
        term.killed = True
        try:
            await term.handle.kill()
        except SandboxError as e:
            raise RequestError.internal_error(
                {"terminal": f"the command could not be stopped: {e}"}
            ) from None
        await term.done.wait()

    # ------------------------------------------------------------ ACP terminal methods

    async def create(
        self,
        session_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Sequence[EnvVariable] | None = None,
        output_byte_limit: int | None = None,
    ) -> CreateTerminalResponse:
        """terminal/create: start the command in the session; returns at once with its terminal id."""
        if len(self._terminals) + self._creating >= self._max_terminals:
            raise RequestError.invalid_request(
                {
                    "terminal_id": (
                        f"terminal limit reached ({self._max_terminals}); release existing terminals first"
                    )
                }
            )
        argv = self._argv(command, args)
        env_dict = self._env(env)
        if output_byte_limit is not None and output_byte_limit < 0:
            raise RequestError.invalid_params({"output_byte_limit": "must be >= 0"})
        limit = self._max_output_bytes if output_byte_limit is None else output_byte_limit
        limit = min(limit, self._max_output_bytes)
        self._creating += 1
        try:
            run_in = await self._resolve_cwd(cwd)
            handle = await self._session.exec_start(
                argv, timeout_seconds=self._timeout_seconds, env=env_dict, cwd=run_in
            )
        except SandboxPathError as e:
            raise RequestError.invalid_params({"cwd": str(e)}) from None
        except SandboxError as e:
            raise RequestError.invalid_params({"command": f"could not start {command!r}: {e}"}) from None
        finally:
            self._creating -= 1
        with contextlib.suppress(SandboxError):
            await handle.close_stdin()  # jupyter-ai's terminals read /dev/null
        terminal_id = str(uuid.uuid4())
        term = _Terminal(session_id=session_id, handle=handle, limit=limit)
        term.reader = asyncio.create_task(self._read(term), name=f"acp-terminal-{terminal_id}")
        self._terminals[terminal_id] = term
        return CreateTerminalResponse(terminal_id=terminal_id)

    async def output(self, session_id: str, terminal_id: str) -> TerminalOutputResponse:
        """terminal/output: what the command wrote so far (its tail past the limit), without waiting."""
        term = self._terminal(terminal_id, session_id)
        return TerminalOutputResponse(
            output=term.output.decode("utf-8", errors="replace"),
            truncated=term.truncated,
            exit_status=term.exit_status(),
        )

    async def wait_for_exit(self, session_id: str, terminal_id: str) -> WaitForTerminalExitResponse:
        """terminal/wait_for_exit: wait until the command has ended; its exit code or signal."""
        term = self._terminal(terminal_id, session_id)
        await term.done.wait()
        return WaitForTerminalExitResponse(exit_code=term.exit_code, signal=term.signal)

    async def kill(self, session_id: str, terminal_id: str) -> KillTerminalResponse:
        """terminal/kill: end the command (its process group in the session); the terminal stays readable."""
        term = self._terminal(terminal_id, session_id)
        await self._stop(term)
        return KillTerminalResponse()

    async def release(self, session_id: str, terminal_id: str) -> ReleaseTerminalResponse:
        """terminal/release: kill the command if it still runs and forget the terminal."""
        term = self._terminal(terminal_id, session_id)
        try:
            await self._stop(term)
        finally:
            self._terminals.pop(terminal_id, None)
            if term.reader is not None and not term.reader.done():
                term.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await term.reader
        return ReleaseTerminalResponse()

    async def cleanup_session(self, session_id: str) -> None:
        """Release every terminal of an ACP session (its end)."""
        for terminal_id, term in list(self._terminals.items()):
            if term.session_id != session_id:
                continue
            try:
                await self.release(session_id, terminal_id)
            except Exception:
                self._log.warning("releasing terminal %s of session %s failed", terminal_id, session_id)

    async def close(self) -> None:
        """Release every terminal (the agent's client is done)."""
        for session_id in {t.session_id for t in self._terminals.values()}:
            await self.cleanup_session(session_id)

    def describe(self) -> list[dict[str, Any]]:
        """The live terminals, for status messages."""
        return [
            {"terminal_id": tid, "session_id": t.session_id, "running": not t.done.is_set()}
            for tid, t in self._terminals.items()
        ]
