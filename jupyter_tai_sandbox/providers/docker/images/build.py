"""Build the minimal session image offline, from Debian's ``busybox-static``.

The provider needs nothing from an image (the session agent comes on its own
read-only volume); this one gives session commands and the conformance suite
``sh`` and the busybox applets (``setsid``, ``mkfifo``, ``mv``, ``rm``,
``cat``, ``kill``, ``readlink``, ``ls``, a fractional ``sleep`` ...), and
``/workspace``.
No registry is needed: the root filesystem is written as a tar stream in memory
and handed to the engine's image import (about 2 MB, well under a second). The
stream is the same byte for byte while busybox is (every entry carries the busybox
binary's mtime), and the image is labelled with its digest: an image of that name
and label is kept as it is, neither imported again nor re-tagged.

``wget`` is kept, with one trap: Debian's static busybox (1.35) crashes with a
segmentation fault whenever ``-T``/``--timeout`` is given, even for a literal IP
address; without it ``wget`` works (``wget -q -O- http://host:port/path``). Bound
a download with the ``timeout`` applet instead: ``timeout 10 wget ...``. Leaving
the link out would not help: busybox's shell runs its own applets by name, with
or without a link.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ....images import DEFAULT_IMAGE, PYTHON_IMAGE

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
#: the minimal image's label: the digest of its root filesystem's tar stream and its config changes
LABEL_ROOTFS = "jupyter-tai-sandbox.rootfs"


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
        raise ImageBuildError(f"{busybox} lacks applets {sorted(missing)}: install Debian's busybox-static")
    return paths


def rootfs_tar(busybox: str | None = None) -> bytes:
    """The minimal root filesystem as an uncompressed tar archive, the same bytes for the same busybox."""
    busybox = busybox or find_busybox()
    now = int(os.stat(busybox).st_mtime)
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


def rootfs_digest(data: bytes) -> str:
    """What :data:`LABEL_ROOTFS` holds for the root filesystem ``data``."""
    return hashlib.sha256(data + "\n".join(_CHANGES).encode()).hexdigest()


def build_minimal_image(
    name: str = DEFAULT_IMAGE, base_url: str | None = None, *, force: bool = False
) -> str:
    """Import the minimal image into the engine as ``name``; return its id. An image ``name`` built from the
    same root filesystem (its :data:`LABEL_ROOTFS`) is kept, untouched, unless ``force``."""
    return ensure_minimal_image(name, base_url, force=force)[0]


def ensure_minimal_image(
    name: str = DEFAULT_IMAGE, base_url: str | None = None, *, force: bool = False
) -> tuple[str, bool]:
    """:func:`build_minimal_image`, and whether it imported (False: an up-to-date ``name`` was kept)."""
    try:
        import docker
        import docker.errors
    except ImportError as e:  # pragma: no cover - the docker extra is missing
        raise ImageBuildError("the docker SDK is missing: pip install 'jupyter-tai-sandbox[docker]'") from e
    repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
    data = rootfs_tar()
    digest = rootfs_digest(data)
    try:
        client = docker.APIClient(base_url=base_url) if base_url else docker.from_env().api
        try:
            found = client.inspect_image(name)
        except docker.errors.ImageNotFound:
            found = None
        previous = found["Id"] if found else None
        if (
            found
            and not force
            and ((found.get("Config") or {}).get("Labels") or {}).get(LABEL_ROOTFS) == digest
        ):
            return found["Id"], False
        changes = [*_CHANGES, f'LABEL {LABEL_ROOTFS}="{digest}"']
        client.import_image_from_data(data, repository=repository, tag=tag, changes=changes)
        built = client.inspect_image(name)["Id"]
        if previous and previous != built:
            # the old build lost its name: drop it unless a container still uses it
            with contextlib.suppress(docker.errors.APIError):
                client.remove_image(previous)
        return built, True
    except docker.errors.DockerException as e:
        raise ImageBuildError(
            f"could not import {name} into the Docker engine ({e}); is an engine running? "
            "(start one with: dockerd &)"
        ) from e


# ------------------------------------------------------------ the Python image

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: debootstrap's own --include: python3, and procps (ps and kill for people at a terminal). debootstrap
#: resolves dependencies shallowly, so the kernel's packages come after, with apt.
BASE_PACKAGES = ("python3", "procps")
#: installed with apt-get in the new root: what a kernel needs
PYTHON_PACKAGES = ("python3-ipykernel",)
_APT_SOURCES = ("/etc/apt/sources.list", "/etc/apt/sources.list.d")


def apt_mirror(suite: str = DEFAULT_SUITE) -> str:
    """The Debian mirror this machine's apt sources name for ``suite`` (one-line or deb822), else deb.debian.org."""
    files: list[str] = []
    for source in _APT_SOURCES:
        if os.path.isdir(source):
            files += sorted(
                os.path.join(source, n) for n in os.listdir(source) if n.endswith((".list", ".sources"))
            )
        elif os.path.isfile(source):
            files.append(source)
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                line = line.strip()
                if line.startswith("deb ") and "security" not in line:
                    words = [w for w in line.split() if not w.startswith("[") and not w.endswith("]")]
                    if len(words) >= 3 and words[2] == suite:
                        return words[1]
                key, sep, value = line.partition(":")
                if sep and not line.startswith("#"):
                    fields[key.strip().lower()] = value.strip()
            if suite in fields.get("suites", "").split() and fields.get("uris"):
                return fields["uris"].split()[0]
    return DEFAULT_MIRROR


def _say(progress: Any, line: str) -> None:
    if progress is not None:
        progress(line)


def image_exists(name: str) -> bool:
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise ImageBuildError("the docker command is missing (Debian: apt-get install docker.io)")
    return (
        subprocess.run([docker_cli, "image", "inspect", name], capture_output=True, check=False).returncode
        == 0
    )


def build_python_image(
    name: str = PYTHON_IMAGE,
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    force: bool = False,
    progress: Callable[[str], Any] | None = None,
    base_url: str | None = None,
) -> str | None:
    """Build the Python session image offline from Debian's packages; return its id (None: kept as it was).

    ``packages.build_with_packages`` adds pip packages on top of it.

    ``debootstrap --variant=minbase --include=python3,procps SUITE DIR MIRROR`` into a temporary folder,
    ``chroot DIR apt-get install --no-install-recommends python3-ipykernel`` (debootstrap alone resolves
    dependencies too shallowly for it), then ``tar -C DIR -c . | docker import - NAME``: no registry. About
    300 MB and one to three minutes. An existing ``name`` is kept unless ``force``. ``progress`` gets
    one line of text at a time (debootstrap's own ``I:`` lines included).
    """
    env = dict(os.environ)
    if base_url:
        env["DOCKER_HOST"] = base_url
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise ImageBuildError("the docker command is missing (Debian: apt-get install docker.io)")
    if (
        not force
        and subprocess.run(
            [docker_cli, "image", "inspect", name], capture_output=True, env=env, check=False
        ).returncode
        == 0
    ):
        _say(progress, f"{name} exists: kept (--force rebuilds it)")
        return None
    debootstrap = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.path.exists(p)), None
    )
    if debootstrap is None:
        raise ImageBuildError("debootstrap is missing: install it (Debian: apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root: run build-image --python as root (or with sudo)")
    mirror = mirror or apt_mirror(suite)
    started = time.monotonic()
    with tempfile_dir() as root:
        argv = [
            debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, root, mirror,
        ]  # fmt: skip
        _say(progress, f"debootstrap {suite} from {mirror} into {root} ...")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-19:], line]
            if line.startswith(("I: Retrieving", "I: Validating", "I: Unpacking", "I: Configuring")):
                continue  # one per package: too chatty
            _say(progress, f"  {line}")
        if proc.wait() != 0:
            raise ImageBuildError(
                f"debootstrap failed (status {proc.returncode}); its last lines:\n" + "\n".join(tail)
            )
        _install_in_root(root, PYTHON_PACKAGES, progress)
        # what an image does not need: package caches and lists
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            folder = os.path.join(root, junk)
            for entry in os.listdir(folder) if os.path.isdir(folder) else ():
                path = os.path.join(folder, entry)
                if os.path.isfile(path):
                    os.unlink(path)
        os.makedirs(os.path.join(root, "workspace"), exist_ok=True)
        os.chmod(os.path.join(root, "workspace"), 0o777)
        os.chmod(os.path.join(root, "tmp"), 0o1777)
        _say(progress, f"docker import {name} ...")
        changes: list[str] = []
        for change in _CHANGES:
            changes += ["--change", change]
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(
                [docker_cli, "import", *changes, "-", name], stdin=tar.stdout, capture_output=True, text=True,
                env=env, check=False,
            )  # fmt: skip
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise ImageBuildError(
                f"docker import of {name} failed: {imported.stderr.strip() or 'tar failed'}"
            )
    image_id = imported.stdout.strip()
    _say(progress, f"built {name} ({image_id[:19]}) in {time.monotonic() - started:.0f} s")
    return image_id


#: the environment of a command run in a new root (chroot): none of the caller's variables
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C",
    "HOME": "/root",
}


def apt_in_root(
    root: str, packages: Sequence[str], progress: Callable[[str], Any] | None, *, download_only: bool = False
) -> None:
    """``apt-get update`` and ``apt-get install`` ``packages`` inside ``root`` (chroot), with the host's resolver
    while it runs; ``download_only``: only into the root's ``var/cache/apt/archives``. ImageBuildError with
    the end of apt's output when a step fails."""
    with contextlib.suppress(OSError):
        shutil.copyfile("/etc/resolv.conf", os.path.join(root, "etc/resolv.conf"))
    install = ["apt-get", "install", "-y", "-q", *(["--download-only"] if download_only else [])]
    try:
        for step in (["apt-get", "update", "-q"], [*install, "--no-install-recommends", *packages]):
            _say(progress, f"chroot: {' '.join(step)}")
            done = subprocess.run(
                ["chroot", root, *step], capture_output=True, text=True, env=CHROOT_ENV, check=False
            )
            for line in done.stdout.splitlines():
                if line.startswith(("Setting up", "Get:")):
                    continue  # one per package: too chatty
                _say(progress, f"  {line}")
            if done.returncode != 0:
                raise ImageBuildError(
                    f"{' '.join(step)} in the new root failed (status {done.returncode}): "
                    + "\n".join((done.stdout + done.stderr).splitlines()[-20:])
                )
    finally:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(root, "etc/resolv.conf"))


def _install_in_root(root: str, packages: Sequence[str], progress: Callable[[str], Any] | None) -> None:
    """``apt-get install`` ``packages`` inside the new root (chroot), its package cache emptied after."""
    apt_in_root(root, packages, progress)
    subprocess.run(["chroot", root, "apt-get", "clean"], capture_output=True, env=CHROOT_ENV, check=False)


@contextlib.contextmanager
def tempfile_dir() -> Iterator[str]:
    import tempfile

    root = tempfile.mkdtemp(prefix="tai-sandbox-rootfs-")
    try:
        yield root
    finally:
        # debootstrap leaves /proc or /sys mounted when it fails midway: unmount before removing
        for mount in ("proc", "sys", "dev/pts"):
            path = os.path.join(root, mount)
            if os.path.ismount(path):
                subprocess.run(["umount", "-l", path], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)
