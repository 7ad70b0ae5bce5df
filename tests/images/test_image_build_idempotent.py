"""Building an unchanged image again leaves it alone: `jupyter tai-sandbox build-image` and `.ci/docker-up`
keep the image (same id, same Created), so its tag never moves on a shared engine."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_tai_sandbox.images import AGENTS_IMAGE
from jupyter_tai_sandbox.providers.docker.images.build import DEFAULT_IMAGE, LABEL_ROOTFS, PYTHON_IMAGE
from tests.support import REPO

pytestmark = [pytest.mark.docker]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    jupyter = Path(sys.executable).parent / "jupyter"
    return subprocess.run([str(jupyter), "tai-sandbox", *args], capture_output=True, text=True, timeout=120)


def _identity(client, name: str) -> tuple[str, str]:
    image = client.api.inspect_image(name)
    return image["Id"], image["Created"]


def test_build_image_twice_keeps_the_unchanged_image_and_its_tag():
    from tests.support.docker import docker_client

    client = docker_client()
    name = f"jupyter-tai-sandbox/minimal:test-idempotent-{secrets.token_hex(4)}"
    try:
        first = _cli("build-image", "--name", name)
        assert first.returncode == 0 and first.stdout.startswith(f"built {name} "), first
        built = _identity(client, name)
        assert client.api.inspect_image(name)["Config"]["Labels"][LABEL_ROOTFS]

        again = _cli("build-image", "--name", name)
        assert again.returncode == 0, again
        assert again.stdout == f"{name} ({built[0][:19]}) is up to date: kept (--force rebuilds it)\n"
        assert _identity(client, name) == built

        forced = _cli("build-image", "--name", name, "--force")
        assert forced.returncode == 0 and forced.stdout.startswith(f"built {name} "), forced
        assert _identity(client, name)[0] != built[0]
        with pytest.raises(Exception, match="No such image"):
            client.api.inspect_image(built[0])  # the replaced build lost its name and was dropped
    finally:
        client.images.remove(name, force=True)


def test_docker_up_run_again_rebuilds_and_retags_nothing():
    from tests.support.docker import docker_client

    client = docker_client()
    subprocess.run(["bash", str(REPO / ".ci" / "docker-up")], check=True, capture_output=True, timeout=1200)
    before = {name: _identity(client, name) for name in (DEFAULT_IMAGE, PYTHON_IMAGE, AGENTS_IMAGE)}
    again = subprocess.run(
        ["bash", str(REPO / ".ci" / "docker-up")], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert "is up to date: kept" in again.stdout and "already: kept" in again.stdout, again.stdout
    assert {name: _identity(client, name) for name in (DEFAULT_IMAGE, PYTHON_IMAGE, AGENTS_IMAGE)} == before
