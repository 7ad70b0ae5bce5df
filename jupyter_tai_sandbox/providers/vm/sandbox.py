"""sandbox-vm: each session is one QEMU microVM with the session agent as its PID 1.

The guest (``jupyter_tai_sandbox.providers.vm.guest``: Debian's cloud kernel, an initramfs of the agent and busybox, built
offline) boots under KVM, or under TCG (emulation) only when the operator asks for it: ``accel = "tcg"``
runs a separate guest kernel, not a hardened boundary, and the provider says so. Commands, files and ports
run on the container base's engine-neutral session over the agent's virtio-serial ports
(``machines``); the machines live in folders on this host, so sessions outlive the server and any
server of the deployment finds them. A session of a listed docker image runs its commands chrooted into
that image's files (``vm.rootdisk``: a read-only disk per image id, a tmpfs overlay per session). A session
on a network sits on its owner's bridge of the Docker engine, as a docker session does (``networks``); one with
an egress policy sits on its owner's filtered bridge behind the owner's egress gateway, the very gateway a docker
provider of the deployment makes and finds (``docker/gateway.py``), its seat taking the address the gateway
picked for it.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import platform
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Bool, Enum, Float, Integer, List, TraitError, Unicode, default, validate

from ...contract import (
    ExecRequest,
    Sandbox,
    SandboxError,
    SandboxNotFoundError,
    SandboxSession,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SandboxUnsupportedError,
    SessionInfo,
    SessionLimits,
    SessionSpec,
    session_gone,
)
from ...images import DEFAULT_IMAGE, PYTHON_IMAGE
from ...policy import within_limits
from .._common import ProviderMeta, new_session_id
from .._docker_agent import AgentVolumes
from .._docker_sandbox import spec_from_labels
from .._provider_settings import BridgeSettings, DeploymentSettings, LimitSettings, rejected
from .._workspaces import unscoped_serves
from ..container import CommandRegistry
from ..container.session import ContainerSession, ContainerSite
from ..docker.gateway import CA_ENV, EgressGateways, Gateway, GatewaySession, GatewaySettings
from ..docker_engine import DockerEngine, MissingImageError
from ..docker_engine.names import LABEL_CREATED, LABEL_EXPIRES, LABEL_SESSION, is_session_id, session_labels
from .control import copy_argv, qmp, run_loaded, save
from .guest.build import Guest, GuestBuildError, build_guest
from .guest.probe import TCG_NOTE, cached_probe, probe
from .guest.qemu import BOOT_TIMEOUT, QEMU, QEMU_UIDS, TCG_CPU, VmError, qemu_argv
from .guest.rootdisk import ROOT_DIR, ensure_root_disk, remove_unused, setup_script
from .guest.snapshot import drop_idle_memory, ensure_golden, qmp_args, restore, restore_args, sealed_memory
from .machines import PORTS, Machines
from .networks import LABEL_SEAT, TAP, Seat, VmSeats, networks_unavailable, seat_name
from .pool import POOL_KEY, Pooled, VmPool

#: the image name of the package's own guest (busybox, nothing else): a session of no image runs it
VM_IMAGE = "jupyter-tai-sandbox/vm-guest"
WORKSPACE = "/workspace"
#: how long a restored guest's agent may take to answer before the golden is taken for broken
RESTORE_SECONDS = 20.0
#: how long the flush of a persistent workspace before its VM is killed may take
SYNC_SECONDS = 5.0
#: how long a new guest's setup (its workspace, root and network) may take, its agent's answers included
SETUP_SECONDS = 60.0


class VmSandbox(
    BridgeSettings, DeploymentSettings, LimitSettings, GatewaySettings, Sandbox, metaclass=ProviderMeta
):
    """sandbox-vm: one QEMU microVM per session (see the module's docstring and the docs' operators/providers/vm.md)."""

    kind = "vm"
    max_isolation = "vm"
    supports_limits = True
    pausable = True
    forkable = True
    min_cpu = 1.0
    min_memory_mb = 128
    limits_floor = "the vm provider"

    accel = Enum(
        ["kvm", "tcg"],
        "kvm",
        help=f"""How guests run. 'kvm' (the default): hardware virtualisation, a real boundary; sessions are
        refused (503) on a host where a KVM boot of the guest does not work (`python -m
        jupyter_tai_sandbox.providers.vm.guest probe` says why), never run emulated instead. 'tcg': QEMU's emulation, for
        hosts without KVM, by the operator's choice only: {TCG_NOTE}, and several times slower.""",
    ).tag(config=True)

    tcg_cpu = Unicode(
        TCG_CPU,
        help="""The CPU model a guest sees under TCG (QEMU's -cpu; under KVM it is always the host's). The
        default, x86-64-v2 without AVX (qemu64 with SSSE3, SSE4.1, SSE4.2 and POPCNT), runs what Debian and
        PyPI's wheels build for, and TCG runs it faster than it emulates AVX: with 'max' (every feature TCG
        has, AVX2 among them) a one-shot took half as long again here and output streamed at 60% of the
        speed, since Go's and glibc's copies take the AVX paths. Set 'max' for software that needs AVX.""",
    ).tag(config=True)

    state_dir = Unicode(
        help="""Folder of the sessions' machines and persistent workspaces (one folder per deployment).
        Default: Jupyter's data dir + /tai-sandbox/vm. Keep it short: the agent's sockets live in it.""",
    ).tag(config=True)

    default_cpu = Float(1.0, help="vCPUs a session gets when its spec names none (whole vCPUs).").tag(
        config=True
    )
    max_cpu = Float(2.0, help="Most vCPUs a spec may ask for; more is rejected.").tag(config=True)
    default_memory_mb = Integer(
        256, help="Guest memory (MiB) when a spec names none: a hard cap (the guest has no more)."
    ).tag(config=True)
    max_memory_mb = Integer(2048, help="Most guest memory (MiB) a spec may ask for; more is rejected.").tag(
        config=True
    )

    disk_limit_mb = Integer(
        1024,
        help="""Size (MiB) of a session's workspace: the ephemeral one is a tmpfs in the guest (its files are
        guest memory), a persistent one an ext4 disk image of this size on the host (sparse).""",
    ).tag(config=True)

    golden_snapshots = Bool(
        True,
        help="""Restore ephemeral sessions from a golden snapshot (a guest booted once per memory size and vCPU
        count, saved beside the guest in its cache) instead of booting each one: about ten times faster. A
        restored guest takes the host's clock and a fresh RNG seed at once. Persistent sessions always boot.""",
    ).tag(config=True)

    images = List(
        Unicode(),
        help="""Docker images a session may name (exactly as listed): each becomes the session's root, its
        files on a read-only disk made once per image id from the engine at engine_url (the docs' vm
        provider page: a minute or so for a large image, the first time), under a writable tmpfs, the workspace
        bound in; commands get the image's env. A session that names no image runs the package's own guest
        (busybox).""",
    ).tag(config=True)

    engine_url = Unicode(
        "unix:///var/run/docker.sock",
        help="""The Docker engine on this host whose bridges sessions on a network sit on (each owner's egress
        and internal bridge, as a docker session's: network_pool, egress_firewall...), and that the images'
        files are read from when a root disk is made. Sessions on a network need the server to run as root
        here (QEMU joins a container's network namespace); otherwise the provider offers network 'none'
        only.""",
    ).tag(config=True)

    root_disk_idle_seconds = Float(
        7 * 24 * 3600.0,
        help="""The reap removes a docker image's root disk (and its golden snapshots) that no create has used for
        this long and no QEMU on the host has open; the next session of the image makes it again. 0: never.""",
    ).tag(config=True)

    user = Unicode(
        "1000:1000",
        help="""Who commands and file operations run as in the guest, 'uid' or 'uid:gid' (the guest has no user
        names): the workspace belongs to them. The agent (PID 1) stays root and out of their reach: it cannot
        be signalled, traced or read, and its channel's devices are root's. '' runs them as the guest's root,
        which can reach the agent and forge its answers: for trusted code only. A session keeps the user it
        was made with.""",
    ).tag(config=True)

    pool_size = Integer(
        0,
        help="""Warm pool: how many guests of the default shape on network 'none' (default_memory_mb,
        default_cpu, the package's own guest, ephemeral, no egress policy; any env and ttl) wait, restored
        from their golden, workspace mounted and warmed, for the creates that take them: such a create answers
        its first command in tens of milliseconds instead of a restore's few hundred (under TCG). The pool
        refills in the background after each claim. Each waiting guest costs what an idle session does: a
        QEMU of about 70 MiB (PSS; 90 MiB RSS) with the default 256 MiB guest under TCG, and about 4% of a
        CPU (the docs' vm provider page); pool_size of them at most. 0 (the default) turns the pool off.""",
    ).tag(config=True)

    pool_idle_seconds = Float(
        600.0,
        help="""After this long without a create of the pooled shape the pool stops its guests and stays
        empty until the next such create (which is made as without a pool, and fills it again); a guest
        that waited this long unclaimed is replaced. close() stops the pool's guests; any server's reap stops
        the guests of a pool whose server is gone.""",
    ).tag(config=True)

    boot_timeout_seconds = Float(
        BOOT_TIMEOUT, help="Longest a create waits for a new guest's agent to answer."
    ).tag(config=True)

    qemu_uids = Unicode(
        f"{QEMU_UIDS[0]}-{QEMU_UIDS[1]}",
        help="""The uids ('first-last') a session's QEMU runs as when the server runs as root: each QEMU (a
        golden snapshot's too) a uid of its own, no process's at its start, with no capabilities, no
        groups, chrooted into its session's folder, which it cannot read, and under its seccomp filter. The
        default lies above what accounts, Docker's and LXD's user namespaces and systemd's containers are
        given; pick another range if this host hands those uids out. '': QEMU runs as root (with its seccomp
        filter alone). A server that does not run as root runs QEMU as its own user.""",
    ).tag(config=True)

    @validate("qemu_uids")
    def _valid_qemu_uids(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if value:
            found = re.fullmatch(r"(\d{1,10})-(\d{1,10})", value)
            if not found or not 0 < int(found[1]) <= int(found[2]) < 2**32 - 1:
                raise TraitError(
                    f"VmSandbox.qemu_uids must be 'first-last' (uids, 0 < first <= last < 4294967295) or '', "
                    f"not {value!r}"
                )
        return value

    @property
    def _qemu_uids(self) -> tuple[int, int] | None:
        if not self.qemu_uids:
            return None
        first, _, last = self.qemu_uids.partition("-")
        return int(first), int(last)

    @validate("user")
    def _valid_user(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if value and not re.fullmatch(r"\d{1,9}(:\d{1,9})?", value):
            raise TraitError(f"VmSandbox.user must be 'uid' or 'uid:gid' (numbers) or '', not {value!r}")
        return value

    @property
    def networks(self) -> frozenset[str]:  # type: ignore[override]  # depends on the bridges; Sandbox has a plain attribute
        """``none`` always; ``egress`` and ``internal`` where the server can seat sessions on the engine's
        bridges (``networks``)."""
        return frozenset({"none"}) if self._why_no_networks else frozenset({"egress", "internal", "none"})

    @property
    def egress_policy(self) -> bool:  # type: ignore[override]  # depends on the bridges; Sandbox has a plain attribute
        """Enforced (through the owner's egress gateway) where sessions can be on a network."""
        return not self._why_no_networks

    @property
    def egress_refusal(self) -> str:  # type: ignore[override]  # as egress_policy
        return (
            f"the vm provider cannot enforce an egress allow-list here: {self._why_no_networks} "
            "(its sessions have network 'none' only); use docker"
            if self._why_no_networks
            else ""
        )

    @property
    def cpu_model(self) -> str:
        """QEMU's -cpu for new guests: the host's under KVM, :attr:`tcg_cpu` under TCG."""
        return "max" if self.accel == "kvm" else self.tcg_cpu

    @property
    def isolation_note(self) -> str | None:  # type: ignore[override]  # depends on the accelerator; Sandbox has a plain attribute
        return f"emulated: {TCG_NOTE}" if self.accel == "tcg" else None

    @default("state_dir")
    def _state_dir_default(self) -> str:
        return os.path.join(jupyter_data_dir(), "tai-sandbox", "vm")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        try:
            self._machines = Machines(self.state_dir, self.scope.tag, qemu_uids=self._qemu_uids)
        except ValueError as e:
            raise TraitError(f"{type(self).__name__}.state_dir: {e}") from None
        self._guest: asyncio.Future[Guest] | None = None
        self._engine = DockerEngine(self.engine_url, scope=self.scope.labels)
        self._why_no_networks = networks_unavailable(self.engine_url)
        self._seats = VmSeats(
            self._engine,
            locks=self._networks,
            labels=self.own_labels,
            pick_subnet=self._pick_subnet,
            firewall=self._host_firewall(self.engine_url),
        )
        #: what gateways run when this provider makes one: the docker provider's default image (found at the
        #: first one made)
        self._gateway_image = DEFAULT_IMAGE
        self._gateway_chosen = False
        self._gateways = EgressGateways(
            self._engine,
            _GatewayStarts(self._engine),
            self._seats.bridges,
            self._networks,
            self.scope,
            self,
            self.log,
            labels=self.own_labels,
            egress_network=lambda owner: self.scope.owner_network(self.egress_network, owner),
            filtered_base=lambda: f"{self.egress_network}-gw",
            image=lambda: self._gateway_image,
            hooks=lambda: self.egress_hooks,
            address_of=lambda session: seat_name(session.id),
        )
        self._accel_checked = False
        self._probing: asyncio.Future[None] | None = None
        self._pool = VmPool(
            size=self.pool_size,
            idle_seconds=self.pool_idle_seconds,
            start=self._start_pooled,
            stop=self._machines.stop,
            running=self._machines.running,
            log=self.log,
        )
        self._site = ContainerSite(
            kind="vm",
            isolation="vm",
            open_agent=self._machines.open_agent,
            inspect=self._inspect,
            teardown=self._teardown,
            log=self.log,
            commands=CommandRegistry(),
            retime=self._retime,
            workspace=WORKSPACE,
            current_end=self._current_end,
            answer_within=2.0,
            set_paused=self._set_paused,
            fork=self._fork,
        )

    # -------------------------------------------------------------- policy

    def session_limits(self) -> SessionLimits:
        """Whole vCPUs within the operator's bounds; the vm image, or one in ``images``, whoever asks."""
        return SessionLimits(
            kind=self.kind,
            settings="VmSandbox",
            max_isolation=self.max_isolation,
            networks=frozenset(self.networks),
            whole_cpus=True,
            default_image=VM_IMAGE,
            images=(VM_IMAGE, *self.images),
            images_setting="VmSandbox.images",
            only_listed_images=True,
            egress_policy=self.egress_policy,
            egress_refusal=self.egress_refusal,
            **self.limit_fields(),
        )

    async def _prepared(self, spec: SessionSpec) -> SessionSpec:
        if not isinstance(spec, SessionSpec):
            raise SandboxSpecRejectedError("create() needs a SessionSpec")
        if spec.network in ("egress", "internal") and self._why_no_networks:
            raise rejected(
                f"network: {spec.network!r} needs the server to run as root beside a Docker engine "
                f"(VmSandbox.engine_url), and here {self._why_no_networks}: ask for network 'none'"
            )
        return within_limits(spec, self.session_limits())

    async def check_available(self) -> None:
        """QEMU is there, and with accel 'kvm' the probe has not found KVM failing here (status stays fast: a
        probe not yet run is started for the next ask, not waited for)."""
        _need_qemu()
        if self.accel == "kvm" and not self._accel_checked:
            found = await cached_probe()
            if found is None:
                if self._probing is None or self._probing.done():
                    self._probing = asyncio.ensure_future(self._kvm_works())
                    self._probing.add_done_callback(lambda t: t.cancelled() or t.exception())
            elif not found["kvm"]["works"]:
                await self._kvm_works()  # raises, saying why

    async def _kvm_works(self) -> None:
        if self._accel_checked:
            return
        found = await probe(await self._the_guest())
        if not found["kvm"]["works"]:
            raise SandboxUnavailableError(
                f"KVM does not work on this host, so the vm provider runs no session: {found['kvm']['reason'][:500]}. "
                f"An operator may choose emulation with VmSandbox.accel = 'tcg' ({TCG_NOTE})"
            )
        self._accel_checked = True

    async def _the_guest(self) -> Guest:
        if self._guest is None or (self._guest.done() and self._guest.exception() is not None):
            self._guest = asyncio.ensure_future(asyncio.to_thread(build_guest))
        try:
            return await asyncio.shield(self._guest)
        except (GuestBuildError, OSError) as e:
            raise SandboxUnavailableError(f"the vm guest cannot be built: {e} (.ci/vm-up)") from None

    # ------------------------------------------------------------ sessions

    async def create(self, spec: SessionSpec) -> SandboxSession:
        spec = await self._prepared(spec)
        _need_qemu()
        if self.accel == "kvm":
            await self._kvm_works()
        if self.pool_size > 0:
            claimed = await self._claim(spec)
            if claimed is not None:
                return claimed
        guest = await self._the_guest()
        session_id = new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = session_labels(session_id, spec, now, expires, self.own_labels)
        folder = self._machines.folder(session_id)
        self._make_folder(folder)
        network = self._seat_network(spec)
        admitted: tuple[Gateway, str, float] | None = None
        env = {**CA_ENV, **spec.env} if spec.egress is not None else dict(spec.env)
        try:
            extra: list[str] = []
            if spec.durability == "persistent":
                image = await self._workspace_image(spec)
                extra = [
                    "-drive",
                    f"file={image},if=none,id=ws,format=raw,discard=unmap",
                    "-device",
                    "virtio-blk-device,drive=ws,serial=tai-ws",
                ]
            shape = self._shape(spec, nic=network is not None)
            record: dict[str, Any] = {
                "labels": labels,
                "env": env,
                "expires_at": expires,
                "shape": shape,
                "user": self.user,
            }
            if spec.image != VM_IMAGE:
                disk = await self._root_disk(str(spec.image))
                shape["root"] = str(disk.path)
                record["image_env"] = disk.env
            self._machines.write(
                session_id, {**record, "starting": True}
            )  # the reaper leaves it be meanwhile
            seat, admitted = await self._take_seat(session_id, spec)
            argv = qemu_argv(guest, folder, extra=extra, console=False, tap=TAP if seat else None, **shape)
            golden = await self._golden(guest, shape) if spec.durability == "ephemeral" else None
            if await self._start_guest(
                session_id, argv, golden, shape["memory_mb"], enter=seat.enter if seat else None
            ):
                record["golden"] = str(golden)  # a fork maps it too
            await self._set_up_guest(
                self._session(session_id, labels, spec.env, expires),
                spec,
                self.user,
                rooted="root" in shape,
                seat=seat,
            )
            session = self._session(session_id, labels, env, expires, self.user, record.get("image_env"))
            if admitted is not None:  # the gateway's CA in the guest, the policy in force there
                await self._gateways.attach(
                    session, admitted[0], admitted[2], root=ROOT_DIR if "root" in shape else "/"
                )
            self._machines.write(session_id, record)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._machines.stop(session_id)
            if network is not None:
                with contextlib.suppress(Exception):
                    await self._unseat(session_id, spec, network, admitted)
            raise
        self.log.debug("sandbox-vm: created %s (%s)", session_id, self.accel)
        return self._site.remember(session)

    def _shape(self, spec: SessionSpec, *, nic: bool) -> dict[str, Any]:
        """The machine a spec's guest runs on (a golden is one per shape)."""
        return {
            "accel": self.accel,
            "cpu": self.cpu_model,
            "memory_mb": int(spec.memory_mb or self.default_memory_mb),
            "cpus": int(spec.cpu or 1),
            "ports": PORTS,
            "nic": nic,
        }

    # ------------------------------------------------------------ the pool

    def _pool_key(self, spec: SessionSpec) -> tuple[str, str, int] | None:
        """What a pooled guest serving ``spec`` must have been made for (its shape, user and workspace size);
        None for a spec the pool never serves (a network, an egress policy, an image, a persistent workspace)."""
        if (
            spec.durability != "ephemeral"
            or spec.network != "none"
            or spec.egress is not None
            or spec.image != VM_IMAGE
        ):
            return None
        shape = self._shape(spec, nic=False)
        return (json.dumps(shape, sort_keys=True), self.user, self.disk_limit_mb)

    async def _claim(self, spec: SessionSpec) -> VmSession | None:
        """A session in a guest taken from the warm pool (the guest's record becomes the session's); None when
        the pool does not serve the spec or has none ready (a create of the pooled shape then wakes it)."""
        pool_spec = await self._prepared(SessionSpec(network="none"))
        key = self._pool_key(spec)
        if key is None or key != self._pool_key(pool_spec):
            return None
        pooled = self._pool.take(key)
        if pooled is None:
            return None
        session_id = pooled.session_id
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = session_labels(session_id, spec, now, expires, self.own_labels)
        record = {
            **{k: v for k, v in pooled.record.items() if k not in (POOL_KEY, "pool_until")},
            "labels": labels,
            "env": dict(spec.env),
            "expires_at": expires,
        }
        try:
            self._machines.write(session_id, record)
        except OSError as e:  # its folder went (another server's reap, a removed state_dir): create as before
            self.log.warning("sandbox-vm: a pooled guest could not be claimed: %s", e)
            await self._machines.stop(session_id)
            return None
        self.log.debug("sandbox-vm: created %s from the warm pool", session_id)
        # its first command's connection is a new handshake: the host's clock and a fresh RNG seed
        return self._site.remember(self._session(session_id, labels, spec.env, expires, record["user"]))

    async def _start_pooled(self, keeper: str) -> Pooled:
        """A guest for the pool: restored (or booted) as the default spec's on network 'none', its workspace
        mounted for :attr:`user`, one command run as that user (TCG has then translated what a command
        runs through), its connection closed; its record names ``keeper``, not a session."""
        spec = await self._prepared(SessionSpec(network="none"))
        key = self._pool_key(spec)
        assert key is not None
        guest = await self._the_guest()
        shape = self._shape(spec, nic=False)
        session_id = new_session_id()
        now = time.time()
        folder = self._machines.folder(session_id)
        self._make_folder(folder)
        record: dict[str, Any] = {
            POOL_KEY: keeper,
            "pool_until": now + self.pool_idle_seconds + 60.0,
            "labels": dict(self.own_labels),
            "shape": shape,
            "user": self.user,
        }
        try:
            self._machines.write(session_id, record)  # a pool's: no server takes it for a session
            argv = qemu_argv(guest, folder, console=False, **shape)
            golden = await self._golden(guest, shape)
            if await self._start_guest(session_id, argv, golden, shape["memory_mb"], enter=None):
                record["golden"] = str(golden)
            labels = session_labels(session_id, spec, now, now + 60.0, self.own_labels)  # for the set-up only
            await self._set_up_guest(
                self._session(session_id, labels, {}, now + 60.0), spec, self.user, rooted=False, seat=None
            )
            warm = await self._session(session_id, labels, {}, now + 60.0, self.user).run(
                ExecRequest(argv=["sh", "-c", ":"], timeout_seconds=SETUP_SECONDS / 2)
            )
            if warm.exit_code != 0:
                raise SandboxError(f"a pooled guest's first command failed: {warm.stderr[-500:]!r}")
            self._machines.write(session_id, record)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._machines.stop(session_id)
            raise
        finally:
            self._site.forget(session_id)  # the session's own connection comes with its first command
        return Pooled(session_id, time.monotonic(), key, record)

    def _make_folder(self, folder: Path) -> None:
        try:
            folder.mkdir(parents=True, mode=0o700)
        except OSError as e:
            raise SandboxUnavailableError(
                f"VmSandbox.state_dir cannot hold a session's folder: {e}"
            ) from None

    def _seat_network(self, spec: SessionSpec) -> str | None:
        """The network a session's seat sits on: its owner's filtered one with an egress policy (behind the
        owner's egress gateway), else its owner's egress or internal bridge; None for network 'none'."""
        if spec.egress is not None:
            return self._gateways.filtered_network(spec.owner)
        return self._network_of(spec)

    async def _take_seat(
        self, session_id: str, spec: SessionSpec
    ) -> tuple[Seat | None, tuple[Gateway, str, float] | None]:
        """The session's seat on its network (None for 'none'); with an egress policy, on its owner's filtered
        network at the address its owner's gateway (made for the owner's first such session) picked, whose
        file there (the policy) is written before the seat is made, and the gateway's ``(gateway, address,
        when the file was written)``."""
        network = self._seat_network(spec)
        if network is None:
            return None, None
        policy = spec.egress
        if policy is None:
            return await self._seats.seat(session_id, network, spec.network), None
        if not self._gateway_chosen:
            # a gateway runs the docker provider's default image: the Python image when the engine has it
            self._gateway_image = (
                PYTHON_IMAGE if await self._engine.has_image(PYTHON_IMAGE) else DEFAULT_IMAGE
            )
            self._gateway_chosen = True
        async with self._networks.hold(network):
            gateway, ip, written, seat = await self._gateways.place(
                spec.owner,
                session_id,
                policy,
                lambda gateway, ip: self._seats.seat(
                    session_id, network, "filtered", address=ip, nameservers=(gateway.ip,), held=True
                ),
            )
            return seat, (gateway, ip, written)

    async def _unseat(
        self,
        session_id: str,
        spec: SessionSpec,
        network: str,
        admitted: tuple[Gateway, str, float] | None = None,
        session: VmSession | None = None,
    ) -> None:
        """Remove the session's seat (and its bridge when no one else sits on it); with an egress policy, its
        file at the gateway first (``admitted``: a create's, by its address; else ``session``'s, found by its
        seat's), and the owner's gateway and filtered network with its last such session."""
        if spec.egress is None:
            await self._seats.leave(session_id, network)
            return
        if admitted is not None:
            await self._gateways.withdraw(admitted[0], admitted[1])
        elif session is not None:
            await self._gateways.detach(session)  # its file names its seat's address: out before it goes
        async with self._networks.hold(network):
            try:
                await self._seats.leave(session_id, network, held=True)
            finally:
                try:
                    await self._gateways.release(spec.owner)
                except SandboxError as e:
                    self.log.warning("sandbox-vm: the egress gateway stays for the reap: %s", e)

    async def _golden(self, guest: Guest, shape: dict[str, Any]) -> Path | None:
        """The golden snapshot of ``shape`` (made now if need be); None when snapshots are off or it cannot be
        made (the session boots)."""
        if not self.golden_snapshots:
            return None
        try:
            return await ensure_golden(guest, **shape, qemu_uids=self._qemu_uids)
        except (TimeoutError, VmError, OSError) as e:
            self.log.warning("sandbox-vm: no golden snapshot for %s, booting: %s", shape, e)
            return None

    async def _start_guest(
        self,
        session_id: str,
        argv: list[str],
        golden: Path | None,
        memory_mb: int,
        *,
        enter: list[str] | None,
    ) -> bool:
        """Start the session's QEMU, restoring ``golden`` when given, and wait for its agent; a golden that does
        not restore (a QEMU that changed under it) is dropped and the guest boots. Whether it was restored."""
        qmp = self._machines.folder(session_id) / "qmp.sock"
        if golden is not None:
            try:
                memory = await asyncio.to_thread(sealed_memory, golden.with_suffix(".ram"))
                try:
                    await self._machines.start(
                        session_id,
                        argv + restore_args(memory, memory_mb, qmp),
                        enter=enter,
                        pass_fds=(memory,),
                    )
                finally:
                    os.close(memory)
                await asyncio.wait_for(restore(golden, qmp), RESTORE_SECONDS)
                await (await self._machines.open_agent(session_id, timeout=RESTORE_SECONDS)).close()
                return True
            except (TimeoutError, SandboxError, VmError, OSError) as e:
                if not self._machines.folder(session_id).is_dir():
                    raise session_gone(session_id) from None  # destroyed meanwhile: not the golden's fault
                self.log.warning(
                    "sandbox-vm: %s did not restore, dropping it and booting: %s", golden.name, e
                )
                await self._machines.stop(session_id, keep_folder=True)
                for suffix in (".state", ".ram"):
                    with contextlib.suppress(FileNotFoundError):
                        golden.with_suffix(suffix).unlink()
        await self._machines.start(session_id, argv + qmp_args(qmp), enter=enter)
        # the boot's wait: its connection ends at a frame boundary, so the session's own opens at once
        await (
            await self._machines.open_agent(session_id, timeout=self.boot_timeout_seconds, booting=True)
        ).close()
        return False

    def _workspace_scope(self, spec: SessionSpec) -> str | None:
        """Whose images hold the spec's persistent workspace: None for the key's unscoped one (no owner, the
        owner its record names: made before keys were per owner, or the home owner when none is recorded),
        else the spec's owner's own."""
        key = str(spec.workspace_key)
        recorded = (self._machines.workspace_record(key) or {}).get("owner")
        recorded = recorded if isinstance(recorded, str) else None
        home = spec.owner is not None and spec.owner == self.home_owner
        has_scoped = (
            home and recorded is None and self._machines.workspace_record(key, spec.owner) is not None
        )
        if unscoped_serves(spec.owner, recorded, home=home, has_scoped=has_scoped):
            return None
        return spec.owner

    async def _workspace_image(self, spec: SessionSpec) -> Any:
        key = str(spec.workspace_key)
        scope = self._workspace_scope(spec)
        found = self._machines.workspace_record(key, scope)
        if found is not None and spec.owner is not None and found.get("owner") not in (None, spec.owner):
            # only two owners whose tags meet get here: never mount another's
            raise SandboxNotFoundError(f"no workspace {key!r} can be made for this owner: name another key")
        return await self._machines.ensure_workspace(
            key, {"key": key, "owner": spec.owner, "labels": self.own_labels}, self.disk_limit_mb, scope
        )

    async def _set_up_guest(
        self, session: VmSession, spec: SessionSpec, user: str, *, rooted: bool, seat: Seat | None
    ) -> None:
        """Mount the workspace, by the guest's root (``session``'s user), for ``user``; with ``rooted``, make the
        session image's root too (vm/rootdisk.py); with a ``seat``, give the guest's card its address."""
        uid, _, gid = user.partition(":")
        uid, gid = uid or "0", gid or uid or "0"
        if spec.durability == "persistent":
            script = (
                f'for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = tai-ws ] && dev=/dev/${{d##*/}}; '
                f"done; mount -t ext4 -o noatime,nosuid,nodev $dev {WORKSPACE} && chown {uid}:{gid} {WORKSPACE}"
            )
        else:
            script = (
                f"mount -t tmpfs -o size={self.disk_limit_mb}m,mode=0755,uid={uid},gid={gid},nosuid,nodev tmpfs "
                f"{WORKSPACE}"
            )
        if rooted:
            script = f"{script}\n{setup_script(WORKSPACE, self.disk_limit_mb)}"
        if seat is not None:
            script = f"{script}\n{seat.guest_script(('', ROOT_DIR) if rooted else ('',))}"
        await _as_guest_root(session, script, "setting up the session's guest")

    def _session(
        self,
        session_id: str,
        labels: dict[str, str],
        env: Mapping[str, str],
        expires: float,
        user: str = "",
        image_env: dict[str, str] | None = None,
    ) -> VmSession:
        """A session object; ``image_env`` (a session image's env) makes it one whose commands are chrooted into
        the image's root."""
        spec = spec_from_labels(labels, [f"{k}={v}" for k, v in env.items()])
        rooted = image_env is not None
        session = VmSession(
            self._site,
            session_id,
            session_id,
            spec,
            float(labels[LABEL_CREATED]),
            expires,
            env={**image_env, "HOME": WORKSPACE, **env} if image_env is not None else env,
            user=user,
            root=ROOT_DIR if rooted else "",
        )
        session.gateways = self._gateways
        return session

    async def _root_disk(self, image: str) -> Any:
        try:
            return await ensure_root_disk(self._engine, image, log=self.log)
        except MissingImageError:
            raise rejected(
                f"image {image!r} is not on the Docker engine at {self.engine_url}: build or "
                "pull it there first"
            ) from None

    def _found(self, session_id: str) -> VmSession | None:
        """The session as its record has it; None when it has no record of this deployment."""
        record = self._machines.read(session_id)
        if record is None:
            return None
        labels = record.get("labels") or {}
        if not self.scope.owns(labels) or labels.get(LABEL_SESSION) != session_id:
            return None
        try:
            expires = float(record.get("expires_at") or labels[LABEL_EXPIRES])
            session = self._session(
                session_id,
                labels,
                dict(record.get("env") or {}),
                expires,
                str(record.get("user") or ""),
                record.get("image_env"),
            )
        except (KeyError, ValueError, SandboxError):
            return None
        self._site.note_state(session_id, _state(record, running=True))
        return session

    async def get(self, session_id: str) -> SandboxSession:
        if not is_session_id(session_id):
            raise session_gone(session_id)
        vouched = self._site.vouched(session_id)
        if vouched is not None:
            return vouched
        session = self._found(session_id)
        if session is None or not self._machines.running(session_id):
            raise session_gone(session_id)
        if (
            session.spec.egress is not None
        ):  # its policy as the gateway has it (a live change is recorded there)
            with contextlib.suppress(SandboxError):
                session.spec = session.spec.replace(egress=await self._gateways.current(session))
        return self._site.remember(session)

    async def list(self) -> list[SessionInfo]:
        sessions = [s for s in map(self._found, self._machines.ids()) if s is not None]
        # the policies in force of sessions with one (a live change is recorded at their gateway)
        with contextlib.suppress(SandboxError):
            await self._gateways.live_policies([s for s in sessions if s.spec.egress is not None])
        return sorted((s._info() for s in sessions), key=lambda i: i.created_at)

    async def reap(self) -> builtins.list[str]:
        now = time.time()
        reaped: list[str] = []
        seats = await self._seat_summaries()
        seated = {
            str((s.get("Labels") or {}).get(LABEL_SEAT)) for s in seats or () if s.get("State") == "running"
        }
        for session_id in self._machines.ids():
            session = self._found(session_id)
            made = self._machines.made_at(session_id)
            being_made = made is not None and now - made < 2 * self.boot_timeout_seconds
            record = self._machines.read(session_id) if session is None else None
            if record is not None and record.get(POOL_KEY) and self.scope.owns(record.get("labels")):
                # a warm pool's guest: ours while our pool holds it or starts it; another's once its keeper is
                # gone or it waited past its end
                if record[POOL_KEY] == self._pool.owner:
                    drop = not being_made and not self._pool.holds(session_id)
                else:
                    drop = VmPool.abandoned(record, now)
                if drop or (not being_made and not self._machines.running(session_id)):
                    await self._machines.stop(session_id)
                continue
            if session is None:
                if not being_made and not self._machines.running(session_id):
                    await self._machines.stop(session_id)  # a create that died before its record
                continue
            if being_made and (self._machines.read(session_id) or {}).get("starting"):
                continue  # a create or fork under way (here or on another server): its QEMU may not run yet
            # a session on a network whose seat is gone (an engine restart stops it) has lost its network (asked
            # again: a create that ended after the listing made its seat since)
            unseated = (
                seats is not None
                and session.spec.network != "none"
                and session_id not in seated
                and not await self._seats.seated(session_id)
            )
            if session.expires_at <= now or not self._machines.running(session_id) or unseated:
                with contextlib.suppress(SandboxNotFoundError):
                    await session.destroy(remove_workspace=False)
                    reaped.append(session_id)
        if reaped:
            self.log.info("sandbox-vm: reaped %s", ", ".join(reaped))
        if seats is not None:
            with contextlib.suppress(SandboxError):
                await self._seats.reap(seats, set(self._machines.ids()), now)
            with contextlib.suppress(SandboxError):  # gateways no session of any provider is behind
                await self._gateways.reap([], now)
        drop_idle_memory()  # the goldens' sealed memories no create has used lately
        if self.root_disk_idle_seconds > 0:
            for disk in await asyncio.to_thread(remove_unused, self.root_disk_idle_seconds):
                self.log.info("sandbox-vm: removed the root disk %s (unused)", disk.name)
        return reaped

    async def _seat_summaries(self) -> builtins.list[dict[str, Any]] | None:
        """The deployment's seats on the engine; None when it has none to have (no networks here) or the engine
        does not answer (then no session is taken for one that lost its seat)."""
        if self._why_no_networks:
            return None
        try:
            return await self._seats.seats()
        except SandboxError as e:
            self.log.debug("sandbox-vm: the reap cannot list the sessions' seats: %s", e)
            return None

    # ------------------------------------------------------------ the site

    async def _inspect(self, session_id: str) -> dict[str, Any]:
        record = self._machines.read(session_id)
        if record is None:
            raise SandboxNotFoundError(f"session {session_id} is gone")
        return _state(record, running=self._machines.running(session_id))

    async def _set_paused(self, session: ContainerSession, paused: bool) -> None:
        """QMP ``stop`` or ``cont`` (QEMU, the guest's memory and its commands stay as they are), recorded so a
        restarted server knows; a resumed guest takes the host's clock at once (a stopped one's fell behind)."""
        record = self._machines.read(session.id)
        if record is None or not self._machines.running(session.id):
            raise session_gone(session.id)
        await qmp(self._machines.folder(session.id), "stop" if paused else "cont")
        record["paused"] = paused
        self._machines.write(session.id, record)
        if not paused:
            with contextlib.suppress(SandboxError):
                await (await self._machines.open_agent(session.id, timeout=RESTORE_SECONDS)).close()

    async def _fork(self, source: ContainerSession) -> ContainerSession:
        """A new session of the source's owner and spec whose guest is a copy of the source's now (memory, every
        process, the ephemeral workspace); made its own at its first handshake (clock, RNG seed)."""
        if source.spec.durability == "persistent":
            raise SandboxUnsupportedError(
                "a persistent workspace has one live session at a time: fork an ephemeral session",
                operation="fork",
            )
        record = self._machines.read(source.id)
        if record is None or "shape" not in record or not self._machines.running(source.id):
            raise session_gone(source.id)
        spec = source.spec
        if spec.egress is not None:  # the policy in force now (another server may have changed it)
            spec = spec.replace(egress=await self._gateways.current(source))
        guest = await self._the_guest()
        session_id = new_session_id()
        now = time.time()
        expires = now + spec.ttl_seconds
        labels = session_labels(session_id, spec, now, expires, self.own_labels)
        folder = self._machines.folder(session_id)
        self._make_folder(folder)
        state = folder / "fork.state"
        network = self._seat_network(spec)
        admitted: tuple[Gateway, str, float] | None = None
        rooted = record.get("image_env") is not None
        try:
            copy = {**record, "labels": labels, "expires_at": expires, "paused": False}
            self._machines.write(session_id, {**copy, "starting": True})
            seat, admitted = await self._take_seat(session_id, spec)
            await save(self._machines.folder(source.id), state)
            await self._machines.start(
                session_id, copy_argv(guest, folder, record), enter=seat.enter if seat else None
            )
            # the copy's card has the source's address: it goes on the network once it has its own
            await run_loaded(self._machines, session_id, state, link=seat is None)
            await (
                await self._machines.open_agent(session_id, timeout=RESTORE_SECONDS)
            ).close()  # clock and seed
            if seat is not None:
                await _as_guest_root(
                    self._session(session_id, labels, {}, expires),
                    seat.guest_script(("", ROOT_DIR) if rooted else ("",)),
                    "setting up the fork's network",
                )
                await qmp(folder, "set_link", name="net0", up=True)
            if admitted is not None:  # its policy in force at the gateway (the CA came with the copy: again)
                await self._gateways.attach(
                    self._session(session_id, labels, {}, expires),
                    admitted[0],
                    admitted[2],
                    root=ROOT_DIR if rooted else "/",
                )
            self._machines.write(session_id, copy)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._machines.stop(session_id)
            if network is not None:
                with contextlib.suppress(Exception):
                    await self._unseat(session_id, spec, network, admitted)
            raise
        finally:
            with contextlib.suppress(OSError):
                state.unlink()
        self.log.debug("sandbox-vm: forked %s from %s", session_id, source.id)
        return self._site.remember(
            self._session(
                session_id,
                labels,
                dict(record.get("env") or {}),
                expires,
                str(record.get("user") or ""),
                record.get("image_env"),
            )
        )

    async def _current_end(self, session_id: str) -> float | None:
        record = self._machines.read(session_id)
        return None if record is None else record.get("expires_at")

    async def _retime(self, session: ContainerSession, expires_at: float) -> None:
        record = self._machines.read(session.id)
        if record is None:
            raise session_gone(session.id)
        record["expires_at"] = expires_at
        self._machines.write(session.id, record)

    async def _teardown(self, session: ContainerSession, remove_workspace: bool) -> None:
        self._site.commands.abandon(session.id)
        if session.spec.durability == "persistent" and self._machines.running(session.id):
            if (self._machines.read(session.id) or {}).get("paused"):
                with contextlib.suppress(SandboxError, VmError, OSError, asyncio.TimeoutError):
                    await qmp(self._machines.folder(session.id), "cont")  # its flush needs it running
            # the guest's page cache goes with QEMU: what the workspace holds is written out first
            with contextlib.suppress(Exception):
                client = await asyncio.wait_for(
                    self._machines.open_agent(session.id, timeout=2.0), SYNC_SECONDS
                )
                try:
                    command = await client.start(
                        ["sync"], env={"PATH": "/bin:/usr/bin:/sbin:/usr/sbin"}, cwd="/"
                    )
                    await asyncio.wait_for(command.collect(), SYNC_SECONDS)
                finally:
                    await client.close()
        if session.spec.egress is not None:  # its file at the gateway names its seat's address: out first
            await self._gateways.detach(session)
        await self._machines.stop(session.id)
        network = self._seat_network(session.spec)
        if network is not None:
            try:
                await self._unseat(session.id, session.spec, network)
            except SandboxError as e:  # the reap removes a seat whose session is gone
                self.log.warning("sandbox-vm: %s's seat stays until the engine answers: %s", session.id, e)
        if remove_workspace and session.spec.durability == "persistent":
            key = str(session.spec.workspace_key)
            self._machines.remove_workspace(key, self._workspace_scope(session.spec))
        self.log.debug("sandbox-vm: destroyed %s", session.id)

    async def close(self) -> None:
        await self._pool.close()
        await self._gateways.close()
        await self._site.close()
        await self._engine.close()


def _need_qemu() -> None:
    if shutil.which(QEMU) is None:
        raise SandboxUnavailableError(f"{QEMU} is missing: install Debian's qemu-system-x86 (.ci/vm-up)")


def _state(record: dict[str, Any], *, running: bool) -> dict[str, Any]:
    """A machine's record as the container base reads an inspect."""
    return {"State": {"Running": running, "Paused": bool(record.get("paused"))}}


class VmSession(GatewaySession):
    """A vm session: the container base's session over the guest's agent (``container_id`` is the session id),
    behind its owner's egress gateway through its seat when it has a policy."""


class _GatewayStarts:
    """What a gateway the vm provider makes needs to start (docker/gateway.py's AgentStarts): the agent volumes
    of the engine, and its architecture."""

    def __init__(self, engine: DockerEngine) -> None:
        self._engine = engine
        self.agent_volumes = AgentVolumes(engine)
        self._arch: str | None = None

    async def engine_arch(self) -> str:
        if self._arch is None:
            info = await self._engine.blocking(lambda: self._engine.api.info())
            self._arch = str(info.get("Architecture") or "") or platform.machine()
        return self._arch


async def _as_guest_root(session: VmSession, script: str, what: str) -> None:
    """Run ``script`` in the guest as ``session``'s user (the guest's root); SandboxError saying ``what`` failed.
    Bounded as a whole (its connection's opening too): a guest that does not answer fails the create."""
    try:
        async with asyncio.timeout(SETUP_SECONDS):
            result = await session.run(
                ExecRequest(argv=["sh", "-c", script], timeout_seconds=SETUP_SECONDS / 2)
            )
    except TimeoutError:
        raise SandboxUnavailableError(
            f"{what}: the guest's agent did not answer within {SETUP_SECONDS:g} s"
        ) from None
    if result.exit_code != 0:
        raise SandboxError(f"{what} failed: {result.stderr.decode(errors='replace')[-1000:]}")
