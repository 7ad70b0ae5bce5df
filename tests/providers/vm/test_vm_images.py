"""vm sessions of a docker image: the image's files as the session's root (a read-only disk made once per image
id, a writable overlay per session), its env, the workspace bound in; forks and a second server keep it.

Real QEMU microVMs under TCG and a real Docker engine (the image's files come from it); see
tests/support/vm.py and tests/support/docker.py for skip/fail rules.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_tai_sandbox.contract import SandboxRequestError, SandboxSpecRejectedError, SessionSpec
from jupyter_tai_sandbox.providers.vm import VmSandbox
from jupyter_tai_sandbox.providers.vm.guest.build import cache_dir
from jupyter_tai_sandbox.providers.vm.guest.rootdisk import roots_dir
from tests.support import RUN_ID
from tests.support.docker import RUN_LABEL, TEST_IMAGE, docker_client
from tests.support.vm import need_qemu

pytestmark = [pytest.mark.docker, pytest.mark.slow(40), pytest.mark.timeout(300)]

NONE = {"network": "none"}


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The test image (busybox) with a file and an ENV of its own, as an image of this run."""
    need_qemu()
    client = docker_client()
    container = client.containers.create(TEST_IMAGE, command=["true"], labels=RUN_LABEL)
    try:
        exported = b"".join(container.export())
    finally:
        container.remove(force=True)
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(exported)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        marker = b"from the image\n"
        info = tarfile.TarInfo("etc/marker")
        info.size, info.mode = len(marker), 0o644
        dst.addfile(info, io.BytesIO(marker))
        node = tarfile.TarInfo("opt/null")  # a hostile image's device node, open to all (here: /dev/null's)
        node.type, node.devmajor, node.devminor, node.mode = tarfile.CHRTYPE, 1, 3, 0o666
        dst.addfile(node)
    ((key, value),) = RUN_LABEL.items()
    tag = f"tai-sbx-test/vm-root:{RUN_ID}".lower()
    subprocess.run(
        [
            "docker",
            "import",
            "--change",
            f"LABEL {key}={value}",
            "--change",
            "ENV IMAGE_SAYS=hello",
            "--change",
            "ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            "-",
            tag,
        ],
        input=out.getvalue(),
        check=True,
        capture_output=True,
    )
    image_id = client.images.get(tag).id.split(":", 1)[1]
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    for disk in roots_dir().glob(f"{image_id[:32]}.img"):  # the golden snapshots restored with it too
        restored_with = hashlib.sha256(str(disk).encode()).hexdigest()[:12]
        for made in cache_dir().glob(f"*/golden*-r{restored_with}*"):
            made.unlink()
    for made in roots_dir().glob(f"{image_id[:32]}.*"):
        made.unlink()
    client.close()


@pytest.fixture
def state_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tai-vmi-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def out(session, script: str) -> str:
    result = await session.exec(["sh", "-c", script], timeout_seconds=60)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def test_a_session_of_an_image_runs_in_its_files_with_its_env_and_keeps_its_writes_to_itself(
    image, state_dir
):
    async def main():
        sandbox = VmSandbox(accel="tcg", state_dir=state_dir, deployment="vm-image-tests", images=[image])
        other_server = VmSandbox(
            accel="tcg", state_dir=state_dir, deployment="vm-image-tests", images=[image]
        )
        sessions = []
        try:
            first = await sandbox.create(SessionSpec(image=image, ttl_seconds=600, **NONE))
            sessions.append(first)
            assert (await first.info()).spec.image == image
            # the image's files and env, the workspace as its cwd, the guest's user
            assert (await out(first, "cat /etc/marker; echo $IMAGE_SAYS; pwd; id -u")).split() == [
                "from",
                "the",
                "image",
                "hello",
                "/workspace",
                "1000",
            ]
            with pytest.raises(SandboxRequestError, match="no such program"):
                await first.exec(["python3", "-V"], timeout_seconds=30)  # not in this image
            # the image's files open no device node and honour no setuid bit; nor does the workspace
            assert (await first.exec(["sh", "-c", "echo x > /opt/null"], timeout_seconds=30)).exit_code != 0
            mounts = await out(first, "cat /proc/mounts")
            for where in ("/", "/workspace"):  # as the chrooted command sees them
                line = next(m for m in mounts.splitlines() if m.split()[1] == where)
                assert {"nosuid", "nodev"} <= set(line.split()[3].split(",")), line
            await first.put_file("in.txt", b"uploaded")
            assert await out(first, "cat /workspace/in.txt") == "uploaded"
            await out(first, "echo overlay > /tmp/kept && mkdir -p /tmp/d")  # the session's own layer

            disks = sorted(roots_dir().glob("*.img"))
            second = await sandbox.create(SessionSpec(image=image, **NONE))
            sessions.append(second)
            assert sorted(roots_dir().glob("*.img")) == disks  # made once per image id
            assert (await second.exec(["cat", "/tmp/kept"], timeout_seconds=30)).exit_code != 0

            copy = await first.fork()
            sessions.append(copy)
            assert (await out(copy, "cat /tmp/kept /workspace/in.txt; echo; echo $IMAGE_SAYS")).split() == [
                "overlay",
                "uploaded",
                "hello",
            ]

            found = await other_server.get(first.id)  # a restarted server finds it as it was made
            assert (await out(found, "cat /etc/marker")).strip() == "from the image"
        finally:
            for session in reversed(sessions):
                await session.destroy()
            await sandbox.close()
            await other_server.close()

    asyncio.run(main())


def test_an_image_not_listed_or_not_on_the_engine_is_refused(image, state_dir):
    async def main():
        sandbox = VmSandbox(
            accel="tcg",
            state_dir=state_dir,
            deployment="vm-image-tests",
            images=[image, "tai-sbx-test/absent:nowhere"],
        )
        try:
            assert sandbox.image_allowed(image) and not sandbox.image_allowed("python:3.11")
            with pytest.raises(SandboxSpecRejectedError, match="not one of"):
                await sandbox.create(SessionSpec(image="python:3.11", **NONE))
            with pytest.raises(SandboxSpecRejectedError, match="not on the Docker engine"):
                await sandbox.create(SessionSpec(image="tai-sbx-test/absent:nowhere", **NONE))
            assert await sandbox.list() == []
        finally:
            await sandbox.close()

    asyncio.run(main())


def test_the_reap_removes_a_root_disk_left_unused_not_one_a_vm_has_open(image, state_dir):
    async def main():
        sandbox = VmSandbox(
            accel="tcg",
            state_dir=state_dir,
            deployment="vm-image-tests",
            images=[image],
            root_disk_idle_seconds=3600,
        )
        session = await sandbox.create(SessionSpec(image=image, **NONE))
        try:
            disk = Path(sandbox._machines.read(session.id)["shape"]["root"])
            saved_with = hashlib.sha256(str(disk).encode()).hexdigest()[:12]
            assert list(cache_dir().glob(f"*/golden*-r{saved_with}*.state"))
            long_ago = time.time() - 2 * 3600
            os.utime(disk, (long_ago, long_ago))
            await sandbox.reap()
            assert disk.exists()  # its VM has it open
            await session.destroy()
            await sandbox.reap()
            assert not disk.exists() and not list(cache_dir().glob(f"*/golden*-r{saved_with}*"))
            again = await sandbox.create(SessionSpec(image=image, **NONE))  # made anew
            assert (await out(again, "cat /etc/marker")).strip() == "from the image"
            await again.destroy()
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_persistent_workspace_in_an_image_session_is_found_beside_the_root_disk(image, state_dir):
    """Two disks attached (the image's root, the workspace): each is found by its serial, not its order."""

    async def main():
        sandbox = VmSandbox(accel="tcg", state_dir=state_dir, deployment="vm-image-tests", images=[image])
        spec = {"durability": "persistent", "workspace_key": f"kept-{RUN_ID}", **NONE}
        try:
            first = await sandbox.create(SessionSpec(image=image, **spec))
            await out(first, "echo kept > f")
            assert (await out(first, "cat /etc/marker")).strip() == "from the image"
            await first.destroy()
            again = await sandbox.create(SessionSpec(**spec))  # the package's own guest, the same workspace
            assert (await out(again, "cat f")).strip() == "kept"
            await again.destroy(remove_workspace=True)
        finally:
            await sandbox.close()

    asyncio.run(main())
