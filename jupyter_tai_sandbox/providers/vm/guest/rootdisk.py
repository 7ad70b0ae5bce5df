"""A docker image's files as a vm session's root: an ext4 disk image made once per image id, offline.

The image's filesystem comes from a Docker engine (a container of it made, never started, exported, and
removed), unpacked with numeric owners and written into a sparse ext4 image by ``mkfs.ext4 -d``. It is kept
in the vm cache (``roots/<image id>.img``, with ``.json``: the image's name, env, working dir), so every
session of the image, on any server of the host, attaches the same file read-only (QEMU's
``readonly=on``); the guest lays a tmpfs over it (an overlay) and the session's commands are chrooted into
that, the workspace bound in (:func:`setup_script`). A new image id (a rebuilt or re-pulled tag) makes a new
disk; :func:`remove_unused` removes the disks no create has used for a while and no QEMU of the host has open.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....contract import SandboxError, SandboxUnavailableError
from .build import cache_dir

#: the longest making one root disk may take (exporting and writing a large image)
BUILD_SECONDS = 900.0
#: how often a create waiting for another process's making of the same root disk looks again
LOCK_POLL_SECONDS = 0.25
#: free room left in a root disk beyond the image's files (its own metadata, a little slack)
SLACK_MB = 64
#: where the guest mounts the image's files, the overlay's tmpfs, and the root commands are chrooted into
IMAGE_DIR, OVERLAY_DIR, ROOT_DIR = "/image", "/overlay", "/newroot"


@dataclass(frozen=True)
class RootDisk:
    """A made root disk: its file, and the image config a session of it starts from."""

    path: Path
    image: str
    env: dict[str, str]


def roots_dir() -> Path:
    return cache_dir() / "roots"


def setup_script(workspace: str, overlay_mb: int) -> str:
    """The guest's root's shell script (busybox) that makes the session's root: the disk whose serial is
    ``tai-root`` read-only, a tmpfs of ``overlay_mb`` over it, the workspace bound in, /proc, /sys, /dev, /tmp.
    The image's files count no setuid bit and open no device node (``nosuid,nodev``): an image could carry a
    setuid program or a node of the agent's channel, and the session's user must not become root nor reach
    the agent through it."""
    return f"""set -e
dev=
for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = tai-root ] && dev=/dev/${{d##*/}}; done
[ -n "$dev" ] || {{ echo "no root disk attached" >&2; exit 1; }}
mkdir -p {IMAGE_DIR} {OVERLAY_DIR} {ROOT_DIR}
mount -t ext4 -o ro,noatime,nosuid,nodev "$dev" {IMAGE_DIR}
mount -t tmpfs -o size={overlay_mb}m,mode=0755 tmpfs {OVERLAY_DIR}
mkdir -p {OVERLAY_DIR}/upper {OVERLAY_DIR}/work
mount -t overlay -o nosuid,nodev,lowerdir={IMAGE_DIR},upperdir={OVERLAY_DIR}/upper,workdir={OVERLAY_DIR}/work overlay {ROOT_DIR}
for d in {workspace} /proc /sys /dev /tmp; do mkdir -p {ROOT_DIR}$d; done
mount -o bind {workspace} {ROOT_DIR}{workspace}
mount -t proc -o nosuid,nodev,noexec proc {ROOT_DIR}/proc
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs {ROOT_DIR}/sys
mount -o rbind /dev {ROOT_DIR}/dev
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs {ROOT_DIR}/tmp
"""


async def ensure_root_disk(engine: Any, image: str, *, log: Any = None) -> RootDisk:
    """The root disk of ``image`` (a tag or id the Docker ``engine`` holds), made now when there is none (one
    maker at a time across processes); SandboxError when the engine lacks the image or it cannot be made."""
    found = await engine.inspect_image(image)
    image_id = str(found["Id"]).split(":", 1)[-1]
    config = found.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or () if "=" in item)
    target = roots_dir() / f"{image_id[:32]}.img"
    if not target.exists():
        await asyncio.to_thread(roots_dir().mkdir, parents=True, exist_ok=True)
        if log is not None:
            log.info("sandbox-vm: making the root disk of image %s (once per image id)", image)
        started = time.monotonic()
        await engine.run_long(
            f"make the root disk of {image}",
            BUILD_SECONDS,
            _make_locked,
            engine.api,
            found["Id"],
            target,
            engine.scoped_labels({}),
        )
        if log is not None:
            log.info("sandbox-vm: made the root disk of %s in %.1f s", image, time.monotonic() - started)
    with contextlib.suppress(OSError):
        os.utime(target)  # when a create last used it
    return RootDisk(target, image, env)


def _make_locked(api: Any, image_id: str, target: Path, labels: dict[str, str]) -> None:
    """Make ``target`` unless another process is making it: then wait for it, at most BUILD_SECONDS (a lock
    held longer, by a stuck maker or anyone who can open the file, is a typed error, not a hang)."""
    lock = os.open(target.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        give_up = time.monotonic() + BUILD_SECONDS
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > give_up:
                    raise SandboxUnavailableError(
                        f"another process has been making the root disk {target.name} for "
                        f"{BUILD_SECONDS:.0f} s; try again later"
                    ) from None
                time.sleep(LOCK_POLL_SECONDS)
        if not target.exists():
            _make(api, image_id, target, labels)
    finally:
        os.close(lock)


def _make(api: Any, image_id: str, target: Path, labels: dict[str, str]) -> None:
    work = Path(tempfile.mkdtemp(prefix=".root-", dir=target.parent))
    container = api.create_container(
        image_id, command=["/none"], entrypoint=[], labels=labels, network_disabled=True
    )["Id"]
    try:
        files = work / "files"
        files.mkdir()
        untar = subprocess.Popen(
            ["tar", "-x", "--numeric-owner", "-C", str(files)], stdin=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert untar.stdin is not None and untar.stderr is not None
        try:
            for chunk in api.export(container, chunk_size=1 << 20):
                untar.stdin.write(chunk)
        finally:
            untar.stdin.close()
        if untar.wait() != 0:
            raise SandboxError(
                f"unpacking the image's files failed: {untar.stderr.read().decode(errors='replace')[-500:]}"
            )
        size = sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(files) for n in names)
        image = work / "root.img"
        with open(image, "wb") as f:
            f.truncate((int(size * 1.3) >> 20 << 20) + (SLACK_MB << 20))
        made = subprocess.run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-i",
                "8192",
                "-L",
                "tai-root",
                "-d",
                str(files),
                str(image),
            ],
            capture_output=True,
        )
        if made.returncode != 0:
            raise SandboxError(f"writing the root disk failed: {made.stderr.decode(errors='replace')[-500:]}")
        target.with_suffix(".json").write_text(json.dumps({"image": image_id, "made": time.time()}))
        os.replace(image, target)
    except FileNotFoundError as e:
        raise SandboxUnavailableError(
            f"making a root disk needs tar and mkfs.ext4 (e2fsprogs): {e}"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            api.remove_container(container, force=True)
        shutil.rmtree(work, ignore_errors=True)


def remove_unused(idle_seconds: float, now: float | None = None) -> list[Path]:
    """Remove the root disks no create has used for ``idle_seconds`` and no QEMU on this host has open (any
    deployment's), with the golden snapshots saved with them; the removed disks. Blocking (it reads /proc)."""
    now = time.time() if now is None else now
    idle = []
    for disk in roots_dir().glob("*.img"):
        with contextlib.suppress(OSError):
            if now - disk.stat().st_mtime >= idle_seconds:
                idle.append(disk)
    if not idle:
        return []
    in_use = _attached()
    removed = []
    for disk in idle:
        if str(disk) in in_use:
            continue
        saved_with = hashlib.sha256(str(disk).encode()).hexdigest()[:12]
        for made in [*cache_dir().glob(f"*/golden*-r{saved_with}*"), disk.with_suffix(".json"), disk]:
            with contextlib.suppress(FileNotFoundError):
                made.unlink()
        removed.append(disk)
    return removed


_ROOT_DRIVE = re.compile(rb"file=([^,\x00]+),if=none,id=root,")


def _attached() -> set[str]:
    """The root disks the command lines of this host's processes name (QEMU's ``-drive ...,id=root``)."""
    found: set[str] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found.update(
                    m.decode() for m in _ROOT_DRIVE.findall(Path(entry.path, "cmdline").read_bytes())
                )
    return found
