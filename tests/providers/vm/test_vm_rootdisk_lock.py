"""The lock that lets one process of the host make an image's root disk: a wait for another maker is
bounded, and a waiter finds the disk the other made instead of making it again (no QEMU needed)."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest

from jupyter_tai_sandbox.contract import SandboxUnavailableError
from jupyter_tai_sandbox.providers.vm.guest import rootdisk

NO_ENGINE = None  # the engine is never reached: the disk is made by the lock's holder, or not at all


def _hold(path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_root_disk_lock_held_past_the_build_time_is_a_typed_error_not_a_hang(tmp_path, monkeypatch):
    target = tmp_path / "abc.img"
    holder = _hold(target.with_suffix(".lock"))
    monkeypatch.setattr(rootdisk, "BUILD_SECONDS", 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxUnavailableError, match="another process has been making the root disk"):
            rootdisk._make_locked(NO_ENGINE, "sha256:abc", target, {})
    finally:
        os.close(holder)
    assert time.monotonic() - started < 10
    assert not target.exists()


def test_a_waiter_finds_the_root_disk_the_lock_holder_made(tmp_path):
    target = tmp_path / "abc.img"
    holder = _hold(target.with_suffix(".lock"))

    def make_then_release() -> None:
        time.sleep(0.5)
        target.write_bytes(b"made by the holder")
        os.close(holder)

    maker = threading.Thread(target=make_then_release)
    maker.start()
    rootdisk._make_locked(NO_ENGINE, "sha256:abc", target, {})
    maker.join()
    assert target.read_bytes() == b"made by the holder"
