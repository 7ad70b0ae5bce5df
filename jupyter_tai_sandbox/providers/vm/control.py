"""A running session VM's control: QMP commands to its QEMU (stop, cont), and the copy of a running guest
into a new VM (fork): its memory and devices saved with QMP ``migrate`` to a file in the new session's folder,
loaded by a QEMU started with the same machine (``-incoming defer``, then ``migrate-incoming``), which then
runs on apart. Both go through a descriptor of the file the server opens and hands QEMU (QMP ``getfd``): a
confined QEMU reaches no path of the host's."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from ...contract import SandboxUnavailableError
from .guest.build import Guest
from .guest.qemu import VmError, qemu_argv
from .guest.snapshot import POLL_SECONDS, Qmp, memory_args, qmp_args
from .machines import Machines
from .networks import TAP

#: the longest one QMP command may take
QMP_SECONDS = 5.0
#: the longest a fork's save and load may take each (a guest's memory through a local file)
COPY_SECONDS = 60.0
#: the migration's bandwidth cap, bytes/s: a local file takes what it gets (QEMU's default is 128 MiB/s)
COPY_BANDWIDTH = 8 << 30


async def qmp(folder: Path, command: str, /, **arguments: Any) -> Any:
    """One QMP command to the QEMU of the session in ``folder``."""
    control = await _connect(folder)
    try:
        return await asyncio.wait_for(control.command(command, **arguments), QMP_SECONDS)
    finally:
        control.close()


async def _connect(folder: Path) -> Qmp:
    try:
        return await Qmp.connect(folder / "qmp.sock", timeout=QMP_SECONDS)
    except VmError as e:
        raise SandboxUnavailableError(f"the session's QEMU does not answer: {e}") from None


async def save(folder: Path, state: Path) -> None:
    """Save the guest of the session in ``folder`` (memory and devices) to ``state``: the guest stops for the
    save and runs on after it, if it ran before."""
    control = await _connect(folder)
    try:
        ran = bool((await control.command("query-status")).get("running"))
        await control.command("stop")
        try:
            await control.command("migrate-set-parameters", **{"max-bandwidth": COPY_BANDWIDTH})
            # a guest restored from a golden loaded it with x-ignore-shared, which changes the stream's format:
            # the copy's QEMU loads a plain stream, the whole memory in it
            await control.command(
                "migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": False}]
            )
            await control.migrate_out(state)
            async with asyncio.timeout(COPY_SECONDS):
                while True:
                    status = (await control.command("query-migrate")).get("status")
                    if status == "completed":
                        break
                    if status in ("failed", "cancelled"):
                        raise SandboxUnavailableError(f"saving the session's guest {status}")
                    await asyncio.sleep(POLL_SECONDS)
        finally:
            if ran:
                with contextlib.suppress(VmError, OSError):
                    await control.command("cont")
    finally:
        control.close()


def copy_argv(guest: Guest, folder: Path, record: dict[str, Any]) -> list[str]:
    """The command line of a VM that loads a state saved from the session ``record`` describes (given it by
    :func:`run_loaded`): the same machine, its memory an object of the same name when the source's was a
    golden's."""
    shape = record["shape"]
    argv = qemu_argv(guest, folder, console=False, tap=TAP if shape.get("nic") else None, **shape)
    if record.get("golden"):  # the same memory object as the source's (its contents all in the state)
        argv += memory_args(None, shape["memory_mb"])
    return [*argv, *qmp_args(folder / "qmp.sock"), "-incoming", "defer"]


async def run_loaded(machines: Machines, session_id: str, state: Path, *, link: bool = True) -> None:
    """Load ``state`` into the session's QEMU (started with :func:`copy_argv`), wait until it is loaded, then
    let the guest run (a state saved from a stopped guest loads stopped); without ``link``, its network card's
    link is down until QMP ``set_link``."""
    control = await _connect(machines.folder(session_id))  # one connection: QEMU takes one client at a time
    try:
        async with asyncio.timeout(COPY_SECONDS):
            await control.migrate_incoming(state)
            while True:
                status = (await control.command("query-status")).get("status")
                if status != "inmigrate" and not link:
                    await control.command("set_link", name="net0", up=False)
                if status == "running":
                    return
                if status != "inmigrate":
                    await control.command("cont")
                    return
                if not machines.running(session_id):
                    raise SandboxUnavailableError("the copy's QEMU ended while it loaded the state")
                await asyncio.sleep(POLL_SECONDS)
    finally:
        control.close()
