"""jupyter-ai's ACP persona with its agent in the chatting user's sandbox session: :class:`SandboxedAcpPersona`.

jupyter-ai's ``BaseAcpPersona`` spawns its agent as a subprocess of the server, keeps that subprocess and its
ACP client in class attributes (one agent per persona class, for every chat and user), gives the agent the
chat's folder on the server as its working tree, and kills the subprocess's process group at shutdown. This
subclass replaces exactly those parts:

- the agent is an :class:`~jupyter_tai_sandbox.agents.runtime.AgentRuntime`: a command in a sandbox session
  owned by the chatting user; one per chat (``scope`` ``chat``) or one per user shared by their chats
  (``persona``), kept in a pool of this server process rather than on the class;
- the ACP client is :class:`~jupyter_tai_sandbox.agents.acp_client.SandboxAcpClient`: the agent's file and
  terminal calls are served in the session;
- the ACP session's working directory is the session's workspace, laid out like the contents' root (a
  contents path ``p/x.py`` is ``<workspace>/p/x.py``), where ``/sandbox copy-in`` puts what the user hands
  over;
- shutdown (a chat closed, the server stopping) detaches: the agent runs on in its session and is attached
  to again later (never a kill by process group on the server);
- the agent exiting on its own is said in the chat (status, the end of its stderr), its session destroyed
  (a persistent workspace kept), and the next message starts a new one;
- a persona serves one user: its owner is the first user who writes to it in the chat; another user's
  message is refused in the chat;
- ``/sandbox status|copy-in PATH|copy-back [PATH]|stop`` are answered here, never sent to the agent;
- a provider that cannot give the agent's isolation (local) refuses in the chat with the policy's words; the
  agent never runs on the server.

A configured persona (``SandboxAgents.personas``) gets a class of its own, ``Sandboxed<Key>Persona`` in this
module (:func:`persona_class`). A plugin may instead subclass :class:`SandboxedAcpPersona` with a class
attribute ``agent = AgentPersonaSpec(...)`` and register it under the ``jupyter_ai.personas`` entry points.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import posixpath
from types import SimpleNamespace
from typing import Any, ClassVar

from jupyter_ai_acp_client.base_acp_persona import BaseAcpPersona
from jupyter_ai_persona_manager import PersonaDefaults  # type: ignore[import-untyped]
from jupyterlab_chat.models import Message

from ..contract import SandboxError, SandboxRequestError
from ..server_lookup import sandbox_app, server_registry
from .runtime import POOL, AgentExit, AgentRuntime, persistent_workspace_key
from .settings import SandboxAgents
from .spec import AgentPersonaSpec

#: the avatar of a persona that names none
DEFAULT_AVATAR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", "sandboxed-agent.svg")
#: the chat's metadata key holding each persona's session id (scope chat): {persona id: session id}
SESSIONS_METADATA_KEY = "tai_sandbox_sessions"
COMMAND = "/sandbox"
USAGE = (
    "`/sandbox status`: this agent's sandbox session; `/sandbox copy-in PATH`: copy a file or folder of "
    "your files (relative to this chat's folder) into the session; `/sandbox copy-back [PATH]`: copy what "
    "the agent changed back (all that was copied in, or PATH); `/sandbox stop`: end the agent and its session."
)


class SandboxedAcpPersona(BaseAcpPersona):
    """An ACP persona whose agent runs in a sandbox session of the chatting user (see the module docstring).

    Subclasses set :attr:`agent`; :func:`persona_class` makes one per configured persona.
    """

    #: the agent this persona runs (a subclass sets it)
    agent: ClassVar[AgentPersonaSpec | None] = None

    NOTEBOOK_EDITING_GUIDANCE: ClassVar[str] = (
        "System note: you run in a sandbox session, not on the user's Jupyter server. Your working directory "
        "is the session's workspace, laid out like the user's Jupyter files (a file at contents path p/x.py "
        "is ./p/x.py here), but it holds only what the user copied in (`/sandbox copy-in`), and what you "
        "write stays in the session until the user copies it back (`/sandbox copy-back`). Jupyter's notebook "
        "tools are not available; edit .ipynb files as JSON with care (keep them valid nbformat)."
    )

    _client_session_future: asyncio.Task[Any] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        spec = type(self).agent
        if not isinstance(spec, AgentPersonaSpec):
            raise TypeError(
                f"{type(self).__name__}: set the class attribute agent = AgentPersonaSpec(...) "
                "(jupyter_tai_sandbox.agents.spec)"
            )
        self._owner: str | None = None
        self._runtime: AgentRuntime | None = None
        self._runtime_key: tuple[str, str] | None = None
        self._cwd: str | None = None
        super().__init__(*args, executable=list(spec.command), **kwargs)

    # ------------------------------------------------------------------ identity

    @property
    def spec(self) -> AgentPersonaSpec:
        assert self.agent is not None  # checked in __init__
        return self.agent

    @property
    def defaults(self) -> PersonaDefaults:
        spec = self.spec
        return PersonaDefaults(
            name=spec.name,
            description=spec.description
            or f"A coding agent ({' '.join(spec.command)}) in your sandbox session.",
            avatar_path=spec.avatar or DEFAULT_AVATAR,
            system_prompt="unused",
        )

    @property
    def _serverapp(self) -> Any:
        return getattr(getattr(self.parent, "parent", None), "serverapp", None)

    def _settings(self) -> SandboxAgents:
        app = sandbox_app(self._serverapp)
        settings = getattr(app, "agents", None)
        return settings if isinstance(settings, SandboxAgents) else SandboxAgents()

    def _principal(self, message: Message) -> str:
        """Who wrote ``message``, as every sandbox door names its principal (the server's owner under
        jupyter_server's token/password providers, else the sender's user name)."""
        from ..sessions import principal_name

        provider = getattr(self._serverapp, "identity_provider", None)
        return principal_name(provider, SimpleNamespace(username=message.sender))

    # ------------------------------------------------------------------ messages

    async def on_message(self, message: Message) -> None:
        body = (message.body or "").strip()
        try:
            sender = self._principal(message)
        except SandboxError as e:
            self.send_message(f"{self.name} cannot tell who sent this message: {e}")
            return
        if self._owner is not None and sender != self._owner:
            self.send_message(
                f"{self.name} works for **{html.escape(self._owner)}** in this chat: its sandbox session and "
                f"agent are theirs, so it does not take messages from {html.escape(sender)}. Open a chat of "
                "your own to use it."
            )
            return
        if body == COMMAND or body.startswith(COMMAND + " "):
            self._owner = sender
            await self._sandbox_command(body[len(COMMAND) :].strip())
            return
        self._owner = sender
        await super().on_message(message)

    async def handle_uncaught_exception(self, exc: Exception) -> None:
        if isinstance(exc, SandboxError):
            # the policy's own refusal (a provider that cannot isolate, a quota, a secret without value)
            self.send_message(f"{self.name} cannot run its agent in a sandbox: {exc} ({type(exc).__name__})")
            return
        runtime = self._runtime
        if runtime is not None and runtime.ended:
            return  # the agent's exit is told by _on_agent_exit
        await super().handle_uncaught_exception(exc)

    # ------------------------------------------------------------------ the agent

    def _scope_key(self) -> str:
        assert self._owner is not None
        return self._owner if self.spec.scope == "persona" else self.chat.get_id()

    def _acquire(self) -> AgentRuntime:
        """This persona's runtime: its own, the pool's (scope persona: the owner's, made by another chat), or
        a new one."""
        runtime = self._runtime
        if runtime is not None and not runtime.ended:
            return runtime
        if runtime is not None:
            self._forget_runtime()
        registry = server_registry(self._serverapp)
        if registry is None:
            raise SandboxError(
                "the jupyter_tai_sandbox server extension is not running in this server (or has no provider): "
                "enable it and set SandboxApp.provider"
            )
        assert self._owner is not None
        key = (self.id, self._scope_key())
        runtime = POOL.get(key)
        if runtime is None or runtime.owner != self._owner:
            runtime = AgentRuntime(
                self.spec,
                registry=registry,
                owner=self._owner,
                settings=self._settings(),
                log=self.log,
                workspace_key=persistent_workspace_key(self.spec, key[1]),
            )
        POOL.hold(key, runtime, self)
        runtime.listen(self._on_agent_exit)
        self._runtime, self._runtime_key = runtime, key
        return runtime

    def _forget_runtime(self) -> None:
        runtime, key = self._runtime, self._runtime_key
        if runtime is not None:
            runtime.unlisten(self._on_agent_exit)
            if key is not None:
                POOL.release(key, self)
        self._runtime = self._runtime_key = None
        self._cwd = None

    def _recorded_session(self) -> str | None:
        recorded = self.chat.get_metadata().get(SESSIONS_METADATA_KEY) or {}
        value = recorded.get(self.id) if isinstance(recorded, dict) else None
        return value if isinstance(value, str) else None

    def _record_session(self, session_id: str | None) -> None:
        recorded = self.chat.get_metadata().get(SESSIONS_METADATA_KEY) or {}
        recorded = dict(recorded) if isinstance(recorded, dict) else {}
        if session_id is None:
            recorded.pop(self.id, None)
        else:
            recorded[self.id] = session_id
        self.chat.set_metadata(SESSIONS_METADATA_KEY, recorded)

    def _chat_folder(self) -> str:
        """The chat's folder, relative to the contents root ('' at the root)."""
        return posixpath.dirname(self.parent.get_chat_path(relative=True).replace(os.sep, "/"))

    async def prepare(self) -> None:
        """Start (or attach to) this persona's agent, then its ACP session for this chat. Raises a SandboxError
        until a user has written to it (the eager prepare on selecting the persona stays silent then)."""
        if self._owner is None:
            raise SandboxError(f"{self.name} starts its agent at the first message")
        self.emit_once("acp_engagement")
        runtime = self._acquire()
        self._cwd = None

        async def before_command(started: AgentRuntime) -> None:
            await self._enter_workspace(started)
            if self.spec.copy_in:
                folder = self._chat_folder()
                await self._handoff(
                    "in", posixpath.join(folder, self.spec.copy_in) if folder else self.spec.copy_in
                )

        recorded = self._recorded_session() if self.spec.scope == "chat" else None
        process = await runtime.start(recorded, before_command)
        assert runtime.session is not None
        if self.spec.scope == "chat":
            self._record_session(runtime.session.id)
        if self._cwd is None:
            await self._enter_workspace(runtime)
        if runtime.client is None or self._is_discardable(runtime.client):
            runtime.client = self.event_loop.create_task(self._init_client())
        client = await runtime.client
        await client.get_connection()
        assert process is runtime.process
        if self._client_session_future is None or self._is_discardable(self._client_session_future):
            self._client_session_future = self.event_loop.create_task(self._init_client_session())
        await self.get_session_response()
        self.emit_once("acp_success")

    async def _enter_workspace(self, runtime: AgentRuntime) -> None:
        """The ACP session's working directory: the workspace, which mirrors the contents' root (the chat's
        folder made there, where ``/sandbox copy-in`` puts what the user hands over from it)."""
        assert runtime.session is not None and runtime.workspace is not None
        folder = self._chat_folder()
        if folder:
            with contextlib.suppress(SandboxError):  # there already
                await runtime.session.make_folder(folder)
        self._cwd = runtime.workspace

    async def _init_agent_subprocess(self, env: dict[str, str] | None = None) -> Any:
        """The agent's command in its session (an AgentProcess), never a subprocess of the server."""
        return await self._acquire().start()

    async def _init_client(self) -> Any:
        from .acp_client import SandboxAcpClient

        runtime = self._runtime
        assert runtime is not None
        process = await runtime.start()
        assert runtime.session is not None and runtime.workspace is not None  # made by the start
        client = SandboxAcpClient(
            agent_subprocess=process,
            event_loop=self.event_loop,
            session=runtime.session,
            workspace=runtime.workspace,
            timeout_seconds=self._settings().terminal_timeout_seconds,
            mcp_servers=[dict(server) for server in self.spec.mcp_servers],
        )
        self.log.info(
            "ACP client for %s connected to session %s", self.spec.key, runtime.session and runtime.session.id
        )
        return client

    async def get_agent_subprocess(self) -> Any:
        runtime = self._runtime
        if runtime is None:
            raise SandboxError(f"{self.name} has no agent yet")
        return await runtime.start()

    async def get_client(self) -> Any:
        runtime = self._runtime
        if runtime is None or runtime.client is None:
            raise SandboxError(f"{self.name} has no agent yet")
        return await runtime.client

    def _client_started(self) -> bool:
        return self._runtime is not None and self._runtime.client is not None

    def get_chat_dir(self) -> str:
        """The agent's working directory: the session's workspace (never the chat's folder on the server)."""
        if self._cwd is not None:
            return self._cwd
        runtime = self._runtime
        if runtime is not None and runtime.workspace is not None:
            return runtime.workspace
        return super().get_chat_dir()

    async def _on_agent_exit(self, ended: AgentExit) -> None:
        """The agent ended on its own: say so, and start afresh at the next message."""
        runtime = self._runtime
        session_id = self._recorded_session() if self.spec.scope == "chat" else None
        kept = " (its persistent workspace is kept)" if runtime is not None and runtime.workspace_key else ""
        tail = ended.stderr_tail.strip()
        details = (
            f"\n\n<details><summary>The end of its stderr</summary>\n\n```\n{tail[-3000:]}\n```\n</details>"
            if tail
            else ""
        )
        self.send_message(
            f"The agent of {self.name} {html.escape(ended.describe())}. Its sandbox session"
            f"{' ' + session_id if session_id else ''} was destroyed{kept}; your next message starts a new "
            f"one.{details}"
        )
        await self._reset()

    async def _reset(self) -> None:
        """Forget the ended agent: the next message prepares a new one, with the chat's history as context."""
        future = self._client_session_future
        if future is not None and not future.done():
            future.cancel()
        self._client_session_future = None
        self._prepare_task = None
        self._notebook_guidance_sent = False
        self._pending_session_recovery_context = True
        existing = self._get_existing_sessions()
        if self.id in existing:
            self.chat.set_metadata("acp_session_ids", {k: v for k, v in existing.items() if k != self.id})
        if self.spec.scope == "chat":
            self._record_session(None)
        self._forget_runtime()

    async def _shutdown(self) -> None:
        """The chat closes or the server stops: this chat's ACP session ends on the client's side, and the agent
        is detached once no chat uses it (it runs on in its session; never killed here)."""
        runtime = self._runtime
        if runtime is None:
            return
        future = self._client_session_future
        with contextlib.suppress(Exception):
            if runtime.client is not None and runtime.client.done() and future is not None and future.done():
                client = runtime.client.result()
                await client.end_session(await self.get_session_id())
        if future is not None and not future.done():
            future.cancel()
        key = self._runtime_key
        runtime.unlisten(self._on_agent_exit)
        released = POOL.release(key, self) if key is not None else None
        self._runtime = self._runtime_key = None
        if released is not None:
            await released.detach()
            self.log.info("[shutdown] %s: agent detached, running on in its session", self.spec.key)

    # ------------------------------------------------------------------ /sandbox

    async def _sandbox_command(self, text: str) -> None:
        verb, _, rest = text.partition(" ")
        rest = rest.strip()
        try:
            if verb == "status":
                await self._status()
            elif verb == "copy-in":
                if not rest:
                    self.send_message(f"Name what to copy in: `/sandbox copy-in PATH`. {USAGE}")
                    return
                await self._ensure_agent()
                await self._handoff("in", self._contents_path(rest))
            elif verb == "copy-back":
                if self._runtime is None or self._runtime.session is None or self._runtime.ended:
                    self.send_message(
                        "There is no sandbox session to copy back from: nothing was copied in yet."
                    )
                    return
                await self._handoff("out", self._contents_path(rest) if rest else None)
            elif verb == "stop":
                await self._stop()
            else:
                self.send_message(USAGE)
        except SandboxError as e:
            self.send_message(f"`/sandbox {html.escape(verb)}` failed: {e} ({type(e).__name__})")

    def _contents_path(self, path: str) -> str:
        """``path`` (relative to the chat's folder; '/...' from the contents root) as a contents path."""
        if path.startswith("/"):
            joined = path.lstrip("/")
        else:
            folder = self._chat_folder()
            joined = posixpath.join(folder, path) if folder else path
        normal = posixpath.normpath(joined) if joined else ""
        if normal == ".":
            normal = ""
        if normal.startswith(".."):
            raise SandboxRequestError(f"{path!r} leaves the contents' root", field="path")
        return normal

    async def _ensure_agent(self) -> None:
        await self._ensure_prepared()

    async def _handoff(self, direction: str, path: str | None) -> None:
        from .handoff import WorkspaceHandoff

        runtime = self._runtime
        app = sandbox_app(self._serverapp)
        if runtime is None or runtime.session is None or app is None:
            raise SandboxError(f"{self.name} has no sandbox session")
        handoff = WorkspaceHandoff.for_server(app, runtime.session)
        if direction == "in":
            assert path is not None
            result = await handoff.copy_in(path)
            if result.path not in runtime.copied_in:
                runtime.copied_in.append(result.path)
        else:
            result = await handoff.copy_back(path)
        data = result.to_json()
        lines = [
            f"Copied {'in' if direction == 'in' else 'back'} `{data['path'] or '/'}`: {len(data['copied'])} file(s) "
            f"written ({data['bytes']} bytes), {len(data['unchanged'])} unchanged."
        ]
        for conflict in data["conflicts"]:
            lines.append(
                f"- conflict: `{conflict.get('path')}` changed on both sides; Jupyter's copy kept, the "
                f"agent's is `{conflict.get('sandbox_copy')}`"
            )
        for skipped in data["skipped"][:20]:
            lines.append(f"- skipped `{skipped.get('path')}`: {skipped.get('reason')}")
        if len(data["skipped"]) > 20:
            lines.append(f"- and {len(data['skipped']) - 20} more skipped")
        self.send_message("\n".join(lines))

    async def _status(self) -> None:
        runtime = self._runtime
        if runtime is None or runtime.ended or runtime.session is None:
            image = self.spec.image or self._settings().default_image
            self.send_message(
                f"{self.name} has no sandbox session in this chat yet: your next message starts one "
                f"(image `{image}`, scope {self.spec.scope}). {USAGE}"
            )
            return
        status = await runtime.status()
        self.send_message(f"{self.name}'s sandbox session:\n\n```json\n{json.dumps(status, indent=1)}\n```")

    async def _stop(self) -> None:
        runtime = self._runtime
        if runtime is None or runtime.ended:
            self.send_message(f"{self.name} has no running agent in this chat.")
            return
        session_id = runtime.session.id if runtime.session is not None else None
        runtime.unlisten(self._on_agent_exit)
        await runtime.stop(f"stopped with /sandbox stop by {self._owner} in another chat")
        if self._runtime_key is not None:
            POOL.drop(self._runtime_key, runtime)
        await self._reset()
        self.send_message(
            f"Stopped {self.name}'s agent and destroyed its sandbox session {session_id or ''}; your next message "
            "starts a new one."
        )


def persona_class(spec: AgentPersonaSpec) -> type[SandboxedAcpPersona]:
    """The persona class of a configured agent: ``Sandboxed<Key>Persona`` in this module (its persona id is
    ``jupyter-ai-personas::jupyter_tai_sandbox::Sandboxed<Key>Persona``)."""
    name = spec.class_name
    cls = type(name, (SandboxedAcpPersona,), {"agent": spec, "__module__": __name__, "__qualname__": name})
    return cls


__all__ = ["DEFAULT_AVATAR", "SESSIONS_METADATA_KEY", "SandboxedAcpPersona", "persona_class"]
