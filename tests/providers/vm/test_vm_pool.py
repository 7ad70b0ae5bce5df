"""The vm provider's warm pool (VmSandbox.pool_size): a create of the pooled shape takes a restored, set-up guest
and answers its first command at once; the session cannot tell it from a fresh one; the pool refills, idles
out, and leaves nothing behind a closed or a killed server.

Real QEMU microVMs under TCG; without QEMU and the guest the tests skip, and with ``CI=true`` they fail instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_tai_sandbox.contract import SandboxNotFoundError, SessionSpec
from jupyter_tai_sandbox.providers.vm import VmSandbox
from tests.support.vm import need_qemu

pytestmark = [pytest.mark.slow(60), pytest.mark.timeout(180)]

NONE = {"network": "none"}
#: what a session can see of its guest: the same for a pooled one and a fresh one
LOOK = "hostname; uname -r; id; pwd; stat -c '%u:%g %a' .; grep ' /workspace ' /proc/mounts; echo $GREETING"
#: what must differ between two guests: the RNG's bytes; and the guest's clock, the host's at the claim
OWN = "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s"


@pytest.fixture(scope="module", autouse=True)
def qemu() -> None:
    need_qemu()


@pytest.fixture
def state_dir() -> Iterator[str]:
    """A short folder of the test's own; the test fails when a VM of it is left running."""
    path = tempfile.mkdtemp(prefix="tai-vmp-", dir="/tmp")
    yield path
    left = _running_qemus(path)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
    assert not left, "a VM of the test was left running"


def _running_qemus(path: str) -> list[int]:
    found = []
    for pidfile in Path(path).glob("*/sessions/*/qemu.pid"):
        pid = int(pidfile.read_text())
        try:
            if f"{pidfile.parent}/agent.sock".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def provider(state_dir: str, **traits) -> VmSandbox:
    return VmSandbox(accel="tcg", state_dir=state_dir, deployment="vm-pool-tests", **traits)


async def stdout_of(session, script: str) -> str:
    result = await session.exec(["sh", "-c", script], timeout_seconds=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def test_a_create_takes_a_pooled_guest_the_session_cannot_tell_and_the_pool_refills(state_dir):
    async def main():
        pooled = provider(state_dir, pool_size=2)
        fresh = provider(state_dir)  # another server of the deployment, without a pool
        sessions = []
        try:
            await pooled._pool.full()
            waiting = set(pooled._machines.ids())
            assert len(waiting) == 2
            # the pool's guests are no sessions: no server lists, gets or reaps them
            assert await pooled.list() == [] and await fresh.list() == []
            with pytest.raises(SandboxNotFoundError):
                await fresh.get(next(iter(waiting)))
            assert await fresh.reap() == [] and await pooled.reap() == []
            assert set(pooled._machines.ids()) == waiting

            spec = SessionSpec(env={"GREETING": "hi"}, owner="alice", ttl_seconds=600, **NONE)
            started = time.perf_counter()
            first = await pooled.create(spec)
            sessions.append(first)
            assert (await first.exec(["true"], timeout_seconds=30)).exit_code == 0
            took = time.perf_counter() - started
            second = await pooled.create(spec)
            sessions.append(second)
            assert {first.id, second.id} == waiting  # both from the pool
            cold = await fresh.create(spec)
            sessions.append(cold)
            assert cold.id not in waiting

            looks = [await stdout_of(s, LOOK) for s in (first, second, cold)]
            assert looks[0] == looks[1] == looks[2], looks  # hostname, kernel, user, cwd, workspace, env
            assert "uid=1000" in looks[0] and "/workspace" in looks[0] and looks[0].endswith("hi\n")
            owns = [(await stdout_of(s, OWN)).split() for s in (first, second, cold)]
            assert len({rng for rng, _ in owns}) == 3  # each its own RNG
            assert all(abs(int(clock) - time.time()) < 5 for _, clock in owns)  # the host's clock
            info = await first.info()
            assert (info.spec.owner, info.spec.ttl_seconds, dict(info.spec.env)) == (
                "alice",
                600,
                {"GREETING": "hi"},
            )
            assert sorted(i.id for i in await fresh.list()) == sorted(s.id for s in sessions)
            if os.geteuid() == 0:  # each QEMU a uid of its own (CI runs as root)
                uids = {
                    Path(f"/proc/{pooled._machines.pid(s.id)}/status").read_text().split("Uid:")[1].split()[0]
                    for s in sessions
                }
                assert len(uids) == 3

            # a spec the pool does not hold is created as before; the pool refills with new guests
            other = await pooled.create(SessionSpec(memory_mb=192, **NONE))
            sessions.append(other)
            assert other.id not in waiting
            await pooled._pool.full()
            refilled = set(pooled._machines.ids()) - {s.id for s in sessions}
            assert len(refilled) == 2 and not refilled & waiting
            print(f"pooled create to first command: {took * 1000:.0f} ms")
        finally:
            for session in sessions:
                await session.destroy()
            await pooled.close()
            await fresh.close()
        assert pooled._machines.ids() == []  # close stopped the pool's guests

    asyncio.run(main())


def test_an_unused_pool_empties_and_the_next_create_of_its_shape_fills_it(state_dir):
    async def main():
        sandbox = provider(state_dir, pool_size=1, pool_idle_seconds=3.0)
        try:
            await sandbox._pool.full()
            [guest] = sandbox._machines.ids()
            give_up = time.monotonic() + 30
            while sandbox._machines.ids():  # no claim for 3 s: its guest stopped
                assert time.monotonic() < give_up, "the idle pool kept its guest"
                await asyncio.sleep(0.2)
            assert sandbox._pool.ready_count() == 0
            await asyncio.sleep(3.5)
            assert sandbox._machines.ids() == []  # and it stays empty
            session = await sandbox.create(SessionSpec(**NONE))  # made as without a pool: it wakes it
            try:
                assert session.id != guest
                await sandbox._pool.full()
                assert len(sandbox._machines.ids()) == 2
            finally:
                await session.destroy()
        finally:
            await sandbox.close()
        assert sandbox._machines.ids() == []

    asyncio.run(main())


KEEPER = """
import asyncio, sys, time
from jupyter_tai_sandbox.providers.vm import VmSandbox
async def main():
    sandbox = VmSandbox(accel="tcg", state_dir=sys.argv[1], deployment="vm-pool-tests", pool_size=1)
    await sandbox._pool.full()
    print("full", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_killed_servers_pool_guests_are_stopped_by_another_servers_reap(state_dir):
    with subprocess.Popen(
        [sys.executable, "-c", KEEPER, state_dir], stdout=subprocess.PIPE, text=True
    ) as keeper:
        try:
            assert keeper.stdout is not None and keeper.stdout.readline().strip() == "full"

            async def main():
                other = provider(state_dir)
                try:
                    [guest] = other._machines.ids()
                    assert await other.reap() == [] and other._machines.ids() == [guest]  # its keeper lives
                    keeper.kill()
                    keeper.wait()
                    assert other._machines.running(guest)  # a daemon: the killed server left it running
                    assert await other.list() == []
                    await other.reap()
                    assert other._machines.ids() == [] and not _running_qemus(state_dir)
                finally:
                    await other.close()

            asyncio.run(main())
        finally:
            if keeper.poll() is None:
                keeper.kill()
                keeper.wait()
