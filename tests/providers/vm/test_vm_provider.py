"""The vm provider's own behaviour beyond the conformance suite: KVM or a refusal saying why, sessions that
outlive their server, the deployment scope, the persistent workspace's lock, hard caps, the reaper.

Real QEMU microVMs under TCG (this host has no hardware KVM); without QEMU and the guest the tests skip,
and with ``CI=true`` they fail instead (bash .ci/vm-up).
"""

from __future__ import annotations

import asyncio
import contextlib
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

from jupyter_tai_sandbox.contract import (
    ExecRequest,
    OutputChunk,
    SandboxConflictError,
    SandboxNotFoundError,
    SandboxSpecRejectedError,
    SandboxUnavailableError,
    SessionSpec,
)
from jupyter_tai_sandbox.providers.vm import VM_IMAGE, VmSandbox
from jupyter_tai_sandbox.providers.vm.guest.probe import probe
from tests.support.vm import need_qemu

pytestmark = [pytest.mark.slow(60), pytest.mark.timeout(180)]

NONE = {"network": "none"}


@pytest.fixture(scope="module", autouse=True)
def qemu() -> None:
    need_qemu()


@pytest.fixture
def state_dir() -> Iterator[str]:
    """A short folder of the test's own (the agent's sockets live in it); nothing of it runs afterwards."""
    path = tempfile.mkdtemp(prefix="tai-vmt-", dir="/tmp")
    yield path
    for pidfile in Path(path).glob("*/sessions/*/qemu.pid"):
        leftover = int(pidfile.read_text())
        if f"{pidfile.parent}/agent.sock".encode() in Path(f"/proc/{leftover}/cmdline").read_bytes():
            os.kill(leftover, signal.SIGKILL)
            pytest.fail(f"a VM of the test was left running: {pidfile.parent.name}")
    shutil.rmtree(path, ignore_errors=True)


def provider(state_dir: str, deployment: str = "vm-tests", **traits) -> VmSandbox:
    return VmSandbox(accel="tcg", state_dir=state_dir, deployment=deployment, **traits)


async def server_died(sandbox: VmSandbox) -> None:
    """What a killed server leaves: its agent connections cut, nothing stopped (a closing server kills its
    commands; a dying one cannot)."""
    for known in list(sandbox._site.containers.values()):
        await known.channel.close()


async def stdout_of(session, *argv: str) -> str:
    result = await session.exec(list(argv), timeout_seconds=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def test_kvm_runs_a_session_or_is_refused_saying_why_never_emulated(state_dir):
    """accel='kvm' on a host where a KVM boot fails (this one: PVM) refuses every create with the probe's
    reason and the opt-in; where KVM works, the session runs."""

    async def main():
        sandbox = VmSandbox(accel="kvm", state_dir=state_dir, deployment="vm-tests")
        kvm = (await probe())["kvm"]
        try:
            if kvm["works"]:
                session = await sandbox.create(SessionSpec(**NONE))
                assert (await session.info()).isolation == "vm"
                await session.destroy()
            else:
                with pytest.raises(SandboxUnavailableError) as refused:
                    await sandbox.create(SessionSpec(**NONE))
                assert "KVM does not work" in str(refused.value) and "accel = 'tcg'" in str(refused.value)
                with pytest.raises(SandboxUnavailableError):
                    await sandbox.check_available()
                assert sandbox._machines.ids() == []  # nothing was started emulated instead
        finally:
            await sandbox.close()

    asyncio.run(main())


def test_what_the_provider_cannot_honour_is_rejected_before_anything_starts(state_dir):
    async def main():
        sandbox = provider(state_dir, engine_url="tcp://127.0.0.1:9")  # no engine of this host: no bridges
        assert sandbox.networks == {"none"}
        with pytest.raises(SandboxSpecRejectedError, match="not on this host: ask for network 'none'"):
            await sandbox.create(SessionSpec())  # the default network, egress: refused, saying why
        for spec in (
            SessionSpec(network="egress"),
            SessionSpec(network="internal"),
            SessionSpec(cpu=1.5, **NONE),
            SessionSpec(memory_mb=64, **NONE),
            SessionSpec(image="python:3.11", **NONE),
            SessionSpec(cpu=3.0, **NONE),
        ):
            with pytest.raises(SandboxSpecRejectedError):
                await sandbox.create(spec)
        assert sandbox._machines.ids() == []
        assert sandbox.image_allowed(VM_IMAGE) and not sandbox.image_allowed("python:3.11")

    asyncio.run(main())


def test_a_session_gets_the_vcpus_and_memory_its_spec_asks_for_and_no_more_and_the_tcg_cpu_model(state_dir):
    async def main():
        sandbox = provider(state_dir, user="")  # the guest's root: the one who can write the console
        session = await sandbox.create(SessionSpec(cpu=2.0, memory_mb=192, **NONE))
        try:
            assert (await stdout_of(session, "nproc")).strip() == "2"
            # x86-64-v2 without AVX by default under TCG (VmSandbox.tcg_cpu)
            flags = set(
                (await stdout_of(session, "sh", "-c", "grep -m1 ^flags /proc/cpuinfo")).split(":")[1].split()
            )
            assert {"sse4_2", "popcnt", "ssse3"} <= flags and "avx" not in flags and "avx2" not in flags
            total_kib = int((await stdout_of(session, "sh", "-c", "grep MemTotal /proc/meminfo")).split()[1])
            assert 100 * 1024 < total_kib <= 192 * 1024
            assert (await session.info()).spec.memory_mb == 192
            # the guest's console goes nowhere on the host: session code cannot fill the host's disk through it
            await stdout_of(session, "sh", "-c", "head -c 300000 /dev/zero > /dev/console")
            folder = sandbox._machines.folder(session.id)
            assert sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) < 50_000
        finally:
            await session.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_restarted_server_finds_its_session_and_resumes_a_running_command_exactly(state_dir):
    """The VM outlives the provider that made it; a new provider of the same deployment lists and gets the
    session and attaches to its command where the first one stopped reading: nothing skipped or repeated."""

    async def main():
        first = provider(state_dir)
        session = await first.create(SessionSpec(ttl_seconds=600, **NONE))
        handle = await session.start(
            ExecRequest(
                argv=["sh", "-c", "i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo $i; sleep 0.05; done"],
                timeout_seconds=60,
                label="counting",
            )
        )
        seen = b""
        async for item in handle.output:
            if isinstance(item, OutputChunk):
                seen += item.data
            if seen.count(b"\n") >= 5:
                break
        await server_died(first)  # its VM and the command run on

        second = provider(state_dir)
        assert [i.id for i in await second.list()] == [session.id]
        found = await second.get(session.id)
        held = [c for c in await found.held_commands() if c.label == "counting"]
        assert len(held) == 1 and held[0].running
        resumed = await found.attach_command(held[0].id, {"stdout": len(seen)})
        async for item in resumed.output:
            if isinstance(item, OutputChunk):
                seen += item.data
        assert seen.decode().split() == [str(i) for i in range(1, 61)]
        await found.destroy()
        assert await second.list() == []
        with pytest.raises(SandboxNotFoundError):
            await second.get(session.id)
        await second.close()

    asyncio.run(main())


def test_another_deployment_on_the_same_state_dir_sees_none_of_the_sessions(state_dir):
    async def main():
        ours, theirs = provider(state_dir), provider(state_dir, deployment="someone-else")
        session = await ours.create(SessionSpec(**NONE))
        try:
            assert await theirs.list() == []
            with pytest.raises(SandboxNotFoundError):
                await theirs.get(session.id)
            assert await theirs.reap() == []
            assert [i.id for i in await ours.list()] == [session.id]
        finally:
            await session.destroy()
            await ours.close()

    asyncio.run(main())


def test_a_persistent_workspace_holds_one_live_session_and_outlives_it(state_dir):
    async def main():
        sandbox = provider(state_dir)
        spec = SessionSpec(durability="persistent", workspace_key="notes", owner="alice", **NONE)
        session = await sandbox.create(spec)
        try:
            await session.put_file("kept.txt", b"still here")
            with pytest.raises(SandboxConflictError):
                await sandbox.create(spec)
            # another owner's key of that name is their own workspace, not a conflict with alice's live one
            bob = await sandbox.create(
                SessionSpec(durability="persistent", workspace_key="notes", owner="bob", **NONE)
            )
            try:
                with pytest.raises(SandboxNotFoundError):
                    await bob.get_file("kept.txt")
            finally:
                await bob.destroy(remove_workspace=True)
            assert not sandbox._machines.workspace_image("notes", "bob").exists()
        finally:
            await session.destroy()
        again = await sandbox.create(spec)
        try:
            assert await again.get_file("kept.txt") == b"still here"
        finally:
            await again.destroy(remove_workspace=True)
        assert not sandbox._machines.workspace_image("notes", "alice").exists()
        await sandbox.close()

    asyncio.run(main())


def test_the_reaper_removes_a_session_whose_vm_died_and_one_past_its_end(state_dir):
    async def main():
        sandbox = provider(state_dir)
        died = await sandbox.create(SessionSpec(**NONE))
        ended = await sandbox.create(SessionSpec(ttl_seconds=1, **NONE))
        os.kill(sandbox._machines.pid(died.id), signal.SIGKILL)
        await asyncio.sleep(1.2)
        assert sorted(await sandbox.reap()) == sorted([died.id, ended.id])
        assert sandbox._machines.ids() == [] and await sandbox.list() == []
        await sandbox.close()

    asyncio.run(main())


def test_sessions_restored_from_one_golden_snapshot_have_the_hosts_clock_and_rngs_of_their_own(state_dir):
    """Clones of one snapshot: the guest clock is the host's (not the snapshot's), and their kernels' RNGs were
    seeded apart at the first handshake (the same state would give the same bytes)."""

    async def main():
        sandbox = provider(state_dir)
        first, second = await sandbox.create(SessionSpec(**NONE)), await sandbox.create(SessionSpec(**NONE))
        try:
            script = "date +%s; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
            outs = [(await stdout_of(s, "sh", "-c", script)).split() for s in (first, second)]
            for clock, _ in outs:
                assert abs(int(clock) - time.time()) < 5
            assert outs[0][1] != outs[1][1] and len(outs[0][1]) == 64
            assert sandbox._machines.folder(first.id).joinpath("qmp.sock").exists()
        finally:
            await first.destroy()
            await second.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_paused_session_survives_a_server_restart_and_its_count_goes_on_where_it_stopped(state_dir):
    """pause freezes the guest (QMP stop): nothing runs, exec is a conflict; a new server finds it paused,
    resumes it, and the counting command continues from the number it had reached."""

    async def main():
        first = provider(state_dir)
        session = await first.create(SessionSpec(ttl_seconds=600, **NONE))
        handle = await session.start(
            ExecRequest(
                argv=["sh", "-c", "i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i; sleep 0.05; done"],
                timeout_seconds=120,
                label="counting",
            )
        )
        seen = b""
        async for item in handle.output:
            if isinstance(item, OutputChunk):
                seen += item.data
            if seen.count(b"\n") >= 3:
                break
        info = await session.pause()
        assert info.paused and session.pausable
        with pytest.raises(SandboxConflictError):
            await session.exec(["true"], timeout_seconds=10)
        await server_died(first)

        second = provider(state_dir)
        [listed] = await second.list()
        assert listed.paused
        found = await second.get(session.id)
        assert (await found.info()).paused
        with pytest.raises(SandboxConflictError):
            await found.list_files(".")
        await asyncio.sleep(1.0)  # paused: the count does not move
        assert not (await found.resume()).paused
        held = [c for c in await found.held_commands() if c.label == "counting"]
        assert held and held[0].offsets["stdout"][1] < len(b"".join(b"%d\n" % i for i in range(1, 41)))
        resumed = await found.attach_command(held[0].id, {"stdout": len(seen)})
        async for item in resumed.output:
            if isinstance(item, OutputChunk):
                seen += item.data
        assert seen.decode().split() == [str(i) for i in range(1, 41)]
        assert (await stdout_of(found, "echo", "running")).strip() == "running"
        await found.destroy()
        await second.close()

    asyncio.run(main())


def qemu_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status``'s fields by name."""
    return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())


def test_a_vm_sessions_qemu_runs_unprivileged_under_seccomp(state_dir):
    """A session's QEMU (restored from a golden, a fork's loaded from a saved state, a persistent one's booted)
    runs as a uid of its own in VmSandbox.qemu_uids, with no group, no capability and none to gain, under its
    seccomp filter, chrooted into its session's folder, which stays root's, and holds a golden's memory only
    as a sealed memfd no one can write: its guest still runs commands, pauses, resumes and forks, and a
    destroy leaves nothing."""
    if os.geteuid() != 0:
        pytest.skip("QEMU is confined only by a server that runs as root")  # CI runs as root

    async def main():
        sandbox = provider(state_dir)
        first, last = map(int, sandbox.qemu_uids.split("-"))
        source = await sandbox.create(SessionSpec(ttl_seconds=600, **NONE))
        persistent = await sandbox.create(
            SessionSpec(durability="persistent", workspace_key="confined", **NONE)
        )
        forked = None
        try:
            await source.put_file("note.txt", b"kept")
            assert (await source.pause()).paused
            assert not (await source.resume()).paused
            forked = await source.fork()
            uids = []
            for session in (source, forked, persistent):
                pid = sandbox._machines.pid(session.id)
                status = qemu_status(pid)
                uid = int(status["Uid"].split()[0])
                assert first <= uid <= last, status["Uid"]
                assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(uid)] * 4
                assert status["Groups"].split() == [str(uid)]
                for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
                    assert int(status[field], 16) == 0, (field, status[field])
                # the bounding set held only what -runas and -chroot needed (setgid, setuid, sys_chroot)
                assert int(status["CapBnd"], 16) & ~((1 << 6) | (1 << 7) | (1 << 18)) == 0, status["CapBnd"]
                assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
                folder = sandbox._machines.folder(session.id)
                assert os.readlink(f"/proc/{pid}/root") == str(folder)
                # what QEMU's root holds is root's alone: its uid cannot even list it
                assert folder.stat().st_uid == 0 and folder.stat().st_mode & 0o077 == 0
                assert all(entry.stat().st_uid == 0 for entry in folder.iterdir())
                uids.append(uid)
                # what it holds open: a golden's memory only as a sealed memfd, which nothing can write
                held = {fd.name: os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
                assert not [target for target in held.values() if target.endswith(".ram")], held
                sealed = [fd for fd, target in held.items() if target.startswith("/memfd:tai-golden")]
                assert bool(sealed) == (session is source), held  # the fork loaded it all; the other booted
                for fd in sealed:
                    with (
                        open(f"/proc/{pid}/fd/{fd}", "r+b", buffering=0) as memory,
                        pytest.raises(PermissionError),
                    ):
                        memory.write(b"\0")
                assert (await stdout_of(session, "echo", "runs")).strip() == "runs"
            assert len(set(uids)) == 3  # each QEMU a uid of its own: none can signal another
            assert (await forked.get_file("note.txt")) == b"kept"
        finally:
            for session in (forked, source, persistent):
                if session is not None:
                    await session.destroy()
            await sandbox.close()
        # the server killed its unprivileged QEMUs and removed their folders
        assert sandbox._machines.ids() == []
        assert not [
            p for p in Path("/proc").iterdir() if p.name.isdigit() and state_dir.encode() in _cmdline(p)
        ]

    asyncio.run(main())


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_fork_starts_from_the_sources_state_and_the_two_diverge(state_dir):
    """fork copies the guest now: the workspace's files and a running counter are in both; afterwards what one
    writes the other never sees, both counters go on, and the copy has its own clock and RNG."""

    async def main():
        sandbox = provider(state_dir)
        source = await sandbox.create(SessionSpec(ttl_seconds=600, **NONE))
        forked = None
        try:
            await source.put_file("before.txt", b"shared past")
            await source.start(
                ExecRequest(
                    argv=[
                        "sh",
                        "-c",
                        "i=0; while :; do i=$((i+1)); echo $i > n.tmp; mv n.tmp n; sleep 0.05; done",
                    ],
                    timeout_seconds=120,
                )
            )
            await asyncio.sleep(0.5)
            forked = await source.fork()
            assert forked.id != source.id and source.forkable
            info = await forked.info()
            assert (info.spec.network, info.spec.ttl_seconds, info.paused) == ("none", 600, False)
            assert await forked.get_file("before.txt") == b"shared past"
            await source.put_file("after.txt", b"source only")
            await forked.put_file("after.txt", b"fork only")
            assert await source.get_file("after.txt") == b"source only"
            assert await forked.get_file("after.txt") == b"fork only"
            counts = [int(await s.get_file("n")) for s in (source, forked)]
            await asyncio.sleep(0.5)
            for session, before in zip((source, forked), counts, strict=True):  # both run on
                assert int(await session.get_file("n")) > before
            script = "date +%s; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"
            outs = [(await stdout_of(s, "sh", "-c", script)).split() for s in (source, forked)]
            assert abs(int(outs[1][0]) - time.time()) < 5 and outs[0][1] != outs[1][1]
            assert sorted(i.id for i in await sandbox.list()) == sorted([source.id, forked.id])
        finally:
            if forked is not None:
                await forked.destroy()
            await source.destroy()
            await sandbox.close()

    asyncio.run(main())


def test_a_reaper_running_beside_creates_and_forks_takes_none_of_them(state_dir):
    """Another server's reaper, passing every 20 ms, meets sessions whose QEMU does not run yet (a create, a
    cold boot, a fork under way): it leaves them be."""

    async def main():
        sandbox, other_server = provider(state_dir), provider(state_dir)
        done = asyncio.Event()
        reaped: list[str] = []

        async def reaping() -> None:
            while not done.is_set():
                reaped.extend(await other_server.reap())
                await asyncio.sleep(0.02)

        reaper = asyncio.ensure_future(reaping())
        sessions = []
        try:
            sessions.append(await sandbox.create(SessionSpec(**NONE)))
            sessions.append(
                await sandbox.create(SessionSpec(durability="persistent", workspace_key="not-reaped", **NONE))
            )  # a cold boot: seconds without a guest
            sessions.append(await sessions[0].fork())
            for session in sessions:
                assert (await session.exec(["true"], timeout_seconds=30)).exit_code == 0
        finally:
            done.set()
            await reaper
            for session in sessions:
                await session.destroy(remove_workspace=True)
            await sandbox.close()
        assert reaped == []

    asyncio.run(main())


def test_commands_run_as_an_unprivileged_guest_user_who_cannot_reach_the_agent(state_dir):
    """The default user (1000:1000) owns the workspace and what it uploads, and cannot signal, trace or read
    the agent (PID 1) nor open its channel's devices; a session keeps its user when the setting changes."""

    async def main():
        sandbox, other_server = provider(state_dir), provider(state_dir)
        session = await sandbox.create(SessionSpec(ttl_seconds=600, **NONE))
        try:
            assert (await stdout_of(session, "id", "-u")).strip() == "1000"
            await session.put_file("up.txt", b"mine")
            assert (await stdout_of(session, "stat", "-c", "%u:%g", ".", "up.txt")).split() == [
                "1000:1000"
            ] * 2
            for attempt in (
                "kill -9 1",
                "cat /proc/1/environ",
                "ls /proc/1/fd",
                "cat /proc/1/mem",
                "cat /dev/vport0p1",
                "echo forged > /dev/vport0p2",
            ):
                result = await session.exec(["sh", "-c", attempt], timeout_seconds=20)
                assert result.exit_code != 0, (attempt, result.stdout)
            assert (await stdout_of(session, "echo", "alive")).strip() == "alive"  # the agent is untouched

            sandbox.user = ""  # a later create would run as root; this session stays as it was made
            again = await other_server.get(session.id)
            assert (await stdout_of(again, "id", "-u")).strip() == "1000"
            with pytest.raises(Exception, match="uid"):
                VmSandbox(user="nobody")
        finally:
            await session.destroy()
            await sandbox.close()
            await other_server.close()

    asyncio.run(main())


MAKER = """
import asyncio, dataclasses, sys
from pathlib import Path
from jupyter_tai_sandbox.providers.vm.guest.build import Guest, cache_dir
from jupyter_tai_sandbox.providers.vm.guest.snapshot import ensure_golden
machine = next(p for p in cache_dir().iterdir() if (p / "guest.json").exists())
guest = dataclasses.replace(Guest.load(machine), path=Path(sys.argv[1]))
asyncio.run(ensure_golden(guest, accel="tcg", memory_mb=160, cpus=1, ports=1))
"""


def test_a_golden_snapshots_qemu_dies_with_the_process_making_it(tmp_path):
    """A golden's QEMU is only its maker's: a server killed while it makes one leaves no QEMU running (a
    session's QEMU, by design, outlives the server; a golden maker's would run for nothing, for ever)."""
    maker = subprocess.Popen([sys.executable, "-c", MAKER, str(tmp_path)])
    qemu, workdir = None, None
    try:
        give_up = time.monotonic() + 60
        while qemu is None and time.monotonic() < give_up:
            assert maker.poll() is None, "the maker ended before its QEMU started"
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):
                        argv = (entry / "cmdline").read_bytes().split(b"\0")
                        if argv[0].endswith(b"qemu-system-x86_64") and str(tmp_path).encode() in b" ".join(
                            argv
                        ):
                            qemu = int(entry.name)
                            workdir = next(
                                Path(a.decode().split("path=")[1].split(",")[0]).parent
                                for a in argv
                                if b"agent.sock" in a
                            )
            time.sleep(0.05)
        assert qemu is not None, "the maker started no QEMU"
        maker.kill()
        maker.wait()
        give_up = time.monotonic() + 10
        while Path(f"/proc/{qemu}").exists() and b"qemu" in Path(f"/proc/{qemu}/cmdline").read_bytes():
            assert time.monotonic() < give_up, "the golden's QEMU outlived its maker"
            time.sleep(0.05)
    finally:
        if maker.poll() is None:
            maker.kill()
        if qemu is not None:  # a failure leaves nothing running either
            with contextlib.suppress(OSError):
                if b"qemu" in Path(f"/proc/{qemu}/cmdline").read_bytes():
                    os.kill(qemu, signal.SIGKILL)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)  # the killed maker could not clean up


def test_a_golden_makers_qemu_runs_confined_and_still_dies_with_its_maker(tmp_path):
    """A golden maker's QEMU drops root as a session's does (-runas clears its parent-death signal): once it
    runs as its own uid, a killed maker still leaves no QEMU running (its controlling terminal, the maker's,
    is hung up)."""
    if os.geteuid() != 0:
        pytest.skip("QEMU is confined only by a server that runs as root")  # CI runs as root
    first, last = map(int, VmSandbox.qemu_uids.default_value.split("-"))
    maker = subprocess.Popen([sys.executable, "-c", MAKER, str(tmp_path)])
    qemu, workdir = None, None
    try:
        give_up = time.monotonic() + 60
        while qemu is None:
            assert maker.poll() is None, "the maker ended before its QEMU dropped root"
            assert time.monotonic() < give_up, "the maker's QEMU never ran confined"
            for entry in Path("/proc").iterdir():
                argv = _cmdline(entry).split(b"\0")
                if (
                    entry.name.isdigit()
                    and argv[0].endswith(b"qemu-system-x86_64")
                    and str(tmp_path).encode() in b" ".join(argv)
                ):
                    with contextlib.suppress(OSError, ValueError):
                        status = qemu_status(int(entry.name))
                        if first <= int(status["Uid"].split()[0]) <= last:
                            qemu = int(entry.name)
                            workdir = Path(os.readlink(f"/proc/{qemu}/root"))
                            assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
                            assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
            time.sleep(0.05)
        maker.kill()
        maker.wait()
        give_up = time.monotonic() + 10
        while qemu_alive(qemu):
            assert time.monotonic() < give_up, "the confined golden's QEMU outlived its maker"
            time.sleep(0.05)
    finally:
        if maker.poll() is None:
            maker.kill()
        if qemu is not None and qemu_alive(qemu):  # a failure leaves nothing running either
            os.kill(qemu, signal.SIGKILL)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)  # the killed maker could not clean up


def qemu_alive(pid: int) -> bool:
    return b"qemu" in _cmdline(Path(f"/proc/{pid}"))


IN_A_NAMESPACE = """
import asyncio, sys
from jupyter_tai_sandbox.contract import SandboxUnavailableError, SessionSpec
from jupyter_tai_sandbox.providers.vm import VmSandbox
async def main():
    sandbox = VmSandbox(accel="tcg", state_dir=sys.argv[1], deployment="vm-tests", golden_snapshots=False)
    try:
        await sandbox.create(SessionSpec(network="none"))
    except SandboxUnavailableError as e:
        print(e)
    finally:
        await sandbox.close()
    assert sandbox._machines.ids() == []
asyncio.run(main())
"""


def test_a_server_whose_user_namespace_lacks_the_qemu_uids_refuses_creates_saying_why(state_dir):
    """A root server in a user namespace that maps only some uids (a container's) cannot give QEMU a uid of
    VmSandbox.qemu_uids: its creates are refused saying so (never run with QEMU as root instead)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")  # CI has both
    said = subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c", IN_A_NAMESPACE, state_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert said.returncode == 0, said.stderr
    assert (
        "VmSandbox.qemu_uids 2000000000-2000999999 are not all uids of this server's user namespace"
        in said.stdout
    )
