"""The Python session image: what `build-image --python --pip` adds, that the docker provider uses it by
default, and that README's Dockerfile makes the same image."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets

import docker.errors
import pytest

from jupyter_tai_sandbox import cli
from jupyter_tai_sandbox.contract import SessionSpec
from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.providers.docker.images.build import (
    _CHANGES,
    BASE_PACKAGES,
    DEFAULT_IMAGE,
    PYTHON_IMAGE,
    PYTHON_PACKAGES,
)
from jupyter_tai_sandbox.providers.docker.images.packages import (
    LABEL_BASE,
    LABEL_PIP,
    PYTHON_BASE_IMAGE,
    WHEELS_IN_IMAGE,
    build_with_packages,
)
from tests.support import REPO
from tests.support.docker import RUN_LABEL, docker_client, in_ci

pytestmark = [pytest.mark.docker]

DOCKERFILE = (
    REPO / "jupyter_tai_sandbox" / "providers" / "docker" / "images" / "dockerfiles" / "python.Dockerfile"
)
BASE = f"{PYTHON_BASE_IMAGE}:bookworm"


def _need(client, image: str, how: str) -> None:
    try:
        client.images.get(image)
    except Exception:
        if in_ci():
            pytest.fail(f"{image} is missing: {how} (bash .ci/docker-up builds it)")
        pytest.skip(f"{image} is missing: {how}")


def test_the_dockerfile_makes_what_build_image_makes():
    text = DOCKERFILE.read_text()
    installs = re.findall(r"apt-get install -y --no-install-recommends ([^;]+);", text)
    assert set(installs[0].split()) == {*BASE_PACKAGES, *PYTHON_PACKAGES}
    assert f"docker build -t {PYTHON_IMAGE} " in text  # the tag build-image gives it
    assert not re.search(r"^USER\b", text, re.M)  # root, as the imported image (the provider drops caps)
    assert re.search(r"^FROM debian:bookworm$", text, re.M)  # the suite build-image debootstraps
    for change in _CHANGES:
        assert re.search(rf"^{re.escape(change)}$", text, re.M), change
    assert (
        'ARG PIP=""' in text and "--only-binary=:all: $PIP" in text
    )  # build-image --pip installs wheels only


def test_the_built_python_image_has_the_dockerfiles_config():
    client = docker_client()
    _need(client, PYTHON_IMAGE, "jupyter tai-sandbox build-image --python")
    config = client.images.get(PYTHON_IMAGE).attrs["Config"]
    assert config["Cmd"] == ["sh"] and not config.get("Entrypoint")
    assert config["WorkingDir"] == "/workspace" and not config.get("User")
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in config["Env"]


def test_pip_without_python_says_to_add_it(capsys):
    assert cli.main(["build-image", "--pip", "six"]) == 2
    assert "--pip adds packages to the Python image: add --python" in capsys.readouterr().err


def test_pip_packages_are_installed_from_cached_wheels_with_no_network(tmp_path, monkeypatch):
    client = docker_client()
    _need(client, BASE, "jupyter tai-sandbox build-image --python")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    names = [f"tai-sandbox-test/python-six:{secrets.token_hex(4)}" for _ in range(2)]
    said: list[str] = []
    try:
        first = build_with_packages(names[0], ["six"], progress=said.append)
        assert first is not None
        image = client.images.get(names[0])
        assert image.labels[LABEL_PIP] == "six" and image.labels[LABEL_BASE] == client.images.get(BASE).id
        assert image.attrs["Config"]["Cmd"] == ["sh"] and not image.attrs["Config"].get("Entrypoint")
        assert not image.attrs["Config"].get("User")  # the base's user, not the build container's
        out = client.containers.run(
            names[0],
            ["python3", "-c", f"import six, os; print(six.__name__, os.path.exists('{WHEELS_IN_IMAGE}'))"],
            network_disabled=True,
            remove=True,
        )
        assert out == b"six False\n"  # installed, and the wheels are not left in the image
        cache = tmp_path / "cache" / "jupyter-tai-sandbox" / "wheels"
        [folder] = cache.iterdir()
        assert re.fullmatch(r"cp3\d+-\w+", folder.name), folder.name
        assert any(p.name.startswith("six-") for p in folder.iterdir())
        assert any(p.name.startswith("pip-") for p in folder.iterdir())

        # the same packages on the same base: kept as they are
        said.clear()
        assert build_with_packages(names[0], ["six"], progress=said.append) is None
        assert any("kept" in line for line in said), said

        # another image with the same packages takes every wheel from the cache
        said.clear()
        assert build_with_packages(names[1], ["six"], progress=said.append) is not None
        assert any("all in the cache" in line for line in said), said
    finally:
        for name in names:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name, force=True)


def test_a_package_with_no_wheel_is_refused_saying_so(tmp_path, monkeypatch, capsys):
    client = docker_client()
    _need(client, BASE, "jupyter tai-sandbox build-image --python")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    name = f"tai-sandbox-test/python-none:{secrets.token_hex(4)}"
    # no such version exists, so no wheel of it either: pip's own words come back with ours
    status = cli.main(["build-image", "--python", "--name", name, "--pip", "six==0.0.0.404"])
    err = capsys.readouterr().err
    assert status == 1
    assert "build-image installs wheels only" in err and "six==0.0.0.404" in err
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(name)


def test_docker_sessions_use_the_python_image_by_default_when_it_is_built():
    client = docker_client()
    _need(client, PYTHON_IMAGE, "jupyter tai-sandbox build-image --python")

    async def main() -> None:
        sandbox = DockerSandbox(extra_labels=RUN_LABEL)
        try:
            assert (
                sandbox.image == ""
                and sandbox.image_allowed(PYTHON_IMAGE)
                and sandbox.image_allowed(DEFAULT_IMAGE)
            )
            assert not sandbox.image_allowed("debian:bookworm")
            session = await sandbox.create(SessionSpec(consumer="default-image"))
            try:
                assert (await session.info()).image == PYTHON_IMAGE  # info() says which image runs
                result = await session.exec(["python3", "-c", "print(2 + 2)"], timeout_seconds=30)
                assert (result.exit_code, result.stdout) == (0, b"4\n")
            finally:
                await session.destroy()
        finally:
            await sandbox.close()
        pinned = DockerSandbox(image=DEFAULT_IMAGE, extra_labels=RUN_LABEL)
        assert pinned.default_image == DEFAULT_IMAGE and not pinned.image_allowed(PYTHON_IMAGE)
        await pinned.close()

    asyncio.run(main())
