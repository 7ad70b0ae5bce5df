"""Build the minimal session image offline, from Debian's ``busybox-static``.

The image is the contract's floor: ``sh`` and the busybox applets (``setsid``,
``mkfifo``, ``mv``, ``rm``, ``cat``, ``kill``, ``readlink``, ``ls``, a
fractional ``sleep`` ...), ``/proc``, a writable ``/tmp`` and ``/workspace``.
No registry is needed: the root filesystem is written as a tar stream in memory
and handed to the engine's image import (about 2 MB, well under a second).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import time

DEFAULT_IMAGE = "jupyter-tai-sandbox/minimal:latest"
BUSYBOX_CANDIDATES = ("/usr/bin/busybox", "/bin/busybox")
REQUIRED_APPLETS = (
    "sh", "setsid", "mkfifo", "mv", "rm", "cat", "kill", "readlink", "ls", "sleep",
    "head", "printf", "echo", "ln", "env", "id", "true", "false",
)  # fmt: skip
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "WORKDIR /workspace",
    'CMD ["sh"]',
]


class ImageBuildError(RuntimeError):
    """The image could not be built; the message says what to install or start."""


def find_busybox() -> str:
    """The path of a statically linked busybox binary."""
    for path in BUSYBOX_CANDIDATES:
        if os.path.isfile(path):
            return path
    found = shutil.which("busybox")
    if found:
        return found
    raise ImageBuildError("busybox not found: install it (Debian: apt-get install busybox-static)")


def _applets(busybox: str) -> list[str]:
    """Applet paths relative to the root (e.g. ``usr/bin/head``)."""
    out = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=False)
    paths = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    missing = set(REQUIRED_APPLETS) - {p.rsplit("/", 1)[-1] for p in paths}
    if out.returncode != 0 or missing:
        raise ImageBuildError(
            f"{busybox} lacks applets {sorted(missing)}: install Debian's busybox-static"
        )
    return paths


def rootfs_tar(busybox: str | None = None) -> bytes:
    """The minimal root filesystem as an uncompressed tar archive."""
    busybox = busybox or find_busybox()
    now = int(time.time())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes, mode: int, data: bytes = b"", target: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, now, target
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "proc", "dev", "sys", "root"):
            add(d, tarfile.DIRTYPE, 0o755)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        add("workspace", tarfile.DIRTYPE, 0o777)  # writable whatever DockerSandbox.user is
        with open(busybox, "rb") as f:
            add("bin/busybox", tarfile.REGTYPE, 0o755, f.read())
        for path in _applets(busybox):
            if path != "bin/busybox" and "/" in path:
                add(path, tarfile.SYMTYPE, 0o777, target="/bin/busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, _PASSWD.encode())
        add("etc/group", tarfile.REGTYPE, 0o644, _GROUP.encode())
    return buf.getvalue()


def build_minimal_image(name: str = DEFAULT_IMAGE, base_url: str | None = None) -> str:
    """Import the minimal image into the engine as ``name``; return its id."""
    try:
        import docker
        import docker.errors
    except ImportError as e:  # pragma: no cover - the docker extra is missing
        raise ImageBuildError("the docker SDK is missing: pip install 'jupyter-tai-sandbox[docker]'") from e
    repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    data = rootfs_tar()
    try:
        client = docker.APIClient(base_url=base_url) if base_url else docker.from_env().api
        try:
            previous = client.inspect_image(name)["Id"]
        except docker.errors.ImageNotFound:
            previous = None
        client.import_image_from_data(data, repository=repository, tag=tag, changes=_CHANGES)
        built = client.inspect_image(name)["Id"]
        if previous and previous != built:
            # the old build lost its name: drop it unless a container still uses it
            with contextlib.suppress(docker.errors.APIError):
                client.remove_image(previous)
        return built
    except docker.errors.DockerException as e:
        raise ImageBuildError(
            f"could not import {name} into the Docker engine ({e}); is an engine running? "
            "(start one with: dockerd &)"
        ) from e
