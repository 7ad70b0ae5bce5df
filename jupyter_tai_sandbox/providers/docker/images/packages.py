"""Python packages in a session image, offline: wheels fetched on the host, installed by the image's Python.

``build-image --python --pip pandas pyarrow`` adds packages to the Python image without a registry and
without network inside the build:

1. the image's Python is asked its version and machine (a throwaway container, no network);
2. the host's pip downloads wheels for *that* Python and machine (``pip download --only-binary=:all:
   --python-version ... --platform manylinux_...``) into a cache folder, with pip's own wheel, so a
   second build with the same packages needs no index at all;
3. the wheels are copied into a container of the base image (no network), installed there by running
   pip straight from its wheel (``python3 pip-X.whl/pip install --no-index --find-links ...``),
   removed again, and the container is committed as the image.

The image carries the requirements and its base's id as labels: a build asking for the same packages
on the same base keeps the image as it is. Only wheels are installed: a package with no wheel for the
image's Python and machine is an :class:`ImageBuildError` saying so.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .build import DEFAULT_SUITE, ImageBuildError, build_python_image

#: labels of an image built here: its pip requirements (sorted, space separated) and its base image's id
LABEL_PIP = "jupyter-tai-sandbox.pip"
LABEL_BASE = "jupyter-tai-sandbox.base"
#: where the wheels go inside the build container (removed before the commit)
WHEELS_IN_IMAGE = "/tmp/tai-sandbox-wheels"
#: the image's config after the commit: the build container's own entrypoint must not stay
COMMIT_CHANGES = ["ENTRYPOINT []", 'CMD ["sh"]', "WORKDIR /workspace"]
_PROBE = (
    "import platform, sys; "
    "print(f'{sys.version_info[0]}.{sys.version_info[1]} {platform.machine()} {platform.libc_ver()[1]}')"
)


@dataclass(frozen=True)
class PythonTarget:
    """The Python an image runs: what its wheels must fit."""

    version: str  # "3.11"
    machine: str  # "x86_64", "aarch64"
    glibc: str  # "2.36"

    @property
    def tag(self) -> str:
        return f"cp{self.version.replace('.', '')}-{self.machine}"

    def pip_options(self) -> list[str]:
        """pip's options selecting wheels for this Python: every manylinux its glibc runs, newest first."""
        major, minor = (int(p) for p in self.glibc.split(".")[:2])
        platforms = (
            [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 16, -1)] if major == 2 else []
        )
        platforms += [
            f"manylinux2014_{self.machine}",
            f"manylinux2010_{self.machine}",
            f"manylinux1_{self.machine}",
        ]
        options = ["--only-binary=:all:", "--python-version", self.version, "--implementation", "cp"]
        for platform in platforms:
            options += ["--platform", platform]
        return options


def requirement_label(requirements: Sequence[str]) -> str:
    return " ".join(sorted({r.strip() for r in requirements if r.strip()}))


def wheel_cache(target: PythonTarget) -> Path:
    """The folder wheels for ``target`` are kept in ($XDG_CACHE_HOME or ~/.cache, per Python and machine)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "jupyter-tai-sandbox" / "wheels" / target.tag


def probe_python(client: Any, image: str) -> PythonTarget:
    """The version, machine and glibc of the Python in ``image``."""
    try:
        out = client.containers.run(
            image, ["python3", "-c", _PROBE], entrypoint=[], network_disabled=True, remove=True, user="0"
        )
    except Exception as e:  # docker.errors.ContainerError, APIError, ImageNotFound
        raise ImageBuildError(f"could not run python3 in {image} to learn its version: {e}") from e
    version, machine, glibc = out.decode().split()
    return PythonTarget(version, machine, glibc or "2.17")


def fetch_wheels(
    requirements: Sequence[str], target: PythonTarget, cache: Path, progress: Callable[[str], Any]
) -> None:
    """Wheels for ``requirements`` and pip itself into ``cache``: from the cache alone when it has them
    all, else from the package index the host's pip uses."""
    cache.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "-d", str(cache)]
    wanted = [*requirements, "pip"]
    offline = subprocess.run(
        [*base, "--no-index", "--find-links", str(cache), *target.pip_options(), *wanted],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if offline.returncode == 0:
        progress(f"wheels for {' '.join(requirements)}: all in the cache {cache}")
        return
    progress(
        f"pip download {' '.join(requirements)} for Python {target.version} on {target.machine} into {cache} ..."
    )
    online = subprocess.run(
        [*base, *target.pip_options(), *wanted], capture_output=True, text=True, check=False
    )
    if online.returncode != 0:
        tail = "\n".join(online.stderr.strip().splitlines()[-12:])
        raise ImageBuildError(
            f"pip could not fetch wheels of {' '.join(requirements)} for Python {target.version} on "
            f"{target.machine} (glibc {target.glibc}); build-image installs wheels only, so a package with no "
            f"such wheel cannot be added. pip said:\n{tail}"
        )


def _pip_wheel(cache: Path) -> str:
    wheels = sorted(cache.glob("pip-*.whl"))
    if not wheels:
        raise ImageBuildError(f"no wheel of pip in {cache}")
    return wheels[-1].name


def install_wheels(
    container: Any, requirements: Sequence[str], cache: Path, *, where: str, progress: Callable[[str], Any]
) -> None:
    """Install ``requirements`` from the wheels in ``cache`` in the running ``container`` (of the image
    ``where``, for messages), by pip run from its own wheel with no index; the wheels are removed again."""
    pip = f"{WHEELS_IN_IMAGE}/{_pip_wheel(cache)}/pip"
    install = [
        "python3", pip, "install", "--no-index", "--find-links", WHEELS_IN_IMAGE, "--break-system-packages",
        "--no-cache-dir", "--root-user-action=ignore", "--disable-pip-version-check", "--progress-bar=off",
        *requirements,
    ]  # fmt: skip
    with tempfile.TemporaryFile() as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(str(cache), arcname=WHEELS_IN_IMAGE.lstrip("/"))
        archive.seek(0)
        container.put_archive("/", archive)
    progress(f"pip install {' '.join(requirements)} in a container of {where} (no network) ...")
    status, output = container.exec_run(install, user="0")
    lines = output.decode(errors="replace").strip().splitlines()
    if status != 0:
        raise ImageBuildError(
            f"pip install of {' '.join(requirements)} in {where} failed (status {status}):\n"
            + "\n".join(lines[-15:])
        )
    for line in lines:
        if line.startswith("Successfully installed"):
            progress(f"  {line}")
    container.exec_run(["rm", "-rf", WHEELS_IN_IMAGE], user="0")


def add_packages(
    client: Any,
    base: str,
    name: str,
    requirements: Sequence[str],
    *,
    progress: Callable[[str], Any],
) -> str:
    """Commit ``base`` with ``requirements`` installed from wheels as ``name``; return the image id."""
    base_id = client.images.get(base).id
    target = probe_python(client, base)
    cache = wheel_cache(target)
    fetch_wheels(requirements, target, cache, progress)
    container = client.containers.create(
        base, ["sleep", "2147483647"], entrypoint=[], network_disabled=True, init=True
    )
    try:
        container.start()
        install_wheels(container, requirements, cache, where=base, progress=progress)
        container.stop(timeout=1)
        repository, tag = _split(name)
        changes = [
            *COMMIT_CHANGES,
            f'LABEL {LABEL_PIP}="{requirement_label(requirements)}"',
            f'LABEL {LABEL_BASE}="{base_id}"',
        ]
        image = container.commit(repository=repository, tag=tag, changes="\n".join(changes))
        return str(image.id)
    finally:
        with contextlib.suppress(Exception):
            container.remove(force=True)


def _split(name: str) -> tuple[str, str]:
    if ":" in name.rsplit("/", 1)[-1]:
        repository, _, tag = name.rpartition(":")
        return repository, tag
    return name, "latest"


def kept(client: Any, name: str, base: str, requirements: Sequence[str]) -> bool:
    """Whether ``name`` exists already with exactly these packages on this base."""
    try:
        labels = client.images.get(name).labels or {}
        base_id = client.images.get(base).id
    except Exception:  # docker.errors.ImageNotFound
        return False
    return labels.get(LABEL_PIP) == requirement_label(requirements) and labels.get(LABEL_BASE) == base_id


#: the Debian Python image without added packages, the base of those ``--pip`` builds (tag: the suite)
PYTHON_BASE_IMAGE = "jupyter-tai-sandbox/python-base"


def _docker_client(base_url: str | None) -> Any:
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the docker extra is missing
        raise ImageBuildError("the docker SDK is missing: pip install 'jupyter-tai-sandbox[docker]'") from e
    try:
        return docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
    except docker.errors.DockerException as e:
        raise ImageBuildError(
            f"cannot reach the Docker engine ({e}); is one running? (start one with: dockerd &)"
        ) from e


def ensure_python_base(
    client: Any,
    plain: str,
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    force: bool = False,
    progress: Callable[[str], Any] | None = None,
    base_url: str | None = None,
) -> str:
    """The name of the Debian Python image the ``--pip`` and ``--agents`` builds start from
    (``PYTHON_BASE_IMAGE:SUITE``): kept when it exists (unless ``force``), else the image ``plain`` when that
    is an earlier ``build-image --python`` with no packages added (tagged as the base), else built."""
    import docker.errors

    base = f"{PYTHON_BASE_IMAGE}:{suite}"
    try:
        client.images.get(base)
        have_base = not force
    except docker.errors.ImageNotFound:
        have_base = False
    if not have_base:
        found = None
        with contextlib.suppress(docker.errors.ImageNotFound):
            found = client.images.get(plain)
        if found is not None and not force and not (found.labels or {}).get(LABEL_PIP):
            found.tag(*base.rsplit(":", 1))  # an earlier `build-image --python` is the base
            if progress is not None:
                progress(f"{base}: the Debian image {plain} built earlier")
        else:
            build_python_image(
                base, suite=suite, mirror=mirror, force=True, progress=progress, base_url=base_url
            )
    return base


def build_with_packages(
    name: str,
    pip: Sequence[str],
    *,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    force: bool = False,
    progress: Callable[[str], Any] | None = None,
    base_url: str | None = None,
) -> str | None:
    """The Python image ``name``: the Debian one (kept as ``PYTHON_BASE_IMAGE:SUITE``, built when missing)
    with the pip requirements ``pip`` installed from wheels; its id, or None when it already holds exactly
    those on that base (kept). ``--force`` rebuilds the base too."""
    import docker.errors

    pip = list(pip)

    def say(line: str) -> None:
        if progress is not None:
            progress(line)

    client = _docker_client(base_url)
    try:
        base = ensure_python_base(
            client, name, suite=suite, mirror=mirror, force=force, progress=progress, base_url=base_url
        )
        if not force and kept(client, name, base, pip):
            say(f"{name} has {' '.join(pip)} on {base} already: kept (--force rebuilds it)")
            return None
        started = time.monotonic()
        image_id = add_packages(client, base, name, pip, progress=say)
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"the Docker engine refused a step of the build of {name}: {e}") from e
    finally:
        client.close()
    say(f"built {name} ({image_id[:19]}) with {' '.join(pip)} in {time.monotonic() - started:.0f} s")
    return image_id
