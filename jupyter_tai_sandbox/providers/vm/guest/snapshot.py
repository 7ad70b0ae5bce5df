"""Golden snapshots: a guest booted once per shape (guest, accel, memory, vCPUs, ports) and saved, which
every create of that shape restores instead of booting.

A golden is made by booting the guest, waiting for its agent, then QMP ``migrate`` to a file (QEMU's
migration stream: devices and the guest's memory; an idle guest's few dirtied pages converge at once). A
create starts QEMU with the same devices, the golden's memory as a sealed memfd (:func:`sealed_memory`) and
``-incoming defer``, then hands it the saved state's descriptor to load (``migrate-incoming fd:``): the guest
resumes where the golden stopped, its agent serving its ports. The restored guest is made its own at its
first handshake: the host's seed goes into its RNG and the host's clock becomes its clock (PROTOCOL.md,
"Over a VM's port").

Goldens live beside their guest in the cache (``golden3-*.ram``/``.state``), made once under a lock file; a
golden that cannot be made (QEMU refuses to migrate) leaves the creates booting cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .build import Guest
from .qemu import (
    BOOT_ATTEMPT,
    BOOT_TIMEOUT,
    QEMU,
    QEMU_UIDS,
    VmError,
    confinable,
    confined,
    free_uid,
    open_port,
    port_socket,
    qemu_argv,
    uids_mapped,
)

#: how long making a golden may take (a cold boot, the save)
GOLDEN_TIMEOUT = 120.0
#: how often a wait for the golden's lock or the save's end looks again
POLL_SECONDS = 0.05
#: how long a golden's guest is left after its host has gone, before it is saved
SETTLE_SECONDS = 0.3
#: the CPU time a golden's QEMU may use (a boot and a save take a few seconds of it; an idle guest a tenth of
#: a CPU): one whose maker was abandoned ends within the hour
MAKER_CPU_SECONDS = 300
#: the goldens' format: a golden saved by an older version of how they are made is not restored
GOLDEN_VERSION = 3


@functools.cache
def _qemu_tag(qemu: str = QEMU) -> str:
    """A short hash of QEMU's version: a golden is restored only by the QEMU that saved it."""
    try:
        said = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        said = ""
    return hashlib.sha256(said.encode()).hexdigest()[:8]


def golden_path(
    guest: Guest,
    *,
    accel: str,
    memory_mb: int,
    cpus: int,
    ports: int,
    root: str | None = None,
    nic: bool = False,
    cpu: str = "max",
) -> Path:
    """The golden's name without suffix (its files: ``.ram``, ``.state``; ``.lock`` while it is made); one per
    CPU model, root disk (a restore must find the disk the golden was saved with), and with a network card or
    without (a restore must find the devices the golden was saved with)."""
    model = "" if cpu == "max" else f"-x{hashlib.sha256(cpu.encode()).hexdigest()[:8]}"
    disk = f"-r{hashlib.sha256(root.encode()).hexdigest()[:12]}" if root else ""
    card = "-n" if nic else ""
    return (
        guest.path
        / f"golden{GOLDEN_VERSION}-{_qemu_tag()}-{accel}{model}-m{memory_mb}-c{cpus}-p{ports}{disk}{card}"
    )


def memory_args(ram: Path | None, memory_mb: int, *, shared: bool = False) -> list[str]:
    """Guest memory backed by the file ``ram``: shared (the golden writes its memory there) or private; with
    no ``ram``, anonymous memory of the same name (a fork's, which loads all of it)."""
    backend = (
        f"memory-backend-file,id=mem,size={memory_mb}M,mem-path={ram},share={'on' if shared else 'off'}"
        if ram is not None
        else f"memory-backend-ram,id=mem,size={memory_mb}M"
    )
    return ["-object", backend, "-machine", "memory-backend=mem"]


def restore_args(memory: int, memory_mb: int, qmp: Path) -> list[str]:
    """QEMU's options that restore a golden whose sealed memory (:func:`sealed_memory`) is the descriptor
    ``memory``, which QEMU inherits (the rest of its command line as for a boot); :func:`restore` then loads
    its state over the control socket ``qmp``."""
    return [
        *memory_args(Path(f"/proc/self/fd/{memory}"), memory_mb, shared=False),
        *qmp_args(qmp),
        "-incoming",
        "defer",
    ]


#: how long a golden's sealed memory stays in the server with no create using it
SEALED_IDLE_SECONDS = 600.0
#: the seals that make a golden's memory unwritable and of a fixed size
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_sealed: dict[Path, tuple[int, tuple[int, int], float]] = {}  # .ram -> (memfd, (inode, ctime), last use)
_sealed_lock = threading.Lock()


def sealed_memory(ram: Path) -> int:
    """A descriptor of a memfd with the golden memory file ``ram``'s contents, sealed against every write and
    resize: the caller's own (a dup, to close once QEMU has it). QEMU 7.2 opens a private mapping's file
    read-write, so the golden's file would be writable by every QEMU restored from it, and a write to it would
    reach every running clone's untouched pages; a sealed memfd is mapped privately (copy on write, its pages
    shared by the clones) and written by none. One per golden per server (made once, about 0.1 s for an idle
    guest's pages; dropped after :data:`SEALED_IDLE_SECONDS` unused: the QEMUs keep theirs). Blocking."""
    with _sealed_lock:
        now = time.monotonic()
        _drop_idle(now)
        found = os.stat(ram)
        key = (found.st_ino, found.st_ctime_ns)
        held = _sealed.pop(ram, None)
        if held is not None and held[1] != key:  # the golden was made again
            os.close(held[0])
            held = None
        fd = held[0] if held is not None else _sealed_copy(ram, found.st_size)
        _sealed[ram] = (fd, key, now)
        return os.dup(fd)


def drop_idle_memory() -> None:
    """Close the sealed memories no create has used for :data:`SEALED_IDLE_SECONDS` (the QEMUs keep theirs)."""
    with _sealed_lock:
        _drop_idle(time.monotonic())


def _drop_idle(now: float) -> None:
    for path, (fd, _, used) in list(_sealed.items()):
        if now - used > SEALED_IDLE_SECONDS:
            os.close(fd)
            del _sealed[path]


def _sealed_copy(ram: Path, size: int) -> int:
    memfd = os.memfd_create(f"tai-{ram.name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(memfd, size)
        source = os.open(ram, os.O_RDONLY | os.O_CLOEXEC)
        try:
            zeros = bytes(1 << 20)
            offset = 0
            while offset < size:
                try:
                    offset = os.lseek(source, offset, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:  # nothing but holes after it
                        break
                    raise
                end = os.lseek(source, offset, os.SEEK_HOLE)
                while offset < end:
                    chunk = os.pread(source, min(len(zeros), end - offset), offset)
                    if not chunk:
                        break
                    if chunk != zeros[: len(chunk)]:  # zero pages stay holes: no memory
                        os.pwrite(memfd, chunk, offset)
                    offset += len(chunk)
                offset = max(offset, end)
        finally:
            os.close(source)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(memfd)
        raise
    return memfd


def qmp_args(qmp: Path) -> list[str]:
    return ["-qmp", f"unix:{qmp},server=on,wait=off"]


async def restore(golden: Path, qmp: Path) -> None:
    """Load ``golden``'s device state into a QEMU started with :func:`restore_args`; the guest then runs."""
    control = await Qmp.connect(qmp)
    try:
        await control.command(
            "migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}]
        )
        await control.migrate_incoming(golden.with_suffix(".state"))
    finally:
        control.close()


class Qmp:
    """A QMP connection (QEMU's JSON control socket): one command at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    async def connect(cls, socket: Path, timeout: float = 10.0) -> Qmp:
        give_up = time.monotonic() + timeout
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(socket))
                break
            except OSError:
                if time.monotonic() > give_up:
                    raise VmError(f"QEMU's control socket {socket} does not answer") from None
                await asyncio.sleep(POLL_SECONDS)
        qmp = cls(reader, writer)
        await qmp._message()  # the greeting
        await qmp.command("qmp_capabilities")
        return qmp

    async def _message(self) -> dict[str, Any]:
        line = await self._reader.readline()
        if not line:
            raise VmError("QEMU closed its control socket")
        return json.loads(line)

    async def command(self, execute: str, /, **arguments: Any) -> Any:
        message: dict[str, Any] = {"execute": execute}
        if arguments:
            message["arguments"] = arguments
        self._writer.write(json.dumps(message).encode() + b"\n")
        await self._writer.drain()
        while True:
            answer = await self._message()
            if "return" in answer:
                return answer["return"]
            if "error" in answer:
                raise VmError(f"QMP {execute}: {answer['error'].get('desc')}")
            # an event: skipped

    async def pass_fd(self, name: str, fd: int) -> None:
        """Hand QEMU the file descriptor ``fd`` as ``name`` (QMP ``getfd``, the descriptor over the socket):
        a confined QEMU reaches no path of the host's, so its migrations go to and from descriptors."""
        sock = self._writer.get_extra_info("socket")
        message = json.dumps({"execute": "getfd", "arguments": {"fdname": name}}).encode() + b"\n"
        # the stream has nothing in flight (one command at a time): the message goes on a copy of the socket,
        # the only way to send a descriptor along with it
        with socket.socket(fileno=os.dup(sock.fileno())) as raw:
            raw.setblocking(True)
            try:
                socket.send_fds(raw, [message], [fd])
            finally:
                raw.setblocking(False)
        while True:
            answer = await self._message()
            if "return" in answer:
                return
            if "error" in answer:
                raise VmError(f"QMP getfd: {answer['error'].get('desc')}")

    async def migrate_out(self, state: Path, mode: int = 0o600) -> None:
        """Start the migration of the guest into the file ``state`` (made with ``mode``; QMP ``migrate`` to a
        descriptor); ``query-migrate`` says when it is done."""
        fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            await self.pass_fd("state", fd)
        finally:
            os.close(fd)
        await self.command("migrate", uri="fd:state")

    async def migrate_incoming(self, state: Path) -> None:
        """Start loading the guest from the file ``state`` (QMP ``migrate-incoming`` from a descriptor, into a
        QEMU started with ``-incoming defer``)."""
        fd = os.open(state, os.O_RDONLY | os.O_CLOEXEC)
        try:
            await self.pass_fd("state", fd)
        finally:
            os.close(fd)
        await self.command("migrate-incoming", uri="fd:state")

    def close(self) -> None:
        self._writer.close()


async def ensure_golden(
    guest: Guest,
    *,
    accel: str,
    memory_mb: int,
    cpus: int,
    ports: int,
    root: str | None = None,
    nic: bool = False,
    cpu: str = "max",
    qemu_uids: tuple[int, int] | None = QEMU_UIDS,
) -> Path:
    """The golden of this shape, made now when there is none (one maker at a time, across processes); its
    QEMU confined to a uid of ``qemu_uids`` (:func:`.qemu.confined`) when the server is root, unless None."""
    path = await asyncio.to_thread(
        golden_path,
        guest,
        accel=accel,
        memory_mb=memory_mb,
        cpus=cpus,
        ports=ports,
        root=root,
        nic=nic,
        cpu=cpu,
    )
    if path.with_suffix(".state").exists():
        return path
    lock = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        give_up = time.monotonic() + GOLDEN_TIMEOUT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > give_up:
                    raise VmError(
                        f"another process has been making {path.name} for {GOLDEN_TIMEOUT:.0f} s"
                    ) from None
                await asyncio.sleep(POLL_SECONDS * 4)
        if not path.with_suffix(".state").exists():
            await asyncio.wait_for(
                _make(
                    guest,
                    path,
                    accel=accel,
                    memory_mb=memory_mb,
                    cpus=cpus,
                    ports=ports,
                    root=root,
                    nic=nic,
                    cpu=cpu,
                    qemu_uids=qemu_uids,
                ),
                GOLDEN_TIMEOUT,
            )
        return path
    finally:
        os.close(lock)


def _never_outliving_its_maker(argv: list[str]) -> list[str]:
    """``argv`` (a golden's QEMU, unlike a session's, is only its maker's) killed when the thread that starts
    it ends (a server that exits mid-create: ``setpriv --pdeathsig``), and once it has used
    :data:`MAKER_CPU_SECONDS` of CPU (a maker abandoned in a process that lives on: its event loop closed
    with the create pending, so its clean-up never ran). Both exec, so the process is QEMU itself."""
    bounded = ["prlimit", f"--cpu={MAKER_CPU_SECONDS}", "--", *argv] if shutil.which("prlimit") else argv
    return ["setpriv", "--pdeathsig", "KILL", "--", *bounded] if shutil.which("setpriv") else bounded


async def _make(
    guest: Guest,
    path: Path,
    *,
    accel: str,
    memory_mb: int,
    cpus: int,
    ports: int,
    root: str | None,
    nic: bool,
    cpu: str,
    qemu_uids: tuple[int, int] | None,
) -> None:
    if qemu_uids is not None and confinable() and not uids_mapped(*qemu_uids):
        raise VmError(f"the uids {qemu_uids[0]}-{qemu_uids[1]} are not all this user namespace's")
    work = Path(tempfile.mkdtemp(prefix="tai-golden-"))
    ram, state = path.with_suffix(".ram"), path.with_suffix(".state")
    tmp_ram, tmp_state = (p.with_name(f".{p.name}.{os.getpid()}") for p in (ram, state))
    argv = qemu_argv(
        guest, work, memory_mb=memory_mb, accel=accel, cpu=cpu, cpus=cpus, ports=ports, root=root, nic=nic
    )
    argv += [*memory_args(tmp_ram, memory_mb, shared=True), *qmp_args(work / "qmp.sock")]
    if shutil.which(argv[0]) is None:
        raise VmError(f"{argv[0]} is missing: install Debian's qemu-system-x86 (.ci/vm-up)")
    terminal: int | None = None  # the maker's end of QEMU's controlling terminal
    stdin: int = asyncio.subprocess.DEVNULL
    if qemu_uids is not None and confinable():
        argv = confined(argv, uid=free_uid(*qemu_uids), root=work)
        if shutil.which("setsid"):
            # -runas drops the parent-death signal with root: QEMU's controlling terminal is the maker's
            # instead, and the kernel hangs it up (SIGHUP, on which QEMU quits) when the maker's end closes
            terminal, stdin = os.openpty()
    argv = _never_outliving_its_maker(argv)
    if terminal is not None:
        argv = ["setsid", "--ctty", "--", *argv]
    log = os.open(work / "qemu.log", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        process = await asyncio.create_subprocess_exec(*argv, stdin=stdin, stdout=log, stderr=log)
    except BaseException:
        if terminal is not None:
            os.close(terminal)
        raise
    finally:
        os.close(log)
        if terminal is not None:
            os.close(stdin)
    try:
        client = await open_port(
            port_socket(work, 0),
            timeout=BOOT_TIMEOUT,
            attempt=BOOT_ATTEMPT,
            running=lambda: process.returncode is None,
        )
        try:
            # a round trip: what the agent had of the boot's tries (a HELLO sent while it still started) is
            # behind it, so the snapshot holds an agent that waits for a host and nothing half-done
            await asyncio.wait_for(client.ping(), BOOT_TIMEOUT)
        finally:
            await client.close()
        await asyncio.sleep(SETTLE_SECONDS)  # and it has seen this host leave (it looks every 20 ms)
        qmp = await Qmp.connect(work / "qmp.sock")
        try:
            await qmp.command(
                "migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}]
            )
            # saved running (QEMU stops the source itself at the end): a restore then runs at once, where one
            # saved stopped would wait for a `cont`
            await qmp.migrate_out(tmp_state, 0o644)
            while True:
                status = (await qmp.command("query-migrate")).get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled"):
                    raise VmError(f"saving the golden snapshot {status}")
                await asyncio.sleep(POLL_SECONDS)
        finally:
            qmp.close()
        process.kill()  # the memory file holds what the guest wrote: nothing else must write it now
        await process.wait()
        tmp_ram.replace(ram)
        tmp_state.replace(state)  # last: a golden is there once its state is
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        if terminal is not None:
            os.close(terminal)
        for tmp in (tmp_ram, tmp_state):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        shutil.rmtree(work, ignore_errors=True)
