"""DockerEngine: every call this package makes to one Docker engine.

A :class:`DockerEngine` is built from the engine's address (``unix://`` or
``tcp://``; TLS material later) and knows nothing of sessions: the docker
provider (and a future swarm provider, with one engine object per node) say
*what* to create, run or remove, and the engine object does it.

It owns:

* the SDK client, connected on first use, and the worker threads its blocking
  calls run in (a pool of its own, so a stalled engine cannot starve the
  event loop's default executor);
* error translation: the SDK's and ``requests``' exceptions become the
  contract's errors -- :class:`SandboxNotFoundError` (nothing there),
  :class:`EngineRefusedError` (the engine answered no; its HTTP status and its
  own message, without the SDK's URL noise), :class:`MissingImageError`, and
  :class:`SandboxUnavailableError` (the engine cannot be reached);
* containers (create-and-start, inspect, list, rename, remove), volumes,
  networks, execs (create, attached start over asyncio streams, inspect,
  resize, a helper command run to its end), the path stat (the engine's
  ``HEAD /containers/{id}/archive``, reached through the SDK's private
  ``api._url``) and small archives in and out (workspace files travel through
  the session agent instead);
* the deployment scope (``scope``, labels): put on every container, volume
  and network it creates, added to every label query, and checked on what it
  inspects by name or id, so a provider never sees another deployment's things;
* a bound on every call: quick calls give up after ``timeout`` seconds, the
  slow ones (container create and remove, networks, volume removal) after
  ``slow_timeout``, and the SDK's own socket timeout is the longer of the two,
  so a frozen engine never keeps a caller (or, for long, a worker thread)
  waiting: the caller gets a SandboxUnavailableError instead.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import io
import json
import os
import re
import tarfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..agent.client import AGENT_PATH, AgentClient, AgentConnectionLost
from ..agent.transport import NotReachableHere, open_docker_streams, open_in_netns
from ..contract import (
    SandboxError,
    SandboxNotFoundError,
    SandboxQuotaError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
)
from ..fair_share import FairShare
from ._docker_stream import EngineAddress, EngineRefusal, read_output, start_exec

T = TypeVar("T")

#: quick engine calls (inspect, list, exec create and start...) give up after this many seconds
DEFAULT_TIMEOUT = 10.0
#: slow engine calls (container create-and-start and remove, networks, volume removal)
DEFAULT_SLOW_TIMEOUT = 30.0
#: the most :meth:`DockerEngine.read_file` reads of a container's file (a session may have written it)
READ_FILE_LIMIT = 1 << 20
#: tar headers and padding around the one member read_file reads
_ARCHIVE_SLACK = 64 << 10
#: the most output :meth:`DockerEngine.run` keeps of a helper command (it runs in a container the session controls)
RUN_OUTPUT_LIMIT = 64 << 20
#: worker threads for blocking SDK calls (a frozen engine holds one per call in flight)
WORKERS = 32
#: of which one principal may hold at most this many at once (DockerSandbox.engine_threads_per_user)
WORKERS_PER_PRINCIPAL = 8
#: how long a network's removal waits for the endpoints of containers just removed to go
LEAVING_WAIT_SECONDS = 10.0  # 3 s was not enough for a loaded engine (an egress network left in two -n 4 runs)
_SDK_NOISE = re.compile(r"^\d{3} (Client|Server) Error for \S+: [^(]*\(\"?(?P<msg>.*?)\"?\)$", re.S)


def docker_sdk() -> Any:
    """The ``docker`` package, or SandboxUnavailableError naming the extra to install."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the docker extra is missing
        raise SandboxUnavailableError(
            "the docker provider needs the docker SDK: pip install 'jupyter-tai-sandbox[docker]'"
        ) from e
    return docker


def _age(created: Any, now: float) -> float:
    """Seconds since an engine timestamp (RFC 3339, nanoseconds and all); 0 when unreadable."""
    from datetime import datetime

    text = re.sub(r"(\.\d{6})\d+", r"\1", str(created or "")).replace("Z", "+00:00")
    try:
        return now - datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def readable(error: Any) -> str:
    """The engine's own message of an SDK error, without the SDK's status line and URL."""
    text = str(getattr(error, "explanation", None) or error)
    found = _SDK_NOISE.match(text)
    return (found.group("msg") if found else text).strip()


class EngineRefusedError(SandboxError):
    """The engine answered a request with an error: ``status`` (HTTP) and its own ``detail``."""

    def __init__(self, message: str, *, status: int | None, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class MissingImageError(SandboxSpecRejectedError):
    """The image a container was asked of is not on the engine."""

    def __init__(self, message: str, *, image: str) -> None:
        super().__init__(message)
        self.image = image


class DockerEngine:
    """One Docker engine, reached at ``base_url``; every method is a coroutine unless noted."""

    def __init__(
        self,
        base_url: str,
        *,
        tls: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        slow_timeout: float = DEFAULT_SLOW_TIMEOUT,
        scope: Mapping[str, str] | None = None,
        threads_per_principal: int = WORKERS_PER_PRINCIPAL,
    ) -> None:
        self.base_url = base_url
        self._tls = tls
        #: labels of the deployment this engine object works in (empty: the whole engine)
        self.scope = dict(scope or {})
        #: seconds a quick call may take, and a slow one
        self.timeout = timeout
        self.slow_timeout = max(slow_timeout, timeout)
        self._client: Any = None
        self._address: EngineAddress | None = None
        self._connecting: asyncio.Lock | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: each principal's share of the worker threads (see ``fair_share``)
        #: worker-thread calls that have ended (however): a sign the engine answers
        self.finished = 0
        self.share = FairShare(threads_per_principal, setting="DockerSandbox.engine_threads_per_user")
        #: calls made into the engine so far: blocking ones (each takes a worker thread), exec streams opened
        self.calls = 0
        #: whether open_agent connects to an agent's socket itself: None tries it (and keeps to the relay after
        #: a first failure), True once it worked, False never (the relay: one engine exec per connection)
        self.direct_agent: bool | None = None
        #: why the direct connection could not be used here (None: it was not refused)
        self.direct_refusal: str | None = None

    # ------------------------------------------------------------ plumbing

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def api(self) -> Any:
        """The SDK's low-level client (blocking: for worker threads only)."""
        return self._api

    @property
    def _api(self) -> Any:
        if self._client is None:
            raise SandboxUnavailableError(f"not connected to the Docker engine at {self.base_url}")
        return self._client.api

    async def connect(self) -> None:
        """Connect on first use (idempotent); SandboxUnavailableError when the engine does not answer."""
        if self._client is not None:
            return
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is not None:
                return
            address = EngineAddress(self.base_url)
            docker = docker_sdk()
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="docker-engine")

            def connect() -> Any:
                return docker.DockerClient(
                    base_url=self.base_url, version="auto", timeout=self.slow_timeout, tls=self._tls or False
                )

            try:
                client = await self._bounded(self._thread(connect), self.timeout, "connect")
            except SandboxUnavailableError:
                raise
            except Exception as e:
                raise SandboxUnavailableError(
                    f"cannot reach the Docker engine at {self.base_url}: {e}. Start one (dockerd) or set "
                    "DockerSandbox.base_url / DOCKER_HOST"
                ) from None
            self._address, self._client = address, client

    def translate(self, error: BaseException, what: str) -> BaseException:
        """An SDK (or requests) exception as the contract's error; others pass through."""
        if isinstance(error, SandboxError):
            return error
        errors = docker_sdk().errors
        if isinstance(error, errors.ImageNotFound):
            return SandboxNotFoundError(f"the Docker engine has no image to {what}: {readable(error)}")
        if isinstance(error, errors.NotFound):
            return SandboxNotFoundError(f"the Docker engine found nothing to {what}: {readable(error)}")
        if isinstance(error, errors.APIError):
            status = getattr(getattr(error, "response", None), "status_code", None)
            detail = readable(error)
            return EngineRefusedError(
                f"the Docker engine at {self.base_url} refused to {what}: {detail}", status=status, detail=detail
            )
        if isinstance(error, (errors.DockerException, OSError)) or type(error).__module__.startswith(
            ("requests", "urllib3")
        ):
            return SandboxUnavailableError(f"cannot reach the Docker engine at {self.base_url} to {what}: {error}")
        return error

    def unanswered(self, within: float, what: str) -> SandboxUnavailableError:
        """The error of a call the engine did not answer in time."""
        return SandboxUnavailableError(
            f"the Docker engine at {self.base_url} did not answer within {within:g} s (to {what}); "
            "it may be overloaded or stopped (DockerSandbox.engine_timeout_seconds)"
        )

    async def _bounded(self, awaitable: Any, within: float, what: str) -> Any:
        try:
            return await asyncio.wait_for(awaitable, within)
        except asyncio.TimeoutError:
            raise self.unanswered(within, what) from None

    async def _thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` in a worker thread, within the acting principal's share of them: its slot is
        held until the thread is done (not merely until a caller that gave up stops waiting), so
        calls one user abandoned still count against that user. A share that stays full for
        ``timeout`` s is a SandboxQuotaError (429)."""
        release = await self._share()
        return await self._held_thread(release, fn, *args, **kwargs)

    async def _share(self) -> Callable[[], None]:
        """A slot of the acting principal's share (see :meth:`_thread`). A share that stays full while
        the engine finishes no call at all is the engine not answering (503), not the user's flood (429)."""
        finished = self.finished
        try:
            return await self.share.take(self.timeout)
        except SandboxQuotaError:
            if self.finished == finished:
                raise self.unanswered(self.timeout, "run any call") from None
            raise

    async def _held_thread(self, release: Callable[[], None], fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            assert self._executor is not None
            future = self._executor.submit(functools.partial(fn, *args, **kwargs))
        except BaseException:
            release()
            raise
        self.calls += 1

        def finish() -> None:
            self.finished += 1
            release()

        def done(_: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is left to count
                loop.call_soon_threadsafe(finish)

        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    async def _call(self, what: str, fn: Callable[..., T] | str, *args: Any, **kwargs: Any) -> T:
        """Run a quick blocking SDK call (a callable, or the name of a low-level API method) in a
        worker thread, with its errors typed and its time bounded by ``timeout``."""
        return await self._call_within(self.timeout, what, fn, *args, **kwargs)

    async def _slow_call(self, what: str, fn: Callable[..., T] | str, *args: Any, **kwargs: Any) -> T:
        """:meth:`_call` bounded by ``slow_timeout``."""
        return await self._call_within(self.slow_timeout, what, fn, *args, **kwargs)

    async def _call_within(self, within: float, what: str, fn: Callable[..., T] | str, *args: Any, **kwargs: Any) -> T:
        await self.connect()
        if isinstance(fn, str):
            fn = getattr(self._api, fn)
        release = await self._share()  # waiting for one's own share is no engine's delay
        try:
            return await self._bounded(self._held_thread(release, fn, *args, **kwargs), within, what)
        except Exception as e:
            raise self.translate(e, what) from None

    async def has_image(self, name: str) -> bool:
        """Whether the engine holds the image ``name``."""
        try:
            await self._call(f"inspect image {name}", "inspect_image", name)
        except SandboxNotFoundError:
            return False
        return True

    async def image_user(self, name: str) -> str:
        """The image's USER ('' when it names none); MissingImageError when the engine lacks it."""
        try:
            found = await self._call(f"inspect image {name}", "inspect_image", name)
        except SandboxNotFoundError:
            raise MissingImageError(f"image {name!r} is not on the Docker engine at {self.base_url}", image=name) from None
        return str((found.get("Config") or {}).get("User") or "")

    async def ping(self) -> None:
        """Answer when the engine does (within ``timeout``); SandboxUnavailableError when it cannot be reached."""
        await self._call("answer a ping", "ping")

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                await self._thread(client.close)
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False)

    # ---------------------------------------------------------- containers

    async def create_container(
        self, image: str, options: Mapping[str, Any], *, what: str = "create a container",
    ) -> str:
        """Create and start a container (``options`` as the SDK's ``containers.create`` takes them).

        A start that fails removes the container again. MissingImageError when the
        image is not on the engine. The container carries the deployment's labels.
        """
        docker = docker_sdk()
        options = {**options, "labels": self.scoped_labels(options.get("labels"))}

        def create() -> str:
            try:
                container = self._client.containers.create(image, **options)
            except docker.errors.ImageNotFound as e:
                raise MissingImageError(
                    f"image {image!r} is not on the Docker engine at {self.base_url}: {readable(e)}", image=image
                ) from None
            try:
                container.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    container.remove(force=True, v=True)
                raise
            return str(container.id)

        await self.connect()
        made = asyncio.ensure_future(self._thread(create))
        try:
            return await self._bounded(asyncio.shield(made), self.slow_timeout, what)
        except SandboxUnavailableError:
            # the engine may still make it later: remove it then, nobody will own it
            made.add_done_callback(functools.partial(self._remove_late, options.get("name")))
            raise
        except Exception as e:
            raise self.translate(e, what) from None

    def _remove_late(self, name: str | None, made: asyncio.Future[str]) -> None:
        """After a create its caller gave up on: remove the container (by name, as a failed start whose
        own removal timed out leaves one behind too)."""
        made_id = None if made.cancelled() or made.exception() is not None else made.result()
        container_id, client = made_id or name, self._client
        if container_id is None or client is None:
            return

        def remove() -> None:
            with contextlib.suppress(Exception):
                client.api.remove_container(container_id, force=True, v=True)

        # a thread of its own: the engine object may be closed meanwhile
        threading.Thread(target=remove, name="docker-engine-late-remove", daemon=False).start()

    # ------------------------------------------------------------- scope

    def in_scope(self, labels: Mapping[str, str] | None) -> bool:
        """Whether something with ``labels`` belongs to this engine object's deployment."""
        return all((labels or {}).get(k) == v for k, v in self.scope.items())

    def scoped_labels(self, labels: Mapping[str, str] | None) -> dict[str, str]:
        """``labels`` with the deployment's own (which win)."""
        return {**(labels or {}), **self.scope}

    def label_filter(self, label: str | Sequence[str]) -> list[str]:
        """A label filter (``key`` or ``key=value``, or all of a list) narrowed to the deployment."""
        wanted = [label] if isinstance(label, str) else list(label)
        return wanted + [f"{k}={v}" for k, v in self.scope.items()]

    async def inspect_container(self, container_id: str, *, what: str = "inspect a container") -> dict[str, Any]:
        """The container's description; one of another deployment is SandboxNotFoundError, like none."""
        attrs = await self._call(what, "inspect_container", container_id)
        if not self.in_scope((attrs.get("Config") or {}).get("Labels")):
            raise SandboxNotFoundError(f"{what}: no container {container_id[:12]!r} in this deployment")
        return attrs

    async def containers(self, label: str | Sequence[str], *, what: str = "list containers") -> list[dict[str, Any]]:
        """Summaries of every container (all states) of the deployment carrying ``label`` (``key`` or
        ``key=value``; all of a list)."""
        await self.connect()
        filters = {"label": self.label_filter(label)}
        return list(await self._call(what, "containers", all=True, filters=filters) or [])

    async def stats(self, container_id: str) -> dict[str, Any]:
        """One sample of the container's stats (``one_shot``: no second sample is waited for), bounded
        by ``timeout``; an engine older than API 1.41 takes about 2 s for it."""
        docker = docker_sdk()

        def sample() -> dict[str, Any]:
            try:
                return self._api.stats(container_id, stream=False, one_shot=True)
            except docker.errors.InvalidVersion:
                return self._api.stats(container_id, stream=False)

        return dict(await self._call("read a container's stats", sample) or {})

    async def rename(self, container_id: str, name: str) -> None:
        await self._call("name a container", "rename", container_id, name)

    async def remove_container(self, container_id: str, *, volume: str | None = None) -> None:
        """Remove a container with its anonymous volumes (and the named ``volume``); missing ones are fine."""
        docker = docker_sdk()

        def remove() -> None:
            try:
                self._client.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise
            if volume is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    self._client.api.remove_volume(volume)

        await self._slow_call("remove a container", remove)

    # ------------------------------------------------------------- volumes

    async def volume(self, name: str) -> dict[str, Any] | None:
        """The volume's description, or None when there is none in the deployment."""
        try:
            found = await self._call(f"inspect volume {name}", "inspect_volume", name)
        except SandboxNotFoundError:
            return None
        return found if self.in_scope(found.get("Labels")) else None

    async def create_volume(self, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        """Create a volume of the deployment; the engine returns an existing one of that name unchanged
        (check its labels): one of another deployment is an EngineRefusedError (409)."""
        made = await self._call(f"create volume {name}", "create_volume", name, labels=self.scoped_labels(labels))
        if not self.in_scope(made.get("Labels")):
            raise EngineRefusedError(
                f"create volume {name}: another deployment on this engine holds that name",
                status=409, detail="the name is taken",
            )
        return made

    async def volumes(self, label: str | Sequence[str]) -> list[dict[str, Any]]:
        """The deployment's volumes carrying ``label`` (all of a list)."""
        found = await self._call("list volumes", "volumes", filters={"label": self.label_filter(label)})
        return list((found or {}).get("Volumes") or [])

    async def fill_shared_volume(self, name: str, image: str, archive: bytes, *, labels: Mapping[str, str],
                                 refill: bool = False, stale_seconds: float = 60.0) -> None:
        """Make the engine-wide volume ``name`` hold ``archive``, unless it does already (``refill``: even
        then). The volume is shared by every deployment on the engine, like an image, so it carries
        ``labels`` and no deployment's. It is filled through a container of ``image`` named ``<name>-fill``,
        created with the volume (which it creates), given the archive and removed, never started: that
        container's name is the fill's lock, so a volume that exists while no such container does is whole.
        A fill container older than ``stale_seconds`` was left by a crash: it is removed and the fill redone."""
        docker = docker_sdk()
        filler = f"{name}-fill"

        def exists(look: Callable[[str], Any], what: str) -> Any:  # the SDK's look, None for a 404
            try:
                return look(what)
            except docker.errors.NotFound:
                return None

        def fill() -> None:
            api = self._client.api
            forced = refill
            while True:
                volume = exists(api.inspect_volume, name)
                holder = exists(api.inspect_container, filler)
                if volume is not None and holder is None and not forced:
                    return
                if holder is not None:
                    if _age(holder.get("Created"), time.time()) > stale_seconds:
                        with contextlib.suppress(docker.errors.NotFound):
                            api.remove_container(filler, force=True)
                    else:
                        time.sleep(0.1)  # another server fills it: wait for its lock to go
                        forced = False
                    continue
                mount = docker.types.Mount("/fill", name, type="volume", labels=dict(labels))
                try:
                    made = api.create_container(
                        image, name=filler, entrypoint=["/fill/none"], command=[], labels=dict(labels),
                        host_config=api.create_host_config(mounts=[mount], network_mode="none"),
                    )
                except docker.errors.ImageNotFound as e:
                    raise MissingImageError(
                        f"image {image!r} is not on the Docker engine at {self.base_url}: {readable(e)}", image=image
                    ) from None
                except docker.errors.APIError as e:
                    if getattr(e.response, "status_code", None) == 409:
                        continue  # another server took the lock first
                    raise
                try:
                    api.put_archive(made["Id"], "/fill", archive)
                finally:
                    with contextlib.suppress(docker.errors.NotFound):
                        api.remove_container(made["Id"], force=True)
                return

        await self._slow_call(f"fill volume {name}", fill)

    async def shared_volumes(self, label: str, *, dangling: bool = False) -> list[dict[str, Any]]:
        """Engine-wide volumes carrying ``label`` (any deployment's, or none's: see :meth:`fill_shared_volume`)."""
        filters: dict[str, Any] = {"label": [label]}
        if dangling:
            filters["dangling"] = True
        found = await self._call("list volumes", "volumes", filters=filters)
        return list((found or {}).get("Volumes") or [])

    async def remove_volume(self, name: str) -> None:
        """Remove a volume; a missing one is fine, one in use is an EngineRefusedError (409)."""
        with contextlib.suppress(SandboxNotFoundError):
            await self._slow_call(f"remove volume {name}", "remove_volume", name)

    # ------------------------------------------------------------ networks

    async def ensure_network(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        options: Mapping[str, str],
        internal: bool,
        subnet: Callable[[list[dict[str, Any]]], str],
    ) -> None:
        """Create the bridge network ``name`` unless it exists. ``subnet`` picks its IPv4 subnet from
        the engine's networks (every network, so it overlaps none; it raises when none is free); a
        subnet a concurrent creator took meanwhile is picked again."""

        docker = docker_sdk()

        def ensure() -> None:
            client = self._client
            for _ in range(8):
                found = [n for n in client.api.networks(names=[name]) if n.get("Name") == name]
                if found:
                    if not self.in_scope(found[0].get("Labels")):
                        raise EngineRefusedError(
                            f"network {name} belongs to another deployment on this engine", status=409, detail="taken"
                        )
                    return
                ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet(client.api.networks()))])
                try:
                    client.api.create_network(
                        name, driver="bridge", internal=internal, check_duplicate=True, options=dict(options),
                        ipam=ipam, labels=self.scoped_labels(labels),
                    )
                    return
                except docker.errors.APIError as e:
                    if e.status_code == 409:  # another provider on this engine made it meanwhile
                        continue
                    if "overlap" not in readable(e).lower():  # a subnet taken meanwhile: pick again
                        raise
            raise EngineRefusedError(
                f"network {name}: every subnet picked was taken meanwhile", status=409, detail="subnet race"
            )

        await self._slow_call(f"create network {name}", ensure)

    async def networks(self, label: str) -> list[dict[str, Any]]:
        """The deployment's networks carrying ``label``."""
        found = await self._call("list networks", "networks", filters={"label": self.label_filter(label)})
        return list(found or [])

    async def network_connect(self, container_id: str, network: str) -> None:
        await self._slow_call(f"connect a container to {network}", "connect_container_to_network", container_id, network)

    async def network_disconnect(self, container_id: str, network: str) -> None:
        await self._call(f"disconnect a container from {network}", "disconnect_container_from_network", container_id, network)

    async def drop_network_if_idle(self, name: str, *, leaving: Collection[str] = ()) -> bool:
        """Remove network ``name`` when no container is on it; True when it is gone.

        ``leaving`` are containers just removed: the engine can list their endpoints (and refuse the
        removal for them) for a moment after a container is gone, so they are waited out, for at most
        ``LEAVING_WAIT_SECONDS``, instead of being taken for users of the network (which left the
        network behind until the reaper's grace). So is the endpoint of any container that no longer
        exists: another session's, removed just before, whose own removal gave up on this caller's
        container (each saw the other's endpoint and left the network to the other)."""
        docker = docker_sdk()

        def gone(container_id: str) -> bool:
            if any(container_id.startswith(g) or g.startswith(container_id) for g in leaving):
                return True
            try:
                self._client.api.inspect_container(container_id)
            except docker.errors.NotFound:
                return True
            return False

        def still_leaving(on: Collection[str]) -> bool:
            return bool(on) and all(gone(c) for c in on)

        def drop() -> bool:
            deadline = time.monotonic() + LEAVING_WAIT_SECONDS
            for network in self._client.networks.list(names=[name]):
                if network.name != name or not self.in_scope(network.attrs.get("Labels")):
                    continue
                while True:
                    network.reload()
                    on = list(network.attrs.get("Containers") or {})
                    if not on:
                        try:
                            network.remove()
                            break
                        except docker.errors.NotFound:
                            break
                        except docker.errors.APIError:
                            pass  # an endpoint still going, or a container joined meanwhile: look again
                    elif not still_leaving(on):
                        return False
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
            return True

        return await self._slow_call(f"remove network {name}", drop)

    # --------------------------------------------------------------- execs

    async def exec_create(
        self, container_id: str, cmd: Sequence[str], *, env: Mapping[str, str] | None, stdin: bool, tty: bool
    ) -> str:
        created = await self._call(
            "create a command", "exec_create", container_id, list(cmd), stdin=stdin, tty=tty,
            environment=dict(env or {}),
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
        its ``connect`` relay. Another host's engine fails the cgroup check on its first container (its
        process id names no such container here): the relay from then on."""
        if self.direct_agent is not False and os.geteuid() == 0:
            attrs = await self.inspect_container(container_id, what="find a session's agent")
            pid = int((attrs.get("State") or {}).get("Pid") or 0)
            if pid > 0:
                try:
                    client = await open_in_netns(pid, str(attrs["Id"]))
                except NotReachableHere as e:
                    if self.direct_agent is None:  # it never worked here: the relay from now on
                        self.direct_agent = False
                        self.direct_refusal = str(e)
                except OSError as e:
                    raise AgentConnectionLost(f"the session agent's socket: {e}") from None
                else:
                    self.direct_agent = True
                    return client
        exec_id = await self.exec_create(container_id, [AGENT_PATH, "connect"], env=None, stdin=True, tty=False)
        reader, writer = await self.exec_start(exec_id, False)
        try:
            return await open_docker_streams(reader, writer)
        except BaseException:
            writer.close()
            raise

    async def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        return await self._call("inspect a command", "exec_inspect", exec_id)

    async def exec_resize(self, exec_id: str, rows: int, cols: int) -> None:
        await self._call("resize a terminal", "exec_resize", exec_id, height=rows, width=cols)

    async def exec_exit_code(self, exec_id: str, *, within: float) -> int | None:
        """The exec's exit status once the engine reports it ended; None when it still runs after ``within`` s.

        Bounded: an engine that does not answer by then is a SandboxUnavailableError.
        """
        loop = asyncio.get_running_loop()
        give_up: float | None = None  # counted from the first answer: a wait for the caller's share is not the engine's
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
        self, container_id: str, cmd: Sequence[str], *, said: list[bytes] | None = None, limit: int = RUN_OUTPUT_LIMIT
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

    def run_blocking(self, container_id: str, cmd: Sequence[str], *, limit: int = 64 << 10) -> tuple[int, bytes]:
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

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking function that calls the engine (such as :meth:`stat_path`) in a worker
        thread, bounded by ``timeout``."""
        await self.connect()
        release = await self._share()
        return await self._bounded(self._held_thread(release, fn, *args), self.timeout, "look at a path")

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
            response = api._get(api._url("/containers/{0}/archive", container_id), params={"path": path}, stream=True)
            try:
                api._raise_for_status(response)
                with contextlib.suppress(KeyError, ValueError, TypeError):
                    size = json.loads(base64.b64decode(response.headers["X-Docker-Container-Path-Stat"]))["size"]
                    if int(size) > limit:
                        raise SandboxError(f"{path} in the container is {size} bytes, over the {limit} this reads")
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
                    raise SandboxError(f"{path} in the container is {member.size} bytes, over the {limit} this reads")
                handle = tar.extractfile(member) if member is not None else None
                return handle.read(limit + 1)[:limit] if handle is not None else b""

        return await self._call("read a file", read)


__all__ = [
    "DockerEngine",
    "EngineRefusal",
    "EngineRefusedError",
    "MissingImageError",
    "docker_sdk",
    "readable",
]
