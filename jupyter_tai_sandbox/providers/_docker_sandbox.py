"""The base of providers on the Docker Engine API (docker, swarm): what they share of a provider.

:class:`ContainerSandbox` holds the operator's settings of a container provider (images, limits,
hardening, networks, the deployment scope, each trait with its help), the policy derived from
them (the default image, the allow-list, cpu and memory limits in force, image references), the
owner check of persistent workspaces, the network locks and the status ping. A provider
subclasses it with its engine (``self._engine``, set in its ``__init__``) and its own
sessions; the labels that carry a session's spec are read back by :func:`spec_from_labels`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from traitlets import Bool, Enum, Float, Integer, List, Unicode, default

from ..contract import (
    Sandbox,
    SandboxConflictError,
    SandboxError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionLimits,
    SessionSpec,
)
from ..images import AGENTS_IMAGE, DEFAULT_IMAGE, PYTHON_IMAGE
from ..policy import within_limits
from ..spool import DEFAULT_MEMORY_LIMIT
from ._common import ProviderMeta
from ._provider_settings import DeploymentSettings, LimitSettings, NetworkSettings, rejected
from ._workspaces import unscoped_serves
from .docker_engine import WORKERS, WORKERS_PER_PRINCIPAL, DockerEngine, EngineRefusedError
from .docker_engine.names import (
    LABEL_AGENT,
    LABEL_OWNER,
    LABEL_SPEC,
    LABEL_USER,
    LABEL_WORKSPACE,
    session_labels,
)

if TYPE_CHECKING:
    from .container.session import ContainerSession

S = TypeVar("S", bound="ContainerSession")

#: a Docker image reference: [registry[:port]/]name[/name...][:tag][@digest], or an image id
_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_NAME}(?:/{_NAME})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
    r"(?:@sha256:[0-9a-f]{64})?$"
    r"|^(?:sha256:)?[0-9a-f]{12,64}$"
)


def how_to_get(image: str) -> str:
    """Advice for a missing image: the build command of our own images, never another image's name."""
    if image == DEFAULT_IMAGE:
        return "build it with `jupyter tai-sandbox build-image` (offline, about 2 MB)"
    if image == PYTHON_IMAGE:
        return "build it with `jupyter tai-sandbox build-image --python` (python3 and ipykernel, offline)"
    if image == AGENTS_IMAGE:
        return (
            "build it with `jupyter tai-sandbox build-image --agents` (Node.js and the ACP agents, offline)"
        )
    return (
        "load or build it on that engine (`docker load`, `docker build`), or use one of the package's own "
        f"images: {DEFAULT_IMAGE} (`jupyter tai-sandbox build-image`) or {PYTHON_IMAGE} "
        "(`jupyter tai-sandbox build-image --python`)"
    )


#: how long the status route waits for the engine's ping before it answers 503 (status stays fast)
STATUS_PING_SECONDS = 0.5


def spec_from_labels(labels: Mapping[str, str], env: Sequence[str] | None) -> SessionSpec:
    """The spec a session's labels record (env *names* only), with the values found in ``env``
    (``NAME=value`` items: the container's environment, or a pooled session's record). Without ``env`` (a
    list's, a reap's: every value ''), the spec of the same labels is parsed once (it is frozen)."""
    if env is None:
        return _spec_without_env(labels[LABEL_SPEC], labels.get(LABEL_OWNER))
    return _spec(labels[LABEL_SPEC], env, labels.get(LABEL_OWNER))


def _spec(spec_label: str, env: Sequence[str] | None, owner: str | None) -> SessionSpec:
    public = json.loads(spec_label)
    values = dict(item.split("=", 1) for item in env or () if "=" in item)
    public["env"] = {name: values.get(name, "") for name in public.get("env", [])}
    if owner is not None:
        public["owner"] = owner
    return SessionSpec.from_json(public)


@functools.lru_cache(maxsize=4096)
def _spec_without_env(spec_label: str, owner: str | None) -> SessionSpec:
    """A list of 1,000 sessions parsed each one's spec each time (~25 us apiece, a third of the list's own CPU)."""
    return _spec(spec_label, None, owner)


class ContainerSandbox(NetworkSettings, DeploymentSettings, LimitSettings, Sandbox, metaclass=ProviderMeta):
    """A container provider's settings and policy (see the module's docstring)."""

    _engine: DockerEngine  # set by each subclass's __init__

    max_isolation = "container"
    networks = frozenset({"egress", "internal", "none"})
    supports_limits = True

    image = Unicode(
        "",
        help=f"""Session image when a spec names none. Empty (the default): the package's Python image
        {PYTHON_IMAGE} when the engine has it (`jupyter tai-sandbox build-image --python`), else the
        minimal image {DEFAULT_IMAGE} (`jupyter tai-sandbox build-image`), chosen when the provider first
        reaches the engine (restart the server after building the Python image). The image needs nothing
        of its own (no shell, no /tmp): the session agent runs the commands.""",
    ).tag(config=True)

    allowed_images = List(
        Unicode(),
        default_value=[],
        help="""Images (besides `image`) that callers who are not admins may ask for; shell-style
        patterns such as 'registry.example.com/team/*' are allowed. Empty: only `image`. Admins may use
        any image present on the engine.""",
    ).tag(config=True)

    base_url = Unicode(
        help="Docker engine URL (unix:// or tcp://). Default: $DOCKER_HOST, else unix:///var/run/docker.sock.",
    ).tag(config=True)

    cap_drop = List(
        Unicode(), default_value=["ALL"], help="Linux capabilities dropped from session containers."
    ).tag(config=True)

    cap_add = List(
        Unicode(),
        default_value=[],
        help="Linux capabilities added back to session containers (after cap_drop).",
    ).tag(config=True)

    no_new_privileges = Bool(
        True, help="Run session containers with no-new-privileges (setuid binaries gain nothing)."
    ).tag(config=True)

    pids_limit = Integer(
        1024,
        help="""Most processes (threads included) a session container may hold at once (0: the engine's
        default, unlimited). The session agent takes 8 of them: threads it makes at its start so that
        a command taking every pid left can never stop it (agent/main.go, reserveThreads).""",
    ).tag(config=True)

    read_only_rootfs = Bool(
        False,
        help="Mount the container's root filesystem read-only (/tmp becomes a tmpfs; /workspace stays writable).",
    ).tag(config=True)

    disk_limit_mb = Integer(
        2048,
        help="""Disk ceiling (MiB) of every session: the root filesystem is read-only, and the ephemeral
        workspace and /tmp are each a tmpfs of at most this size, which the kernel enforces (a write past
        it fails with 'No space left on device'), so nothing a session writes lands on the engine's disk.
        Those files are memory: what the session's processes write counts toward its memory limit too.
        A persistent workspace is a volume on the engine's storage and is not capped by this (nor, on swarm,
        the ephemeral workspace: only /tmp). 0: no
        ceiling (a writable root and workspace on the engine's disk, without bound).""",
    ).tag(config=True)

    user = Unicode(
        "",
        help="""User commands run as, 'uid[:gid]' or a name the image knows ('' = the image's USER).
        File uploads and downloads run as that user too (uploaded files belong to it), so they have
        no more rights in the container than the session's own commands.""",
    ).tag(config=True)

    agent_transport = Enum(
        ["auto", "exec"],
        "auto",
        help="""How the server reaches a session's agent. 'auto': a server running as root on the engine's
        host (an engine whose containers' processes it sees, over unix:// or TCP) connects to the agent's socket itself,
        from the container's network namespace: no engine exec and no relay process on the path, so
        commands start and stream faster; anywhere else, and 'exec', one engine exec of the agent's
        connect relay per session connection. The agent accepts only a peer from outside the session
        either way.""",
    ).tag(config=True)

    transfer_idle_seconds = Float(
        60.0,
        help="""A file download or upload that moves no data for this many seconds is aborted (a client
        that stops reading or sending, or an engine that stops answering): the transfer fails with
        TransferIdleError and an upload leaves the target as it was. Transfers hold no engine lock and
        no worker thread meanwhile.""",
    ).tag(config=True)

    engine_timeout_seconds = Float(
        10.0,
        help="""Longest a quick Docker engine call (inspect, list, start a command, look at a path...) may
        take before it fails with SandboxUnavailableError, so a stalled or frozen engine never keeps a
        caller waiting.""",
    ).tag(config=True)

    engine_slow_timeout_seconds = Float(
        30.0,
        help="""Longest a slow Docker engine call (create and start a container, remove one, make or
        remove a network, remove a volume) may take before it fails with SandboxUnavailableError.""",
    ).tag(config=True)

    engine_threads_per_user = Integer(
        WORKERS_PER_PRINCIPAL,
        help=f"""Most of the engine object's {WORKERS} worker threads (each blocking engine call holds one)
        one user (principal) may hold at once; a user past it waits for their own calls to end (429
        SandboxQuotaError after engine_timeout_seconds), so one user flooding requests cannot take the pool
        and everyone else's calls still run. The server's own work (reaper, warm pool) is not capped.
        0: no per-user cap.""",
    ).tag(config=True)

    output_memory_bytes = Integer(
        DEFAULT_MEMORY_LIMIT,
        help="Bytes of a command's unread output kept in memory before it spills to a temporary file.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._status_ping: asyncio.Future[None] | None = None

    @default("base_url")
    def _base_url_default(self) -> str:
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    async def check_available(self) -> None:
        """The engine answers a ping within STATUS_PING_SECONDS, or SandboxUnavailableError saying it cannot be
        reached; one ping at a time (a frozen engine holds one worker thread, not one per status call)."""
        ping = getattr(self, "_status_ping", None)
        if ping is None or ping.done():
            ping = self._status_ping = asyncio.ensure_future(self._engine.ping())
            ping.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.wait_for(asyncio.shield(ping), STATUS_PING_SECONDS)
        except TimeoutError:
            raise SandboxUnavailableError(
                f"the Docker engine at {self._engine.base_url} did not answer a ping within "
                f"{STATUS_PING_SECONDS:g} s (stopped or overloaded)"
            ) from None

    # ---------------------------------------------------------------- policy

    #: what an empty ``image`` means until the engine has been asked (see :meth:`_choose_default_image`)
    _auto_image = DEFAULT_IMAGE
    _image_chosen = False

    @property
    def default_image(self) -> str:
        """The image of a session whose spec names none."""
        return self.image or self._auto_image

    async def _choose_default_image(self) -> None:
        """With ``image`` empty, the Python image when the engine has it, else the minimal one."""
        if not self.image:
            self._auto_image = PYTHON_IMAGE if await self._engine.has_image(PYTHON_IMAGE) else DEFAULT_IMAGE
        self._image_chosen = True

    def session_limits(self) -> SessionLimits:
        """The operator's cpu and memory bounds and defaults, and the images a caller who is not an admin may ask
        for: the configured one, or with ``image`` empty both of the package's own, and ``allowed_images``. The
        default image is named once known (an empty ``image`` is chosen when the engine is first reached)."""
        name = type(self).__name__
        configured = (self.image,) if self.image else (DEFAULT_IMAGE, PYTHON_IMAGE)
        known = self.image or self._image_chosen
        return SessionLimits(
            kind=self.kind,
            settings=name,
            max_isolation=self.max_isolation,
            networks=frozenset(self.networks),
            default_image=self.default_image if known else None,
            images=(*configured, *self.allowed_images),
            images_setting=f"{name}.allowed_images",
            egress_policy=self.egress_policy,
            egress_refusal=self.egress_refusal,
            **self.limit_fields(),
        )

    def _image_of(self, spec: SessionSpec) -> str:
        image = spec.image or self.default_image
        if len(image) > 255 or not _IMAGE_REF.match(image):
            raise rejected(f"image: {image[:100]!r} is not a valid image reference (for example 'name:tag')")
        return image

    async def _workspace_volume(self, engine: DockerEngine, spec: SessionSpec) -> str:
        """The name of the volume that is the spec's persistent workspace on ``engine`` (keys are a namespace
        per owner, see providers/_workspaces): the key's unscoped volume for a spec without an owner, when its
        recorded owner is the spec's (made before keys were per owner), or for the home owner when none is
        recorded; else the owner's own volume."""
        key = str(spec.workspace_key)
        unscoped = self.scope.workspace_volume(key)
        if spec.owner is None:
            return unscoped
        scoped = self.scope.workspace_volume(key, spec.owner)
        found = await engine.volume(unscoped)
        recorded = None if found is None else (found.get("Labels") or {}).get(LABEL_OWNER)
        home = spec.owner == self.home_owner
        has_scoped = home and recorded is None and await engine.volume(scoped) is not None
        if unscoped_serves(spec.owner, recorded, home=home, has_scoped=has_scoped):
            return unscoped
        return scoped

    async def _workspace(self, spec: SessionSpec) -> str:
        """Make the persistent workspace volume (recording its key and owner) if it is new; its name."""
        key = str(spec.workspace_key)
        name = await self._workspace_volume(self._engine, spec)
        volume = await self._engine.volume(name)
        if volume is None:
            labels = {**self.own_labels, LABEL_WORKSPACE: key}
            if spec.owner is not None:
                labels[LABEL_OWNER] = spec.owner
            volume = await self._engine.create_volume(name, labels)  # an existing one comes back unchanged
        recorded = (volume.get("Labels") or {}).get(LABEL_OWNER)
        if spec.owner is not None and recorded is not None and recorded != spec.owner:
            # only two owners whose tags meet get here: never mount another's
            raise SandboxNotFoundError(f"no workspace {key!r} can be made for this owner: name another key")
        return name

    async def _connect(self) -> None:
        """Reach the engine (once); a provider may choose its default image there (docker does)."""
        raise NotImplementedError

    async def _prepared(self, spec: SessionSpec) -> SessionSpec:
        """``spec`` as a create runs it: within the provider's limits (refused before the engine is asked), its
        image named once the engine is reached (info() says which image a session runs)."""
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        spec = within_limits(spec, self.session_limits())
        self._image_of(spec)
        await self._connect()
        return within_limits(spec, self.session_limits())

    def _new_labels(
        self, session_id: str, spec: SessionSpec, now: float, expires: float, user: str
    ) -> dict[str, str]:
        """A new session's labels: its spec, times and scope, the agent's mark, and its user when not root."""
        labels = session_labels(session_id, spec, now, expires, self.own_labels)
        labels[LABEL_AGENT] = "1"
        if user:
            labels[LABEL_USER] = user
        return labels

    async def _remove_workspace(self, engine: DockerEngine, spec: SessionSpec) -> None:
        """Remove the spec's persistent workspace volume on ``engine`` (its owner's: see
        :meth:`_workspace_volume`); one a session still uses is a conflict."""
        key = str(spec.workspace_key)
        try:
            await engine.remove_volume(await self._workspace_volume(engine, spec))
        except EngineRefusedError as e:
            if e.status == 409:
                raise SandboxConflictError(
                    f"workspace {key!r} is in use by another session: destroy that one first"
                ) from None
            raise


async def user_checked(session: S) -> S:
    """A new session once its user is found in its image; a user the image does not know fails the create
    (the session is destroyed)."""
    try:
        await session.user_ids()
    except BaseException:
        with contextlib.suppress(SandboxError):
            await session.destroy()
        raise
    return session
