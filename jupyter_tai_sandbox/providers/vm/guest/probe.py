"""Whether ``vm`` isolation is real on this host: a KVM boot of the guest, tried and reported as it went.

KVM is reported working only when a guest booted with ``-accel kvm`` answered the handshake; otherwise the
reason (no /dev/kvm, QEMU's refusal, a boot that never answered). TCG is reported on its own line: it boots a
separate guest kernel, but an emulator in a host process is not a hardened boundary. Nothing here chooses
one for the other. The result is kept per host (its kernel and QEMU's version) in the cache folder.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from .build import Guest, build_guest, cache_dir
from .qemu import QEMU, VmError, boot

KVM_TIMEOUT = 20.0
TCG_TIMEOUT = 60.0
TCG_NOTE = "a separate guest kernel, not a hardened boundary"


def qemu_version(qemu: str = QEMU) -> str | None:
    if shutil.which(qemu) is None:
        return None
    done = subprocess.run([qemu, "--version"], capture_output=True, text=True)
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout else None


def host_key(qemu: str = QEMU) -> dict[str, Any]:
    return {
        "kernel": f"{platform.release()} {platform.version()}",
        "machine": platform.machine(),
        "qemu": qemu_version(qemu),
    }


async def _try(guest: Guest, accel: str, timeout: float, *, verbose: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    try:
        vm = await boot(guest, accel=accel, verbose=verbose)
    except (OSError, VmError) as e:
        return {"works": False, "reason": str(e)}
    try:
        client = await vm.connect(timeout=timeout)
        seconds = time.monotonic() - started
        await client.close()
        return {"works": True, "seconds": round(seconds, 2)}
    except VmError as e:
        return {"works": False, "reason": str(e)}
    finally:
        await vm.close()


def _cache_file(key: dict[str, Any]) -> Path:
    return (
        cache_dir()
        / f"probe-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"
    )


async def cached_probe(qemu: str = QEMU) -> dict[str, Any] | None:
    """The probe's kept result for this host; None when it has not run here."""
    key = await asyncio.to_thread(host_key, qemu)  # runs QEMU for its version
    try:
        return json.loads(_cache_file(key).read_text())
    except (OSError, ValueError):
        return None


async def probe(guest: Guest | None = None, *, fresh: bool = False, qemu: str = QEMU) -> dict[str, Any]:
    """``{"host", "kvm": {"works", "reason"|"seconds"}, "emulated": {...}, "lines": [...]}``, from the cache
    unless ``fresh``."""
    if not fresh:
        found = await cached_probe(qemu)
        if found is not None:
            return found
    key = await asyncio.to_thread(host_key, qemu)
    path = _cache_file(key)
    result: dict[str, Any] = {"host": key, "probed": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if key["qemu"] is None:
        missing = {
            "works": False,
            "reason": f"{qemu} is missing: install Debian's qemu-system-x86 (.ci/vm-up)",
        }
        result["kvm"], result["emulated"] = missing, missing
    else:
        if guest is None:
            guest = await asyncio.to_thread(build_guest)
        result["guest"] = guest.path.name
        if not os.path.exists("/dev/kvm"):
            result["kvm"] = {
                "works": False,
                "reason": "/dev/kvm is missing (no KVM in this kernel, or not passed in)",
            }
        elif not os.access("/dev/kvm", os.R_OK | os.W_OK):
            result["kvm"] = {"works": False, "reason": "/dev/kvm is not readable and writable by this user"}
        else:
            result["kvm"] = await _try(guest, "kvm", KVM_TIMEOUT, verbose=True)  # where it stopped
            if not result["kvm"]["works"] and os.path.isdir("/sys/module/kvm_pvm"):
                result["kvm"]["reason"] = (
                    "/dev/kvm here is PVM (module kvm_pvm), which boots only guest kernels "
                    f"built for PVM, not Debian's: {result['kvm']['reason']}"
                )
        result["emulated"] = await _try(guest, "tcg", TCG_TIMEOUT)
    result["lines"] = describe(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)
    return result


def describe(result: dict[str, Any]) -> list[str]:
    kvm, tcg = result["kvm"], result["emulated"]
    lines = [
        f"kvm: works (agent answered {kvm['seconds']} s after QEMU started)"
        if kvm["works"]
        else f"kvm: fails: {_first_lines(kvm['reason'])}"
    ]
    lines.append(
        f"emulated: works (agent answered {tcg['seconds']} s after QEMU started): {TCG_NOTE}"
        if tcg["works"]
        else f"emulated: fails: {_first_lines(tcg['reason'])}"
    )
    return lines


def _first_lines(text: str, keep: int = 12) -> str:
    """The reason's first two lines and its last ones (a console's tail says most where it stopped)."""
    lines = text.strip().splitlines()
    if len(lines) > keep:
        lines = [*lines[:2], "...", *lines[-(keep - 2) :]]
    return "\n  ".join(lines)
