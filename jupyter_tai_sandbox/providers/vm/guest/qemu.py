"""Boot a guest (guest.py) as a QEMU microVM and speak to its agent over a virtio-serial port.

The port's host side is a unix socket QEMU listens on (``agent.sock`` in the VM's work folder): a connection
to it is a connection to the agent (PROTOCOL.md's framing, as over a container's exec stream). QEMU takes one
client at a time; one that connects while another is connected waits until that one leaves.

The machine is ``microvm`` with its PIT, PIC and RTC: without the PIT, TCG boots of this kernel hung in 4 of
5 tries here. The cloud kernel finds the virtio-mmio devices through microvm's ACPI tables. Under TCG the
guest's TSC is the host's, so the host's TSC rate goes on the kernel command line (``tsc_early_khz``): the
kernel's own calibration against the emulated PIT fails now and then on a busy host, and the boot then hangs
calibrating its delay loop. And ``tsc=reliable``: the kernel's watchdog checks the TSC against jiffies, which
lag on a busy host, and a TSC it once marks unstable leaves the guest (and a golden saved from it) on jiffies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import mmap
import os
import platform
import secrets
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....agent import protocol as p
from ....agent.client import AgentClient
from ....agent.errors import AgentConnectionLost, AgentError
from .build import Guest

QEMU = "qemu-system-x86_64"
#: QEMU's seccomp sandbox for every VM (see qemu_argv)
SECCOMP = "on,obsolete=deny,resourcecontrol=deny"
#: the uids a QEMU runs as when the server is root (:func:`confined`), a fresh one per QEMU: above the
#: ranges accounts, Docker's and LXD's user namespaces and systemd's containers are given by default
QEMU_UIDS = (2_000_000_000, 2_000_999_999)
#: the capabilities a confined QEMU starts with (as root, to open its files and devices): -runas's
#: setgid, setgroups and setuid, and -chroot's chroot; a tap device's attach adds net_admin
START_CAPS = ("setuid", "setgid", "sys_chroot")
#: the CPU model of a TCG guest by default: x86-64-v2 without AVX (TCG emulates SSE faster than AVX)
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"
MACHINE = "microvm,pit=on,pic=on,rtc=on"
BOOT_TIMEOUT = 60.0  # seconds from QEMU's start to the agent's answer (a TCG boot takes about 2.5 here)
BOOT_ATTEMPT = 15.0  # one try at the handshake before the guest has ever answered (it may still be booting)
#: one try once it has: an answer takes milliseconds, but a HELLO sent while the agent is still inside a frame
#: a former client cut short is taken as that frame's bytes, and only the next try is seen as a new host's
RETRY_ATTEMPT = 2.0


class VmError(RuntimeError):
    """QEMU did not start, or its guest's agent did not answer."""


@functools.cache
def host_tsc_khz() -> int | None:
    """The host's TSC rate in kHz (measured against the monotonic clock over 3 x 20 ms), or None where it
    cannot be (not x86_64, a TSC that is not constant, no executable memory for the one instruction)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    if " constant_tsc" not in flags:
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, AttributeError):
        return None
    page.write(bytes.fromhex("0f3148c1e2204809d0c3"))  # rdtsc; shl rdx, 32; or rax, rdx; ret
    code = ctypes.c_char.from_buffer(page)
    rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(code))
    rates = []
    for _ in range(3):
        t0, c0 = time.perf_counter_ns(), rdtsc()
        time.sleep(0.02)
        c1, t1 = rdtsc(), time.perf_counter_ns()
        rates.append((c1 - c0) * 1e6 / (t1 - t0))
    del rdtsc, code
    page.close()
    return round(statistics.median(rates))


def port_socket(workdir: Path, index: int = 0) -> Path:
    """The host side of the guest's agent port ``index`` (0: ``tai``, then ``tai1``, ...)."""
    return workdir / ("agent.sock" if index == 0 else f"agent{index}.sock")


def qemu_argv(
    guest: Guest,
    workdir: Path,
    *,
    memory_mb: int,
    accel: str,
    cpu: str = "max",
    cpus: int = 1,
    qemu: str = QEMU,
    verbose: bool = False,
    ports: int = 1,
    extra: list[str] | None = None,
    console: bool = True,
    root: str | None = None,
    nic: bool = False,
    tap: str | None = None,
) -> list[str]:
    """QEMU's command line. ``cpu``: the CPU model (a guest saved with one restores only with it); ``ports``: how many agent ports the guest gets (each takes one host connection at
    a time); ``extra``: more of QEMU's options (disks, a network); ``root``: a read-only disk image of a
    session image's files (serial ``tai-root``, see vm/rootdisk.py); ``nic``: a network card, on the tap interface
    ``tap`` of QEMU's network namespace, or with no ``tap`` on a hub port that goes nowhere (a golden snapshot's:
    a restore may put another backend under the card); ``console``: the guest's serial console to
    ``console.log`` (a boot's diagnosis), else nowhere: a session's guest runs code of anyone's, which could
    write the console without end, so a session's console goes nowhere."""
    cmdline = guest.cmdline
    if ports > 1:
        cmdline = f"{cmdline} {ports}"
    if verbose:  # the boot's every step on the console (a probe that must say where a boot stopped)
        cmdline = " ".join(word for word in cmdline.split(" ") if word != "quiet")
    if accel == "tcg":
        # TCG's TSC is QEMU's virtual clock: steady, where the jiffies the kernel's watchdog checks it against
        # lag whenever the vCPU waits for the host (a busy machine), and a TSC marked unstable leaves the guest
        # on jiffies for good (a golden saved so passes it on to every restore)
        khz = host_tsc_khz()
        before, dashes, after = cmdline.partition(" -- ")
        cmdline = f"{before}{f' tsc_early_khz={khz}' if khz else ''} tsc=reliable{dashes}{after}"
    return [
        qemu,
        "-M",
        MACHINE,
        "-accel",
        accel,
        "-cpu",
        cpu,
        "-smp",
        str(cpus),
        "-m",
        str(memory_mb),
        "-nodefaults",
        "-no-user-config",
        # a seccomp filter (QEMU's own): no obsolete system calls, no scheduler or resource control. Privilege
        # changes stay (-daemonize's setsid and -runas's setuid need them; a QEMU that ran them has no
        # capabilities left to gain any with) and so does spawning (-daemonize forks after the filter is in;
        # a confined QEMU has nothing to exec: its root is a folder it cannot read)
        "-sandbox",
        SECCOMP,
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(guest.kernel),
        "-initrd",
        str(guest.initrd),
        "-append",
        cmdline,
        "-serial",
        f"file:{workdir / 'console.log'}" if console else "null",
        "-device",
        "virtio-serial-device",
        *[
            arg
            for i in range(ports)
            for arg in (
                "-chardev",
                f"socket,id=tai{i},path={port_socket(workdir, i)},server=on,wait=off",
                "-device",
                f"virtserialport,chardev=tai{i},name={'tai' if i == 0 else f'tai{i}'}",
            )
        ],
        *(
            [
                "-drive",
                f"file={root},if=none,id=root,format=raw,readonly=on",
                "-device",
                "virtio-blk-device,drive=root,serial=tai-root",
            ]
            if root
            else []
        ),
        *(
            [
                "-netdev",
                f"tap,id=net0,ifname={tap},script=no,downscript=no,vnet_hdr=off"
                if tap
                else "hubport,id=net0,hubid=0",
                "-device",
                "virtio-net-device,netdev=net0",
            ]
            if nic
            else []
        ),
        *(extra or []),
    ]


def free_uid(first: int, last: int) -> int:
    """A uid in ``first``..``last`` that no process on the host runs as: picked at random, so two servers
    that pick at once meet once in ``last - first`` tries."""
    used: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{entry.name}/status") as f,
            ):
                for line in f:
                    if line.startswith("Uid:"):
                        used.update(int(uid) for uid in line.split()[1:])
                        break
    while True:
        uid = first + secrets.randbelow(last - first + 1)
        if uid not in used:
            return uid


def confined(argv: list[str], *, uid: int, root: Path) -> list[str]:
    """``argv`` (QEMU's) run unprivileged: QEMU opens its files and devices as root, then, before the guest's
    first instruction, chroots into ``root`` (a folder of root's, mode 0700, that it cannot read) and becomes
    ``uid`` (group ``uid``, no other group), its capabilities gone with root; it starts with a bounding set of
    :data:`START_CAPS` alone (setpriv, where installed), so it never held more. Whatever it reaches
    afterwards it reaches through what it opened: no path of the host's."""
    caps = [*START_CAPS, *(["net_admin"] if any(a.startswith("tap,") for a in argv) else [])]
    wrapper = (
        ["setpriv", f"--bounding-set=-all,{','.join(f'+{cap}' for cap in caps)}", "--inh-caps=-all", "--"]
        if shutil.which("setpriv")
        else []
    )
    return [*wrapper, *argv, "-runas", f"{uid}:{uid}", "-chroot", str(root)]


def uids_mapped(first: int, last: int, uid_map: str = "/proc/self/uid_map") -> bool:
    """Whether this user namespace has the uids ``first``..``last`` (a server in a container may have only
    some: QEMU's -runas to an unmapped uid fails)."""
    try:
        with open(uid_map) as f:
            lines = f.read().splitlines()
    except OSError:
        return True  # no user namespaces here: every uid is the host's
    for line in lines:
        inside, _, count = (int(word) for word in line.split())
        if inside <= first and last < inside + count:
            return True
    return False


def confinable() -> bool:
    """Whether QEMU can be confined here: the server runs as root (else QEMU runs as the server's user)."""
    return os.geteuid() == 0


@dataclass
class BootedVm:
    """A running microVM: its QEMU process and work folder (the port's socket, the console's log)."""

    process: asyncio.subprocess.Process
    workdir: Path
    accel: str
    argv: list[str]
    started: float = field(default_factory=time.monotonic)
    remove_workdir: bool = True
    answered: bool = False  # its agent has answered a handshake

    @property
    def socket(self) -> Path:
        return self.workdir / "agent.sock"

    @property
    def console_log(self) -> Path:
        return self.workdir / "console.log"

    def console_tail(self, lines: int = 30) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            text = ""
        try:
            qemu = (self.workdir / "qemu.log").read_text(errors="replace").strip()
        except OSError:
            qemu = ""
        tail = "\n".join(text.splitlines()[-lines:]) if text.strip() else "(nothing on the guest's console)"
        return f"{tail}\n[qemu] {qemu}" if qemu else tail

    async def connect(self, timeout: float = BOOT_TIMEOUT, *, attempt: float | None = None) -> AgentClient:
        """A connection to the guest's agent, once it answers the handshake: tried again (each try bounded
        by ``attempt`` seconds, by default BOOT_ATTEMPT, then RETRY_ATTEMPT once the agent has answered) until
        ``timeout``. Raises VmError with the console's tail when QEMU ends or the time is up."""
        deadline = time.monotonic() + timeout
        exited = asyncio.ensure_future(self.process.wait())
        opening: asyncio.Future[AgentClient] | None = None
        last: BaseException | None = None
        try:
            while True:
                left = deadline - time.monotonic()
                if exited.done():
                    raise VmError(
                        f"QEMU exited ({self.process.returncode}) before its agent answered:\n"
                        f"{self.console_tail()}"
                    )
                if left <= 0:
                    raise VmError(
                        f"the guest's agent did not answer within {timeout:.0f} s ({last!r}):\n"
                        f"{self.console_tail()}"
                    )
                bound = attempt or (RETRY_ATTEMPT if self.answered else BOOT_ATTEMPT)
                opening = asyncio.ensure_future(self._open(min(left, bound)))
                await asyncio.wait([opening, exited], return_when=asyncio.FIRST_COMPLETED)
                if not opening.done():  # QEMU ended: the next turn says so
                    opening.cancel()
                    await asyncio.wait([opening])
                    continue
                try:
                    client = opening.result()
                    self.answered = True
                    return client
                except (OSError, TimeoutError, AgentError) as e:  # no socket yet, or a try that timed out
                    last = e
                    await asyncio.sleep(
                        0.1
                    )  # a host away for a moment is seen gone: the next try starts clean
        finally:
            exited.cancel()
            if opening is not None and not opening.done():  # connect itself was cancelled
                opening.cancel()

    async def _open(self, within: float) -> AgentClient:
        return await open_port_once(self.socket, within)

    async def close(self) -> None:
        """Kill QEMU (the guest and all it runs go with it) and remove the work folder."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        if self.remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


async def open_port_once(
    socket: Path, within: float, *, on_close: Callable[[], None] | None = None
) -> AgentClient:
    """One try at a connection to the agent over the port whose host side is ``socket``, its handshake bounded
    by ``within`` seconds. ``on_close`` runs once the connection is closed."""
    async with asyncio.timeout(
        within
    ):  # the connect too: QEMU takes a port's next host only once it let the last go
        reader, writer = await asyncio.open_unix_connection(str(socket), limit=2 * p.MAX_FRAME_BODY)
    try:
        async with asyncio.timeout(within):
            info = await port_hello(reader, writer)
    except BaseException:
        writer.close()
        raise
    client = AgentClient(reader, _ClosingWriter(writer, on_close) if on_close else writer)
    client.info = info
    client.window = min(client.window, info.get("ring") or client.window)  # as AgentClient.open_client
    return client


async def open_port(
    socket: Path,
    *,
    timeout: float,
    attempt: float = RETRY_ATTEMPT,
    running: Callable[[], bool] | None = None,
    on_close: Callable[[], None] | None = None,
) -> AgentClient:
    """A connection to the agent over a port of a running guest, tried again (each try bounded by ``attempt``)
    until ``timeout``; VmError once ``running()`` says QEMU is gone or the time is up."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if running is not None and not running():
            raise VmError("QEMU is not running")
        left = deadline - time.monotonic()
        if left <= 0:
            raise VmError(f"the guest's agent did not answer within {timeout:.0f} s ({last!r})")
        try:
            return await open_port_once(socket, min(left, attempt), on_close=on_close)
        except (OSError, TimeoutError, AgentError) as e:
            last = e
            await asyncio.sleep(0.1)  # a host away for a moment is seen gone: the next try starts clean


class _ClosingWriter:
    """A stream writer that runs ``on_close`` once, when it is closed."""

    def __init__(self, writer: asyncio.StreamWriter, on_close: Callable[[], None]) -> None:
        self._writer = writer
        self._on_close: Callable[[], None] | None = on_close

    def close(self) -> None:
        try:
            self._writer.close()
        finally:
            on_close, self._on_close = self._on_close, None
            if on_close is not None:
                on_close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


_REPLY = bytes([p.HELLO_REPLY, 0, 0, 0, 0]) + b"{"  # a HELLO reply's type, id 0 and the start of its JSON
_MAX_REPLY = 4096


async def port_hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, Any]:
    """The handshake over a VM's port. The port carries no connections of its own, so what a former
    connection had in flight may come first (its output, cut anywhere): HELLO carries a nonce, the agent
    echoes it, and everything before the reply that holds it is skipped. It also carries the host's clock
    and a random seed, which the guest takes (a guest restored from a snapshot has the snapshot's)."""
    nonce = secrets.token_hex(16)
    # the time and a seed make a guest restored from a snapshot its own (its clock and RNG are the snapshot's)
    hello = {
        "version": p.PROTOCOL_VERSION,
        "nonce": nonce,
        "time": time.time(),
        "seed": secrets.token_hex(32),
    }
    writer.write(p.encode_json(p.HELLO, 0, hello))
    await writer.drain()
    buf = bytearray()
    while data := await reader.read(1 << 20):
        buf += data
        info, used = _find_reply(buf, nonce)
        if info is not None:
            if used != len(buf):  # the agent sends nothing unasked after its reply
                raise AgentConnectionLost("bytes after the session agent's HELLO reply")
            return info
        del buf[:used]
    raise AgentConnectionLost("the VM's port closed before the session agent answered")


def _find_reply(buf: bytearray, nonce: str) -> tuple[dict[str, Any] | None, int]:
    """``(reply, its end)`` when ``buf`` holds the HELLO reply with ``nonce``, else ``(None, bytes that cannot
    begin it)``."""
    keep = max(0, len(buf) - len(_REPLY) - 3)
    i = buf.find(_REPLY, 4)
    while i >= 0:
        length = int.from_bytes(buf[i - 4 : i], "big")  # counts type, id and the JSON
        if 5 < length <= _MAX_REPLY:
            if i + length > len(buf):
                keep = min(keep, i - 4)
            else:
                with contextlib.suppress(ValueError):
                    info = json.loads(buf[i + 5 : i + length])
                    if isinstance(info, dict) and info.get("nonce") == nonce:
                        return info, i + length
        i = buf.find(_REPLY, i + 1)
    return None, keep


async def start_detached(argv: list[str], workdir: Path, *, pass_fds: tuple[int, ...] = ()) -> int:
    """Start QEMU with ``argv`` as a daemon of its own (it outlives the server: a restarted server finds it by
    its pid file), once it has set its devices up; its pid. ``pass_fds``: descriptors it inherits. VmError with
    QEMU's words when it refuses."""
    pidfile = workdir / "qemu.pid"
    log = os.open(workdir / "qemu.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            "-daemonize",
            "-pidfile",
            str(pidfile),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    finally:
        os.close(log)
    code = await process.wait()
    if code != 0:
        said = (workdir / "qemu.log").read_text(errors="replace").strip()
        raise VmError(f"QEMU refused to start ({code}): {said[-2000:]}")
    return int(pidfile.read_text().strip())


async def boot(
    guest: Guest,
    *,
    memory_mb: int = 256,
    accel: str = "tcg",
    workdir: Path | str | None = None,
    cpus: int = 1,
    qemu: str = QEMU,
    verbose: bool = False,
) -> BootedVm:
    """Start QEMU on ``guest``; :meth:`BootedVm.connect` waits for its agent. ``workdir`` (made when absent,
    removed by :meth:`BootedVm.close`) holds the port's socket: keep its path short (a unix socket's path is
    at most 107 bytes). ``accel`` is used as given: "kvm" where KVM does not work fails, it never falls back.
    ``verbose`` leaves the kernel's messages on (``console.log``)."""
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="tai-vm-"))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if len(str(workdir / "agent.sock")) > 107:
        raise VmError(f"the work folder's path is too long for a unix socket: {workdir}")
    argv = qemu_argv(guest, workdir, memory_mb=memory_mb, accel=accel, cpus=cpus, qemu=qemu, verbose=verbose)
    if shutil.which(argv[0]) is None:
        shutil.rmtree(workdir, ignore_errors=True)
        raise VmError(f"{argv[0]} is missing: install Debian's qemu-system-x86 (.ci/vm-up)")
    log = os.open(workdir / "qemu.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        os.close(log)
    return BootedVm(process, workdir, accel, argv)
