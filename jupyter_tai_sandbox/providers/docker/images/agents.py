"""The coding agents' session image, offline: Node.js from Debian and ACP agents from npm on the Python image.

``build-image --agents`` makes :data:`~jupyter_tai_sandbox.images.AGENTS_IMAGE` without a registry and without
network inside the build, the way ``--pip`` adds wheels (:mod:`.packages`):

1. the base is the Debian Python image ``jupyter-tai-sandbox/python-base:SUITE`` (built with debootstrap
   when missing, as ``--python`` does);
2. Debian's ``nodejs`` (bookworm: 18.x) and ``ca-certificates`` are fetched as ``.deb`` files ON THIS
   MACHINE: the base's root filesystem is exported into a temporary folder and ``apt-get install
   --download-only`` runs there (chroot, the base's own apt sources, so the files fit exactly the packages
   the base has); they are kept in a cache folder, so a second build needs no mirror;
3. the npm packages are installed ON THIS MACHINE with its ``npm`` (``npm install --omit=dev
   --ignore-scripts --os linux --cpu ARCH --prefix CACHE``), in a cache folder per package set;
4. a container of the base with no network gets the ``.deb`` files (``dpkg -i``), the npm tree as
   ``/opt/tai-agents`` (each package's commands linked into ``/usr/local/bin``) and the wheels of the
   ``--pip`` requirements; the files brought in are removed and the container is committed.

The image carries its inputs as labels (npm packages, Debian packages, pip requirements, the base's id and
this recipe's version): a build with the same inputs on the same base keeps the image as it is.
npm install scripts are not run (they would run here, with this machine's node, as this user); a package
that needs one to work, or a native addon built for another node, is not supported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ....images import AGENTS_IMAGE, PYTHON_IMAGE
from .build import DEFAULT_SUITE, ImageBuildError, apt_in_root, tempfile_dir
from .packages import (
    COMMIT_CHANGES,
    LABEL_BASE,
    LABEL_PIP,
    _docker_client,
    _split,
    ensure_python_base,
    fetch_wheels,
    install_wheels,
    probe_python,
    requirement_label,
    wheel_cache,
)

#: the agents every ``build-image --agents`` installs (pinned; ``--npm`` adds others or re-pins one)
DEFAULT_AGENT_PACKAGES = ("@zed-industries/claude-code-acp@0.16.2", "@zed-industries/codex-acp@0.16.0")
#: Debian's packages the agents need: node, and the CA roots its TLS uses (Debian's node uses the system's)
AGENT_DEB_PACKAGES = ("nodejs", "ca-certificates")
#: where the npm tree lives in the image (its packages' commands are linked into /usr/local/bin)
AGENTS_PREFIX = "/opt/tai-agents"
#: labels of the agents image: its npm packages and Debian packages (sorted, space separated), and the recipe
LABEL_NPM = "jupyter-tai-sandbox.npm"
LABEL_DEB = "jupyter-tai-sandbox.deb"
LABEL_RECIPE = "jupyter-tai-sandbox.recipe"
#: this recipe's version: a change to how the image is made changes it, so an older build is not kept
RECIPE = "agents-1"
#: where the .deb files go inside the build container (removed before the commit)
DEBS_IN_IMAGE = "/tmp/tai-sandbox-debs"
#: node's name for a machine (npm's --cpu)
_NODE_CPU = {"x86_64": "x64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64", "s390x": "s390x"}
_COMPLETE = ".tai-sandbox-complete"


def npm_name(spec: str) -> str:
    """The package a registry spec names: ``@scope/name@1.2`` -> ``@scope/name``, ``name@^1`` -> ``name``
    (anything else, a URL or a path, is its own name)."""
    match = re.fullmatch(r"(@[^/@\s]+/[^/@\s]+|[^/@\s]+)(?:@\S*)?", spec.strip())
    return match.group(1) if match else spec.strip()


def agent_packages(extra: Iterable[str] = ()) -> list[str]:
    """The default agents with ``extra`` added; an extra naming a default package replaces its pin."""
    wanted: dict[str, str] = {npm_name(p): p for p in DEFAULT_AGENT_PACKAGES}
    for spec in extra:
        if spec.strip():
            wanted[npm_name(spec)] = spec.strip()
    return sorted(wanted.values())


def _cache_root() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "jupyter-tai-sandbox"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _say(progress: Callable[[str], Any] | None, line: str) -> None:
    if progress is not None:
        progress(line)


# ------------------------------------------------------------ npm, on this machine


def npm_tree(packages: Sequence[str], machine: str, progress: Callable[[str], Any]) -> Path:
    """A folder with ``node_modules`` holding ``packages`` for Linux on ``machine`` (the image's): the cached
    one when an earlier build made it, else made now with this machine's npm."""
    cpu = _NODE_CPU.get(machine, machine)
    prefix = _cache_root() / "npm" / f"linux-{cpu}-{_digest(*packages)}"
    marker = prefix / _COMPLETE
    if marker.is_file() and marker.read_text() == "\n".join(packages):
        progress(f"npm packages {' '.join(packages)}: in the cache {prefix}")
        return prefix
    npm = shutil.which("npm")
    if npm is None:
        raise ImageBuildError(
            "npm is missing: build-image --agents installs the agents with this machine's npm "
            "(Debian: apt-get install npm; or Node.js from nodejs.org)"
        )
    # installed beside it, then renamed: a build running at the same time never sees half a tree
    prefix.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{prefix.name}.", dir=prefix.parent))
    partial.chmod(0o755)
    try:
        (partial / "package.json").write_text('{"private": true}\n')
        progress(f"npm install {' '.join(packages)} for linux-{cpu} into {prefix} ...")
        done = subprocess.run(
            [
                npm, "install", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund",
                "--no-update-notifier", "--os", "linux", "--cpu", cpu, "--prefix", str(partial), *packages,
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise ImageBuildError(
                f"npm install of {' '.join(packages)} failed (status {done.returncode}):\n{tail}"
            )
        (partial / _COMPLETE).write_text("\n".join(packages))
        shutil.rmtree(prefix, ignore_errors=True)  # an unfinished tree of an interrupted build
        with contextlib.suppress(OSError):  # another build finished first: its tree is as good
            partial.rename(prefix)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return prefix


def npm_commands(prefix: Path) -> dict[str, str]:
    """The commands of the packages installed at ``prefix`` (its package.json's dependencies): name -> the
    file's path in the image, under :data:`AGENTS_PREFIX`."""
    top = json.loads((prefix / "package.json").read_text()).get("dependencies") or {}
    commands: dict[str, str] = {}
    for package in sorted(top):
        meta = json.loads((prefix / "node_modules" / package / "package.json").read_text())
        bins = meta.get("bin") or {}
        if isinstance(bins, str):
            bins = {package.rsplit("/", 1)[-1]: bins}
        for command, path in bins.items():
            if re.fullmatch(r"[A-Za-z0-9._-]+", command):
                relative = os.path.normpath(path)
                commands[command] = f"{AGENTS_PREFIX}/node_modules/{package}/{relative}"
    return commands


# ------------------------------------------------------------ Debian packages, on this machine


def _export_root(client: Any, base: str, root: str) -> None:
    """The root filesystem of ``base`` unpacked into ``root`` (for a chroot)."""
    container = client.containers.create(base, ["true"], entrypoint=[], network_disabled=True)
    try:
        untar = subprocess.Popen(
            ["tar", "-x", "--numeric-owner", "-C", root, "-f", "-"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert untar.stdin is not None
        try:
            for chunk in container.export():
                untar.stdin.write(chunk)
        finally:
            untar.stdin.close()
        if untar.wait() != 0:
            assert untar.stderr is not None
            raise ImageBuildError(f"unpacking {base}'s files failed: {untar.stderr.read().decode()[-500:]}")
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def fetch_debs(
    client: Any,
    base: str,
    base_id: str,
    packages: Sequence[str],
    *,
    machine: str,
    suite: str,
    mirror: str | None,
    progress: Callable[[str], Any],
) -> tuple[Path, list[str]]:
    """The ``.deb`` files installing ``packages`` on ``base``: their folder and names. From the cache when an
    earlier build on the same base fetched them, else by ``apt-get install --download-only`` in a chroot of
    the base's files (the base's apt sources, or ``mirror``)."""
    cache = _cache_root() / "debs" / f"{suite}-{machine}"
    manifest = cache / f"{_digest(base_id, *packages, mirror or '')}.list"
    if manifest.is_file():
        names = manifest.read_text().split()
        if all((cache / n).is_file() for n in names):
            progress(f"Debian packages {' '.join(packages)}: in the cache {cache}")
            return cache, names
    if os.geteuid() != 0:
        raise ImageBuildError(
            "fetching Debian's nodejs needs root (a chroot): run build-image --agents as root"
        )
    if shutil.which("chroot") is None:
        raise ImageBuildError("chroot is missing (Debian: apt-get install coreutils)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile_dir() as root:
        progress(f"apt-get install --download-only {' '.join(packages)} in a chroot of {base}'s files ...")
        _export_root(client, base, root)
        null = os.path.join(root, "dev/null")
        if not os.path.exists(null):
            with contextlib.suppress(OSError):
                os.mknod(null, 0o20666, os.makedev(1, 3))
        if mirror:
            with open(os.path.join(root, "etc/apt/sources.list"), "w", encoding="utf-8") as f:
                f.write(f"deb {mirror} {suite} main\n")
        archives = os.path.join(root, "var/cache/apt/archives")
        os.makedirs(os.path.join(archives, "partial"), exist_ok=True)
        apt_in_root(root, packages, progress, download_only=True)
        names = sorted(n for n in os.listdir(archives) if n.endswith(".deb"))
        if not names:
            raise ImageBuildError(f"apt-get fetched no package of {' '.join(packages)} for {base}")
        for n in names:
            shutil.copyfile(os.path.join(archives, n), cache / n)
    manifest.write_text("\n".join(names) + "\n")
    progress(f"  {len(names)} Debian packages into {cache}")
    return cache, names


# ------------------------------------------------------------ the image


def agents_labels(packages: Sequence[str], pip: Sequence[str], base_id: str) -> dict[str, str]:
    """The labels an agents image built from these inputs carries."""
    return {
        LABEL_NPM: " ".join(sorted(packages)),
        LABEL_DEB: " ".join(sorted(AGENT_DEB_PACKAGES)),
        LABEL_PIP: requirement_label(pip),
        LABEL_BASE: base_id,
        LABEL_RECIPE: RECIPE,
    }


@contextlib.contextmanager
def _tar_of(add: Callable[[tarfile.TarFile], None]) -> Iterator[Any]:
    with tempfile.TemporaryFile() as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            add(tar)
        archive.seek(0)
        yield archive


def _copied(cpu: str) -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    """The tar filter of the files copied into the image: owned by root, without the cache's marker and
    without the binaries packages vendor for other systems (claude-agent-sdk's ripgrep for macOS, Windows
    and other machines: some 50 MB)."""
    other_system = re.compile(
        rf"/vendor/ripgrep/(?!{re.escape(cpu)}-linux(?:/|$))[^/]+-(?:darwin|linux|win32)(?:/|$)"
    )

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.name.rsplit("/", 1)[-1] == _COMPLETE or other_system.search(info.name):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        # readable (and folders searchable) by every user: a session may run as DockerSandbox.user
        info.mode |= 0o555 if info.isdir() else 0o444
        return info

    return keep


def _run(container: Any, argv: list[str], what: str) -> str:
    status, output = container.exec_run(argv, user="0", environment={"DEBIAN_FRONTEND": "noninteractive"})
    text = output.decode(errors="replace")
    if status != 0:
        raise ImageBuildError(
            f"{what} failed (status {status}):\n" + "\n".join(text.strip().splitlines()[-15:])
        )
    return text


def build_agents_image(
    name: str = AGENTS_IMAGE,
    npm: Sequence[str] = (),
    pip: Sequence[str] = (),
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    force: bool = False,
    progress: Callable[[str], Any] | None = None,
    base_url: str | None = None,
) -> str | None:
    """The agents image ``name``: :data:`DEFAULT_AGENT_PACKAGES` and the npm packages ``npm`` (an entry naming
    a default package re-pins it), Debian's Node.js, and the pip requirements ``pip``, on the Debian Python
    base; its id, or None when ``name`` holds exactly these inputs on that base already (kept). ``force``
    rebuilds the agents image (not the base, which the Python image shares: ``build-image --python
    --force`` rebuilds that)."""
    import docker.errors

    packages = agent_packages(npm)
    pip = [r.strip() for r in pip if r.strip()]

    def say(line: str) -> None:
        _say(progress, line)

    client = _docker_client(base_url)
    started = time.monotonic()
    try:
        base = ensure_python_base(
            client, PYTHON_IMAGE, suite=suite, mirror=mirror, progress=progress, base_url=base_url
        )
        base_id = client.images.get(base).id
        wanted = agents_labels(packages, pip, base_id)
        previous = None
        with contextlib.suppress(docker.errors.ImageNotFound):
            previous = client.images.get(name)
        if previous is not None and not force:
            labels = previous.labels or {}
            if all(labels.get(k) == v for k, v in wanted.items()):
                inputs = " ".join([*packages, *pip])
                say(f"{name} has {inputs} on {base} already: kept (--force rebuilds it)")
                return None
        target = probe_python(client, base)
        tree = npm_tree(packages, target.machine, say)
        debs, deb_names = fetch_debs(
            client, base, base_id, AGENT_DEB_PACKAGES, machine=target.machine, suite=suite, mirror=mirror,
            progress=say,
        )  # fmt: skip
        commands = npm_commands(tree)
        wheels = None
        if pip:
            wheels = wheel_cache(target)
            fetch_wheels(pip, target, wheels, say)
        image_id = _assemble(
            client, base, name, debs, deb_names, tree, commands, pip, wheels, wanted, target.machine, say
        )
        if previous is not None and previous.id != image_id:
            # the old build lost its name: drop it unless a container still uses it
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(previous.id)
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"the Docker engine refused a step of the build of {name}: {e}") from e
    finally:
        client.close()
    say(
        f"built {name} ({image_id[:19]}) with {' '.join([*packages, *pip])} in {time.monotonic() - started:.0f} s"
    )
    return image_id


def _assemble(
    client: Any,
    base: str,
    name: str,
    debs: Path,
    deb_names: Sequence[str],
    tree: Path,
    commands: dict[str, str],
    pip: Sequence[str],
    wheels: Path | None,
    labels: dict[str, str],
    machine: str,
    say: Callable[[str], Any],
) -> str:
    """A container of ``base`` with no network gets the files, installs them, and is committed as ``name``."""
    container = client.containers.create(
        base, ["sleep", "2147483647"], entrypoint=[], network_disabled=True, init=True
    )
    copied = _copied(_NODE_CPU.get(machine, machine))
    try:

        def add_debs(tar: tarfile.TarFile) -> None:
            for n in deb_names:
                tar.add(str(debs / n), arcname=f"{DEBS_IN_IMAGE.lstrip('/')}/{n}", filter=copied)

        def add_tree(tar: tarfile.TarFile) -> None:
            tar.add(str(tree), arcname=AGENTS_PREFIX.lstrip("/"), filter=copied)

        for add in (add_debs, add_tree):
            with _tar_of(add) as archive:
                container.put_archive("/", archive)
        container.start()
        say(
            f"dpkg -i {' '.join(AGENT_DEB_PACKAGES)} ({len(deb_names)} packages) in a container of {base} (no network) ..."
        )
        _run(container, ["sh", "-c", f"dpkg -i {DEBS_IN_IMAGE}/*.deb >/dev/null"], "dpkg -i of Node.js")
        version = _run(container, ["node", "--version"], "node --version").strip()
        links = " && ".join(
            f"chmod 755 {target} && ln -sf {target} /usr/local/bin/{command}"
            for command, target in commands.items()
        )
        if links:
            _run(container, ["sh", "-c", links], "linking the agents' commands")
        say(f"  node {version}; commands: {' '.join(sorted(commands)) or 'none'} (in /usr/local/bin)")
        if pip and wheels is not None:
            install_wheels(container, pip, wheels, where=base, progress=say)
        _run(
            container,
            [
                "sh",
                "-c",
                f"rm -rf {DEBS_IN_IMAGE} /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /root/.npm",
            ],
            "removing the build's files",
        )
        container.stop(timeout=1)
        repository, tag = _split(name)
        changes = [*COMMIT_CHANGES, *(f'LABEL {k}="{v}"' for k, v in labels.items())]
        image = container.commit(repository=repository, tag=tag, changes="\n".join(changes))
        return str(image.id)
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)
