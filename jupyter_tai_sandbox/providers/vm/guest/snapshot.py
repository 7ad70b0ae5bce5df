"""Golden snapshots: a guest booted once per shape (guest, accel, memory, vCPUs, ports) and saved, which
every create of that shape restores instead of booting.

A golden is made by booting the guest, waiting for its agent, then QMP ``migrate`` to a file (QEMU's
migration stream: devices and the guest's memory; an idle guest's few dirtied pages converge at once). A create starts QEMU with the same devices and
``-incoming exec:cat FILE``: the guest resumes where the golden stopped, its agent serving its ports. The
restored guest is made its own at its first handshake: the host's seed goes into its RNG and the host's clock
becomes its clock (PROTOCOL.md, "Over a VM's port").

Goldens live beside their guest in the cache (``golden3-*.ram``/``.state``), made once under a lock file; a golden that
cannot be made (QEMU refuses to migrate) leaves the creates booting cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .build import Guest
from .qemu import BOOT_ATTEMPT, BOOT_TIMEOUT, QEMU, VmError, open_port, port_socket, qemu_argv

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


def memory_args(ram: Path, memory_mb: int, *, shared: bool) -> list[str]:
    """Guest memory backed by the file ``ram``: shared (the golden writes its memory there) or private."""
    return [
        "-object",
        f"memory-backend-file,id=mem,size={memory_mb}M,mem-path={ram},share={'on' if shared else 'off'}",
        "-machine",
        "memory-backend=mem",
    ]


def restore_args(golden: Path, memory_mb: int, qmp: Path) -> list[str]:
    """QEMU's options that restore ``golden`` (the rest of its command line as for a boot); :func:`restore`
    then loads its state over the control socket ``qmp``."""
    return [
        *memory_args(golden.with_suffix(".ram"), memory_mb, shared=False),
        *qmp_args(qmp),
        "-incoming",
        "defer",
    ]


def qmp_args(qmp: Path) -> list[str]:
    return ["-qmp", f"unix:{qmp},server=on,wait=off"]


async def restore(golden: Path, qmp: Path) -> None:
    """Load ``golden``'s device state into a QEMU started with :func:`restore_args`; the guest then runs."""
    control = await Qmp.connect(qmp)
    try:
        await control.command(
            "migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}]
        )
        await control.command("migrate-incoming", uri=f"exec:cat {golden.with_suffix('.state')}")
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
) -> Path:
    """The golden of this shape, made now when there is none (one maker at a time, across processes)."""
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
) -> None:
    work = Path(tempfile.mkdtemp(prefix="tai-golden-"))
    ram, state = path.with_suffix(".ram"), path.with_suffix(".state")
    tmp_ram, tmp_state = (p.with_name(f".{p.name}.{os.getpid()}") for p in (ram, state))
    argv = qemu_argv(
        guest, work, memory_mb=memory_mb, accel=accel, cpu=cpu, cpus=cpus, ports=ports, root=root, nic=nic
    )
    argv += [*memory_args(tmp_ram, memory_mb, shared=True), *qmp_args(work / "qmp.sock")]
    if shutil.which(argv[0]) is None:
        raise VmError(f"{argv[0]} is missing: install Debian's qemu-system-x86 (.ci/vm-up)")
    argv = _never_outliving_its_maker(argv)
    log = os.open(work / "qemu.log", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
        )
    finally:
        os.close(log)
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
            await qmp.command("migrate", uri=f"exec:cat > {tmp_state}")
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
        for tmp in (tmp_ram, tmp_state):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        shutil.rmtree(work, ignore_errors=True)
