"""EngineExecs: the exec, agent and file calls of a :class:`~.docker_engine.DockerEngine`.

It owns:

* execs (create, attached start over asyncio streams, inspect, resize, a
  helper command run to its end), the path stat (the engine's
  ``HEAD /containers/{id}/archive``, reached through the SDK's private
  ``api._url``) and small archives in and out (workspace files travel through
  the session agent instead);
* the connection to a container's session agent (:meth:`EngineExecs.open_agent`):
  straight to its socket, else one exec of its ``connect`` relay.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import socket
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...agent.client import AGENT_PATH, RELAY_USER, AgentClient, AgentConnectionLost
from ...agent.netns import NotReachableHere, tcp_socket
from ...agent.transport import open_docker_streams, open_in_netns
from ...contract import SandboxError, SandboxUnavailableError
from .calls import EngineCalls
from .stream import EngineAddress, read_output, start_exec

#: containers remembered as reachable through the relay only (their engine is another host's)
RELAY_ONLY_REMEMBERED = 4096
#: containers whose environment is remembered from their agent's connection, not yet asked for
ENVS_REMEMBERED = 1024
#: how long a container whose agent this host could not reach directly uses the relay before it is tried again
RELAY_RETRY_SECONDS = 60.0


def environment_of(attrs: Mapping[str, Any]) -> dict[str, str]:
    """A container's ``Config.Env`` (of an inspect) as a mapping."""
    return dict(item.split("=", 1) for item in (attrs.get("Config") or {}).get("Env") or () if "=" in item)


#: the most :meth:`DockerEngine.read_file` reads of a container's file (a session may have written it)
READ_FILE_LIMIT = 1 << 20
#: tar headers and padding around the one member read_file reads
_ARCHIVE_SLACK = 64 << 10
#: the most output :meth:`DockerEngine.run` keeps of a helper command (it runs in a container the session controls)
RUN_OUTPUT_LIMIT = 64 << 20


class EngineExecs(EngineCalls):
    """The exec, agent and file calls of one engine (a mixin of :class:`~.docker_engine.DockerEngine`)."""

    # --------------------------------------------------------------- execs

    async def exec_create(
        self,
        container_id: str,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        stdin: bool,
        tty: bool,
        user: str = "",
    ) -> str:
        created = await self._call(
            "create a command",
            "exec_create",
            container_id,
            list(cmd),
            stdin=stdin,
            tty=tty,
            environment=dict(env or {}),
            user=user,
        )
        return str(created["Id"])

    async def exec_start(self, exec_id: str, tty: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Start a created exec attached: its hijacked connection (EngineRefusal when the engine says no)."""
        await self.connect()
        assert self._address is not None
        self.calls += 1
        return await self._bounded(
            start_exec(self._address, str(self._api._version), exec_id, tty), self.timeout, "start a command"
        )

    @property
    def address(self) -> EngineAddress | None:
        """Where the engine's exec streams are opened (no event loop's: any loop may use it); None until
        connected."""
        return self._address

    async def open_agent(self, container_id: str) -> AgentClient:
        """A new connection to the container's session agent: straight to its socket when this process can
        enter the container's network namespace (root on the engine's host, whatever the engine's address:
        a local engine reached over TCP, as a swarm node can be, too; see ``direct_agent``), else one exec of
        its ``connect`` relay. A container of another host's engine fails the cgroup check (its process id names
        no such container here): the relay for that container for RELAY_RETRY_SECONDS, then the direct path is
        tried again; never the relay for the others."""
        if (
            self.direct_agent is not False
            and os.geteuid() == 0
            and self.relay_until.get(container_id, 0.0) <= time.monotonic()
        ):
            attrs = await self.inspect_container(container_id, what="find a session's agent")
            if len(self._envs) >= ENVS_REMEMBERED:  # agents reconnected, nobody asked again: start over
                self._envs.clear()
            # by its id: a name may be another container's later
            self._envs[str(attrs["Id"])] = environment_of(attrs)
            pid = int((attrs.get("State") or {}).get("Pid") or 0)
            if pid > 0:
                try:
                    client = await open_in_netns(pid, str(attrs["Id"]))
                except NotReachableHere as e:
                    if len(self.relay_until) >= RELAY_ONLY_REMEMBERED:
                        self.relay_until.clear()  # tried again: cheap, and a gone container's id is never asked
                    self.relay_until[container_id] = time.monotonic() + RELAY_RETRY_SECONDS
                    self.direct_refusal = str(e)
                except OSError as e:
                    raise AgentConnectionLost(f"the session agent's socket: {e}") from None
                else:
                    self.direct_agent = True
                    self.relay_until.pop(container_id, None)
                    return client
        exec_id = await self.exec_create(
            container_id, [AGENT_PATH, "connect"], env=None, stdin=True, tty=False, user=RELAY_USER
        )
        reader, writer = await self.exec_start(exec_id, False)
        try:
            return await open_docker_streams(reader, writer)
        except BaseException:
            writer.close()
            raise

    async def container_env(self, container_id: str) -> dict[str, str]:
        """The container's own environment (its image's and its create's), every agent command's base: as the
        inspect of its agent's direct connection read it, else inspected now."""
        env = self._envs.pop(container_id, None)
        if env is None:
            env = environment_of(await self.inspect_container(container_id, what="inspect a session"))
        return env

    async def connect_port(self, container_id: str, host: str, port: int) -> socket.socket:
        """A TCP connection to ``host`` (an address) and ``port`` as seen from inside the container, made by this
        process in the container's network namespace, as the direct agent connection is (``agent.netns``): no
        byte of it passes through the agent. NotReachableHere where the agent is not reached that way: the
        agent dials then. ConnectionRefusedError: nothing listens there."""
        if not self.direct_agent:
            raise NotReachableHere(0, "the session agent is not reached directly here")
        for fresh in (False, True):
            known = None if fresh else self._pids.get(container_id)
            if known is None:
                attrs = await self.inspect_container(container_id, what="find a session's network")
                known = int((attrs.get("State") or {}).get("Pid") or 0), str(attrs["Id"])
                if known[0] <= 0:
                    raise SandboxError(f"container {container_id[:12]} does not run")
                if len(self._pids) >= 1024:  # containers removed meanwhile: start over
                    self._pids.clear()
                self._pids[container_id] = known
            try:
                return await tcp_socket(*known, host, port)
            except NotReachableHere:
                self._pids.pop(container_id, None)  # its process ended (a restart): ask the engine again
                if fresh:
                    raise
        raise AssertionError("unreachable")

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        return await self._call("inspect a command", "exec_inspect", exec_id)

    async def exec_resize(self, exec_id: str, rows: int, cols: int) -> None:
        await self._call("resize a terminal", "exec_resize", exec_id, height=rows, width=cols)

    async def exec_exit_code(self, exec_id: str, *, within: float) -> int | None:
        """The exec's exit status once the engine reports it ended; None when it still runs after ``within`` s.

        Bounded: an engine that does not answer by then is a SandboxUnavailableError.
        """
        loop = asyncio.get_running_loop()
        give_up: float | None = (
            None  # counted from the first answer: a wait for the caller's share is not the engine's
        )
        while True:
            left = within if give_up is None else max(give_up - loop.time(), 0.2)
            info = await self._call_within(left, "report a command's exit", "exec_inspect", exec_id)
            if give_up is None:
                give_up = loop.time() + within
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if loop.time() > give_up:
                return None
            await asyncio.sleep(0.02)

    async def run(
        self,
        container_id: str,
        cmd: Sequence[str],
        *,
        said: list[bytes] | None = None,
        limit: int = RUN_OUTPUT_LIMIT,
    ) -> tuple[int, bytes, bytes]:
        """Run a helper command (no stdin, no tty) to its end: status, stdout, stderr.

        Unbounded in time: callers put their own limit around it. Its output is capped at
        ``limit`` bytes (SandboxError past it: the container's programs are the session's).
        Output pieces also go to ``said`` as they arrive, so a caller that gives up can
        tell what it had printed.
        """
        exec_id = await self.exec_create(container_id, cmd, env=None, stdin=False, tty=False)
        out, err = bytearray(), bytearray()
        reader, writer = await self.exec_start(exec_id, False)
        try:
            async for stream, data in read_output(reader, False):
                if len(out) + len(err) + len(data) > limit:
                    raise SandboxError(f"a helper command printed more than {limit} bytes")
                (out if stream == "stdout" else err).extend(data)
                if said is not None:
                    said.append(data)
        finally:
            writer.close()
        code = await self.exec_exit_code(exec_id, within=1.0)
        if code is None:
            raise SandboxError("the engine did not report the helper command's exit status")
        return code, bytes(out), bytes(err)

    def run_blocking(
        self, container_id: str, cmd: Sequence[str], *, limit: int = 64 << 10
    ) -> tuple[int, bytes]:
        """:meth:`run` for a synchronous caller, in the calling thread: status and stdout (stderr is
        dropped), output capped at ``limit`` bytes, three engine calls whatever the command does.
        Bounded by ``slow_timeout`` (a command still talking then is a SandboxUnavailableError)."""
        import time

        api = self._api
        give_up = time.monotonic() + self.slow_timeout
        what = "run a helper command"
        try:
            self.calls += 1
            exec_id = api.exec_create(container_id, list(cmd), stdin=False, tty=False)["Id"]
            self.calls += 1
            out = bytearray()
            for stdout, _stderr in api.exec_start(exec_id, stream=True, demux=True):
                out += stdout or b""
                if len(out) > limit:
                    raise SandboxError(f"a helper command printed more than {limit} bytes")
                if time.monotonic() > give_up:
                    raise self.unanswered(self.slow_timeout, what)
            for _ in range(100):
                self.calls += 1
                info = api.exec_inspect(exec_id)
                if not info.get("Running") and info.get("ExitCode") is not None:
                    return int(info["ExitCode"]), bytes(out)
                time.sleep(0.01)
        except Exception as e:
            raise self.translate(e, what) from None
        raise SandboxError("the engine did not report the helper command's exit status")

    # ---------------------------------------------------------- files

    def stat_path(self, container_id: str, path: str) -> dict[str, Any] | None:
        """The engine's lstat of a container path, or None when it is missing. Blocking.

        Returns ``{"mode": -1}`` for a path the engine cannot stat (a component
        that is not a folder, a name too long); a missing container reads as a
        missing path.
        """
        api = self._api
        try:
            response = api.head(
                api._url("/containers/{0}/archive", container_id), params={"path": path}, timeout=self.timeout
            )
        except Exception as e:
            raise SandboxUnavailableError(f"cannot reach the Docker engine at {self.base_url}: {e}") from e
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            return {"mode": -1}
        return json.loads(base64.b64decode(response.headers["X-Docker-Container-Path-Stat"]))

    async def put_archive(self, container_id: str, folder: str, archive: bytes | Iterable[bytes]) -> None:
        """Extract a (small) tar archive into ``folder`` of the container.

        The engine holds the container's lock until the archive is written: only for
        small files the provider itself writes (workspace files go through commands).
        """
        await self._call("write files", "put_archive", container_id, folder, archive)

    async def read_file(self, container_id: str, path: str, *, limit: int = READ_FILE_LIMIT) -> bytes:
        """A small file of the container, whole (the first member of its archive), read in one call;
        at most ``limit`` bytes: a bigger one raises SandboxError, and no more than ``limit`` (and the
        archive's headers) is ever read. Anything in a container may have been written by its session.

        The engine holds the container's lock while the archive is read: only for small
        files the provider itself keeps (workspace files go through commands).
        """

        def read() -> bytes:
            api = self._api
            response = api._get(
                api._url("/containers/{0}/archive", container_id), params={"path": path}, stream=True
            )
            try:
                api._raise_for_status(response)
                with contextlib.suppress(KeyError, ValueError, TypeError):
                    size = json.loads(base64.b64decode(response.headers["X-Docker-Container-Path-Stat"]))[
                        "size"
                    ]
                    if int(size) > limit:
                        raise SandboxError(
                            f"{path} in the container is {size} bytes, over the {limit} this reads"
                        )
                raw = bytearray()
                for chunk in response.iter_content(64 << 10):
                    raw += chunk
                    if len(raw) > limit + _ARCHIVE_SLACK:
                        raise SandboxError(f"{path} in the container is over the {limit} bytes this reads")
            finally:
                response.close()
            with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r|") as tar:
                member = tar.next()
                if member is not None and member.size > limit:
                    raise SandboxError(
                        f"{path} in the container is {member.size} bytes, over the {limit} this reads"
                    )
                handle = tar.extractfile(member) if member is not None else None
                return handle.read(limit + 1)[:limit] if handle is not None else b""

        return await self._call("read a file", read)
