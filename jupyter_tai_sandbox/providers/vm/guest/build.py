"""The vm provider's guest: a Debian cloud kernel and an initramfs whose ``/init`` is the session agent.

Built offline from Debian packages (``apt-get download`` from the machine's own apt sources, then
``dpkg-deb -x``) and kept in a cache folder, one per set of inputs (:func:`guest_key`): the kernel package's
name and version, busybox-static's, the agent binary's sha256 and this recipe. A later build with the same
inputs reuses it; a new kernel version in apt makes a new one. ``guest.json`` beside the artifacts says what
they were made from (each package's name, version and the sha256 of its ``.deb``).

The initramfs is a gzip'd newc cpio written here (no cpio program): ``/init`` is the agent, started by the
kernel with the arguments after ``--`` on its command line (``-- vm``: ``tai-agent vm``); ``/lib/modules``
holds the virtio, fuse and overlay modules with ``load.order``, the order the agent loads them in (each after
those its ``.modinfo`` says it depends on); ``/bin/busybox`` (Debian's static busybox) with a few applet
links gives commands a shell and the usual small programs.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....agent.binary import agent_binary

KERNEL_PACKAGE = "linux-image-cloud-amd64"  # a metapackage: it depends on the versioned image package
BUSYBOX_PACKAGE = "busybox-static"
#: the modules the guest loads (each with what it depends on, first): virtio over MMIO and the serial port
#: the agent speaks on; block, rng, net, virtiofs and overlay for what comes next
MODULES = (
    "virtio",
    "virtio_ring",
    "virtio_mmio",
    "virtio_console",
    "virtio_blk",
    "virtio_rng",
    "failover",
    "net_failover",
    "virtio_net",
    "fuse",
    "virtiofs",
    "overlay",
    "ext4",
)
#: the applets linked when the package's busybox cannot list its own here (every one it has, otherwise)
APPLETS = (
    "sh",
    "sleep",
    "cat",
    "head",
    "echo",
    "true",
    "false",
    "ls",
    "kill",
    "ps",
    "yes",
    "wc",
    "id",
    "env",
    "uname",
    "mkdir",
    "rm",
    "seq",
    "tail",
    "grep",
)
#: ``-- vm``: the kernel gives init what follows ``--`` as its arguments. panic=-1 with QEMU's -no-reboot
#: makes an agent that dies (the kernel panics when PID 1 exits) end QEMU instead of leaving it hung.
CMDLINE = "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init -- vm"
#: what this module makes of the same packages; a change here makes a new cache key
RECIPE = 2
CACHE_ENV = "TAI_SANDBOX_VM_CACHE"


class GuestBuildError(RuntimeError):
    """The guest could not be built (no apt, a package missing, an unexpected package layout)."""


@dataclass(frozen=True)
class Guest:
    """A built guest: what QEMU boots."""

    path: Path
    kernel: Path
    initrd: Path
    cmdline: str
    kernel_release: str
    info: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Guest:
        info = json.loads((path / "guest.json").read_text())
        return cls(
            path, path / info["kernel"], path / info["initrd"], info["cmdline"], info["kernel_release"], info
        )


def cache_dir() -> Path:
    """Where guests (and the probe's results) are kept: ``$TAI_SANDBOX_VM_CACHE``, else
    ``~/.cache/jupyter-tai-sandbox/vm``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jupyter-tai-sandbox" / "vm"


def _run(argv: list[str], **kw: Any) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, **kw)
    except FileNotFoundError:
        raise GuestBuildError(
            f"{argv[0]} is missing: the vm guest is built from Debian packages with apt"
        ) from None
    if done.returncode != 0:
        raise GuestBuildError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _candidate(package: str) -> dict[str, str]:
    """The fields of the version apt would install of ``package``."""
    fields: dict[str, str] = {}
    for line in _run(["apt-cache", "show", "--no-all-versions", package]).splitlines():
        if not line.strip():
            break
        if not line.startswith(" ") and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    if "Version" not in fields:
        raise GuestBuildError(f"apt knows no version of {package} (apt-get update?)")
    return fields


def resolve_packages() -> dict[str, dict[str, str]]:
    """The packages a build takes, as apt resolves them now: ``{"kernel": {"package", "version"}, "busybox": ...}``."""
    meta = _candidate(KERNEL_PACKAGE)
    found = re.search(r"\b(linux-image-[^\s,(]+)", meta.get("Depends", ""))
    if not found:
        raise GuestBuildError(
            f"{KERNEL_PACKAGE} {meta['Version']} depends on no linux-image package: {meta.get('Depends')}"
        )
    image = found.group(1)
    return {
        "kernel": {
            "package": image,
            "version": _candidate(image)["Version"],
            "via": f"{KERNEL_PACKAGE} {meta['Version']}",
        },
        "busybox": {"package": BUSYBOX_PACKAGE, "version": _candidate(BUSYBOX_PACKAGE)["Version"]},
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def guest_key(packages: dict[str, dict[str, str]], agent_sha256: str) -> str:
    inputs = {
        "recipe": RECIPE,
        "agent": agent_sha256,
        "cmdline": CMDLINE,
        "modules": MODULES,
        "applets": APPLETS,
        **{k: [v["package"], v["version"]] for k, v in packages.items()},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def build_guest(cache: Path | None = None, *, arch: str = "amd64") -> Guest:
    """The guest for the current inputs: from the cache when built before, else built now (offline but for
    ``apt-get download`` from the machine's apt sources). Safe to run in parallel: each build is made in a
    folder of its own and renamed into place; the first one there wins."""
    if arch != "amd64":
        raise GuestBuildError(f"no vm guest for {arch}: QEMU's microvm machine is x86_64 only")
    cache = cache or cache_dir()
    agent = agent_binary(arch)
    agent_sha = _sha256(agent)
    packages = resolve_packages()
    key = guest_key(packages, agent_sha)
    target = cache / key
    with contextlib.suppress(FileNotFoundError, KeyError, ValueError):
        return Guest.load(target)
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        out = work / "guest"
        out.mkdir()
        _build(work, out, key, packages, agent, agent_sha)
        try:
            out.rename(target)
        except OSError:  # another build got there first (a non-empty target folder)
            if not (target / "guest.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Guest.load(target)


def _download(work: Path, package: str, version: str) -> Path:
    """``package=version`` as a .deb in ``work`` (apt warns it downloads unsandboxed as root: harmless here)."""
    _run(["apt-get", "download", "-q", f"{package}={version}"], cwd=work)
    debs = list(work.glob(f"{package}_*.deb"))
    if len(debs) != 1:
        raise GuestBuildError(f"apt-get download {package}={version} gave {debs}")
    got = _run(["dpkg-deb", "-f", str(debs[0]), "Package", "Version"])
    if f"Package: {package}\nVersion: {version}" not in got:
        raise GuestBuildError(f"{debs[0].name} is not {package} {version}: {got}")
    return debs[0]


def _build(
    work: Path, out: Path, key: str, packages: dict[str, dict[str, str]], agent: Path, agent_sha: str
) -> None:
    record: dict[str, Any] = {
        "key": key,
        "recipe": RECIPE,
        "cmdline": CMDLINE,
        "agent": {"path": agent.name, "sha256": agent_sha},
        "packages": {},
    }
    roots = {}
    for role, pkg in packages.items():
        deb = _download(work, pkg["package"], pkg["version"])
        roots[role] = work / role
        _run(["dpkg-deb", "-x", str(deb), str(roots[role])])
        record["packages"][role] = {**pkg, "deb": deb.name, "sha256": _sha256(deb)}
        deb.unlink()
    kernels = sorted((roots["kernel"] / "boot").glob("vmlinuz-*"))
    if len(kernels) != 1:
        raise GuestBuildError(f"{packages['kernel']['package']} holds {len(kernels)} kernels, not one")
    release = kernels[0].name[len("vmlinuz-") :]
    shutil.copyfile(kernels[0], out / "vmlinuz")
    modules = _module_order(roots["kernel"] / "lib" / "modules" / release, MODULES)
    busybox = roots["busybox"] / "bin" / "busybox"
    if not busybox.is_file():
        raise GuestBuildError(f"{BUSYBOX_PACKAGE} holds no bin/busybox")
    applets = _applets(busybox)
    with (out / "initrd.img").open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        _initramfs(gz, agent, busybox, release, modules, applets)
    record.update(
        {
            "kernel": "vmlinuz",
            "initrd": "initrd.img",
            "kernel_release": release,
            "modules": [f"/lib/modules/{release}/{rel}" for rel, _ in modules],
            "busybox_applets": applets,
            "sha256": {"vmlinuz": _sha256(out / "vmlinuz"), "initrd.img": _sha256(out / "initrd.img")},
        }
    )
    (out / "guest.json").write_text(json.dumps(record, indent=2) + "\n")


# -- kernel modules


def modinfo(data: bytes) -> dict[str, list[str]]:
    """A module's ``.modinfo`` section (ELF64 little-endian): each key with its values."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise GuestBuildError("not an ELF64 little-endian module")
    u16 = lambda o: int.from_bytes(data[o : o + 2], "little")  # noqa: E731
    u32 = lambda o: int.from_bytes(data[o : o + 4], "little")  # noqa: E731
    u64 = lambda o: int.from_bytes(data[o : o + 8], "little")  # noqa: E731
    shoff, shentsize, shnum, shstrndx = u64(0x28), u16(0x3A), u16(0x3C), u16(0x3E)
    headers = [shoff + i * shentsize for i in range(shnum)]
    names_at = u64(headers[shstrndx] + 0x18)
    for h in headers:
        name_at = names_at + u32(h)
        if data[name_at : data.index(b"\0", name_at)] == b".modinfo":
            offset, size = u64(h + 0x18), u64(h + 0x20)
            info: dict[str, list[str]] = {}
            for item in data[offset : offset + size].split(b"\0"):
                key, sep, value = item.decode(errors="replace").partition("=")
                if sep:
                    info.setdefault(key, []).append(value)
            return info
    raise GuestBuildError("a module without .modinfo")


def _module_order(tree: Path, wanted: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """``(path relative to tree, bytes)`` of the wanted modules and those they need, each after its needs.
    A module the kernel has built in (``modules.builtin``) is left out."""
    found = {p.name[: -len(".ko")].replace("-", "_"): p for p in tree.glob("kernel/**/*.ko")}
    builtin = set()
    with contextlib.suppress(FileNotFoundError):
        builtin = {
            Path(line.strip()).name[: -len(".ko")].replace("-", "_")
            for line in (tree / "modules.builtin").read_text().splitlines()
            if line.strip()
        }
    order: list[tuple[str, bytes]] = []
    seen: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in seen or name in builtin:
            return
        if name in chain:
            raise GuestBuildError(f"modules depend on each other in a circle: {' -> '.join((*chain, name))}")
        path = found.get(name)
        if path is None:
            raise GuestBuildError(f"module {name} is neither in {tree} nor built into the kernel")
        data = path.read_bytes()
        for dep in ",".join(modinfo(data).get("depends", [])).split(","):
            if dep:
                visit(dep.replace("-", "_"), (*chain, name))
        seen.add(name)
        order.append((str(path.relative_to(tree)), data))

    for name in wanted:
        visit(name, ())
    return order


# -- the initramfs


class _Cpio:
    """A newc cpio archive (what the kernel unpacks into its rootfs), written entry by entry."""

    def __init__(self, out: io.BufferedIOBase) -> None:
        self.out, self.ino = out, 0

    def add(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        self.ino += 1
        self._entry(self.ino, name, mode, data, rdev)

    def _entry(
        self, ino: int, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
    ) -> None:
        encoded = name.encode() + b"\0"
        fields = (
            ino,
            mode,
            0,
            0,
            2 if stat.S_ISDIR(mode) else 1,
            0,
            len(data),
            0,
            0,
            rdev[0],
            rdev[1],
            len(encoded),
            0,
        )
        header = b"070701" + b"".join(b"%08x" % v for v in fields) + encoded
        self.out.write(header + b"\0" * (-len(header) % 4) + data + b"\0" * (-len(data) % 4))

    def dir(self, name: str, perm: int = 0o755) -> None:
        self.add(name, stat.S_IFDIR | perm)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self.add(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self.add(name, stat.S_IFLNK | 0o777, target.encode())

    def close(self) -> None:
        self._entry(0, "TRAILER!!!", 0)


def _applets(busybox: Path) -> list[str]:
    """The applets' paths (``bin/sh``, ``usr/bin/head``, ...): all the package's busybox has where it runs
    here, else APPLETS in ``bin``."""
    try:
        done = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        done = None
    listed = (
        [line.strip() for line in done.stdout.splitlines() if line.strip()]
        if done and done.returncode == 0
        else []
    )
    names = {path.rsplit("/", 1)[-1] for path in listed}
    if not listed or not set(APPLETS) <= names:
        return [f"bin/{applet}" for applet in APPLETS]
    return [path for path in listed if path != "bin/busybox"]


def _initramfs(
    out: io.BufferedIOBase,
    agent: Path,
    busybox: Path,
    release: str,
    modules: list[tuple[str, bytes]],
    applets: list[str],
) -> None:
    cpio = _Cpio(out)
    for d in (
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "root",
        "etc",
        "bin",
        "sbin",
        "usr",
        "usr/bin",
        "usr/sbin",
        "workspace",
        "lib",
        "lib/modules",
        f"lib/modules/{release}",
    ):
        cpio.dir(d, 0o1777 if d == "tmp" else 0o700 if d == "root" else 0o755)
    cpio.add(
        "dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1)
    )  # init's stdio, before the agent mounts devtmpfs
    cpio.file("init", agent.read_bytes(), 0o755)
    cpio.file("bin/busybox", busybox.read_bytes(), 0o755)
    for path in applets:
        cpio.symlink(path, "/bin/busybox")
    cpio.file(
        "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    cpio.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    made = {f"lib/modules/{release}"}
    for rel, data in modules:
        parts = Path(rel).parts[:-1]
        for i in range(1, len(parts) + 1):
            d = f"lib/modules/{release}/" + "/".join(parts[:i])
            if d not in made:
                made.add(d)
                cpio.dir(d)
        cpio.file(f"lib/modules/{release}/{rel}", data)
    order = "".join(f"/lib/modules/{release}/{rel}\n" for rel, _ in modules)
    cpio.file("lib/modules/load.order", order.encode())
    cpio.close()
