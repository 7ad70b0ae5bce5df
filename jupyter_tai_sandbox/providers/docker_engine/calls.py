"""EngineCalls: what every call of a :class:`~.docker_engine.DockerEngine` stands on.

It owns:

* the SDK client, connected on first use, and the worker threads its blocking
  calls run in (a pool of its own, so a stalled engine cannot starve the
  event loop's default executor);
* error translation: the SDK's and ``requests``' exceptions become the
  contract's errors -- :class:`SandboxNotFoundError` (nothing there),
  :class:`EngineRefusedError` (the engine answered no; its HTTP status and its
  own message, without the SDK's URL noise), :class:`MissingImageError`, and
  :class:`SandboxUnavailableError` (the engine cannot be reached);
* the deployment scope (``scope``, labels): put on every container, volume
  and network it creates, added to every label query, and checked on what it
  inspects by name or id, so a provider never sees another deployment's things;
* a bound on every call: quick calls give up after ``timeout`` seconds, the
  slow ones (container create and remove, networks, volume removal) after
  ``slow_timeout``, and the SDK's own socket timeout is the longer of the two,
  so a frozen engine never keeps a caller (or, for long, a worker thread)
  waiting: the caller gets a SandboxUnavailableError instead.

The families of calls are mixins of it (``volumes``,
``networks``, ``execs``); ``engine``
composes them, with the container calls, into :class:`DockerEngine`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import functools
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

from ...contract import (
    SandboxError,
    SandboxNotFoundError,
    SandboxQuotaError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
)
from ...fair_share import FairShare
from ...metrics.hooks import engine_error
from .stream import EngineAddress

T = TypeVar("T")

#: quick engine calls (inspect, list, exec create and start...) give up after this many seconds
DEFAULT_TIMEOUT = 10.0
#: slow engine calls (container create-and-start and remove, networks, volume removal)
DEFAULT_SLOW_TIMEOUT = 30.0
#: worker threads for blocking SDK calls (a frozen engine holds one per call in flight)
WORKERS = 32
#: of which one principal may hold at most this many at once (DockerSandbox.engine_threads_per_user)
WORKERS_PER_PRINCIPAL = 8
#: the events an engine keeps for a ``since`` query (moby's ring of its latest events, of every kind)
EVENTS_HELD = 256
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


class EngineCalls:
    """The connection to one Docker engine, reached at ``base_url``, and its calls in bounded worker
    threads: the base of :class:`~.docker_engine.DockerEngine` and of each of its families of calls."""

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
        #: whether open_agent connects to an agent's socket itself: None or True try it for each container (True
        #: once it worked), False never (the operator's agent_transport = "exec": one engine exec per connection)
        self.direct_agent: bool | None = None
        #: why the direct connection could not be used here last (None: it was not refused)
        self.direct_refusal: str | None = None
        #: containers whose agent this host could not reach directly (another host's): the relay for them alone,
        #: until the monotonic time given (then the direct path is tried again)
        self.relay_until: dict[str, float] = {}
        #: each container's PID 1 on this host and its full id, as a direct port connection last found them
        self._pids: dict[str, tuple[int, str]] = {}
        #: each container's own environment, as the inspect of a direct agent connection read it (fixed for the
        #: container's life), until :meth:`EngineExecs.container_env` takes it: a new session's first command
        #: then needs no inspect of its own
        self._envs: dict[str, dict[str, str]] = {}

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
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    WORKERS, thread_name_prefix="docker-engine"
                )

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
        """An SDK (or requests) exception as the contract's error; others pass through. Counted
        (jupyter_tai_sandbox_engine_errors_total, by the error it became) when a server's metrics are on."""
        translated = self._translate(error, what)
        engine_error(translated)
        return translated

    def _translate(self, error: BaseException, what: str) -> BaseException:
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
                f"the Docker engine at {self.base_url} refused to {what}: {detail}",
                status=status,
                detail=detail,
            )
        if isinstance(error, (errors.DockerException, OSError)) or type(error).__module__.startswith(
            ("requests", "urllib3")
        ):
            return SandboxUnavailableError(
                f"cannot reach the Docker engine at {self.base_url} to {what}: {error}"
            )
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
        except TimeoutError:
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

    async def _held_thread(
        self, release: Callable[[], None], fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
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

    # a call names the SDK's method (its result is the engine's JSON: Any) or passes a callable (its result's type)
    @overload
    async def _call(self, what: str, fn: str, *args: Any, **kwargs: Any) -> Any: ...
    @overload
    async def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...
    async def _call(self, what: str, fn: Callable[..., T] | str, *args: Any, **kwargs: Any) -> T:
        """Run a quick blocking SDK call (a callable, or the name of a low-level API method) in a
        worker thread, with its errors typed and its time bounded by ``timeout``."""
        return await self._call_within(self.timeout, what, fn, *args, **kwargs)

    @overload
    async def _slow_call(self, what: str, fn: str, *args: Any, **kwargs: Any) -> Any: ...
    @overload
    async def _slow_call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...
    async def _slow_call(self, what: str, fn: Callable[..., T] | str, *args: Any, **kwargs: Any) -> T:
        """:meth:`_call` bounded by ``slow_timeout``."""
        return await self._call_within(self.slow_timeout, what, fn, *args, **kwargs)

    @overload
    async def _call_within(self, within: float, what: str, fn: str, *args: Any, **kwargs: Any) -> Any: ...
    @overload
    async def _call_within(
        self, within: float, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T: ...
    async def _call_within(
        self, within: float, what: str, fn: Callable[..., T] | str, *args: Any, **kwargs: Any
    ) -> T:
        await self.connect()
        call: Callable[..., T] = getattr(self._api, fn) if isinstance(fn, str) else fn
        release = await self._share()  # waiting for one's own share is no engine's delay
        try:
            return await self._bounded(self._held_thread(release, call, *args, **kwargs), within, what)
        except Exception as e:
            raise self.translate(e, what) from None

    async def has_image(self, name: str) -> bool:
        """Whether the engine holds the image ``name``."""
        try:
            await self._call(f"inspect image {name}", "inspect_image", name)
        except SandboxNotFoundError:
            return False
        return True

    async def inspect_image(self, name: str) -> dict[str, Any]:
        """Any image's description (a session's image belongs to no deployment); MissingImageError when the
        engine lacks it."""
        try:
            return dict(await self._call(f"inspect image {name}", "inspect_image", name))
        except SandboxNotFoundError:
            raise MissingImageError(
                f"image {name!r} is not on the Docker engine at {self.base_url}", image=name
            ) from None

    async def image_user(self, name: str) -> str:
        """The image's USER ('' when it names none); MissingImageError when the engine lacks it."""
        return str(((await self.inspect_image(name)).get("Config") or {}).get("User") or "")

    async def events_between(self, since_ns: int, until_ns: int) -> list[dict[str, Any]]:
        """Every event the engine still holds (moby keeps its last :data:`EVENTS_HELD`, of every kind and
        deployment) stamped from ``since_ns`` to ``until_ns`` (nanoseconds of the engine's clock, both
        included), oldest first, unfiltered: a caller that gets :data:`EVENTS_HELD` less a few may have missed
        older ones. ``until_ns`` in the engine's future makes the engine wait until then."""

        def stamp(ns: int) -> str:
            return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"

        def read() -> list[dict[str, Any]]:
            api = self._api
            response = api._get(
                api._url("/events"),
                params={"since": stamp(since_ns), "until": stamp(until_ns)},
                timeout=self.timeout,
            )
            api._raise_for_status(response)
            return [json.loads(line) for line in response.text.splitlines() if line.strip()]

        return await self._call("read the engine's events", read)

    async def clock_offset(self) -> float:
        """Seconds the engine's clock is ahead of this host's: 0 for an engine on a local socket (this host's
        clock), else its ``/info`` SystemTime against the call's midpoint."""
        if self.base_url.startswith(("unix://", "npipe://")) or "://" not in self.base_url:
            return 0.0
        sent = time.time()
        info = await self._call("read the engine's clock", "info")
        received = time.time()
        text = str(info.get("SystemTime") or "")
        found = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
        if found is None:
            return 0.0
        whole = datetime.datetime.fromisoformat(found.group(1) + found.group(3).replace("Z", "+00:00"))
        engine = whole.timestamp() + float(found.group(2) or 0)
        return engine - (sent + received) / 2

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

    async def inspect_container(
        self, container_id: str, *, what: str = "inspect a container"
    ) -> dict[str, Any]:
        """The container's description; one of another deployment is SandboxNotFoundError, like none."""
        attrs = await self._call(what, "inspect_container", container_id)
        if not self.in_scope((attrs.get("Config") or {}).get("Labels")):
            raise SandboxNotFoundError(f"{what}: no container {container_id[:12]!r} in this deployment")
        return attrs

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking function that calls the engine (such as :meth:`stat_path`) in a worker
        thread, bounded by ``timeout``."""
        await self.connect()
        release = await self._share()
        return await self._bounded(self._held_thread(release, fn, *args), self.timeout, "look at a path")
