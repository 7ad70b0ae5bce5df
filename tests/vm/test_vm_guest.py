"""The vm guest: QEMU microVM (TCG) booting Debian's cloud kernel with the session agent as PID 1, spoken to
over its virtio-serial port. One boot for the module; each test speaks to the same guest.

Without QEMU or a guest that can be built (Debian's apt), the tests skip, saying how to get them (.ci/vm-up);
with ``CI=true`` they fail instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from jupyter_tai_sandbox.agent import AgentBinaryMissing, AgentClient, AgentError
from jupyter_tai_sandbox.agent import protocol as p
from jupyter_tai_sandbox.providers.vm.guest import BootedVm, Guest, GuestBuildError, boot, build_guest
from jupyter_tai_sandbox.providers.vm.guest.qemu import RETRY_ATTEMPT
from tests.support.vm import missing, need_qemu

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow(30)]


@dataclass
class Vm:
    guest: Guest
    booted: BootedVm
    loop: asyncio.AbstractEventLoop
    boot_seconds: float

    def run(self, coro, timeout: float = 60):
        """Run a coroutine on the loop QEMU's process belongs to, bounded."""
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))

    async def client(self) -> AgentClient:
        return await self.booted.connect(timeout=20)


@pytest.fixture(scope="module")
def vm() -> Iterator[Vm]:
    need_qemu()
    try:
        guest = build_guest()
    except (GuestBuildError, AgentBinaryMissing) as e:
        missing(f"a guest: {e}")
    loop = asyncio.new_event_loop()
    started = time.monotonic()
    booted = loop.run_until_complete(boot(guest))
    try:
        client = loop.run_until_complete(booted.connect())
        loop.run_until_complete(client.close())
        yield Vm(guest, booted, loop, time.monotonic() - started)
    finally:
        loop.run_until_complete(booted.close())
        loop.close()
    assert booted.process.returncode is not None and not booted.workdir.exists()  # QEMU and its folder gone


def test_the_agent_answers_as_pid_1_of_the_guest_kernel(vm):
    async def go():
        client = await vm.client()
        try:
            assert client.info["version"] == 1 and client.info["pid"] == 1
            out, _, status = await (await client.start(["uname", "-r"])).collect()
            assert (
                status.code == 0 and out.decode().strip() == vm.guest.kernel_release
            )  # not the host's kernel
            out, _, _ = await (await client.start(["cat", "/proc/1/cmdline"])).collect()
            assert out == b"/init\0vm\0"  # the kernel passed "-- vm" to /init
            out, _, _ = await (await client.start(["cat", "/proc/mounts"])).collect()
            mounts = {line.split()[1]: line.split()[2] for line in out.decode().splitlines()}
            assert {m: mounts.get(m) for m in ("/dev", "/dev/pts", "/proc", "/sys", "/tmp", "/run")} == {
                "/dev": "devtmpfs",
                "/dev/pts": "devpts",
                "/proc": "proc",
                "/sys": "sysfs",
                "/tmp": "tmpfs",
                "/run": "tmpfs",
            }
            out, _, _ = await (await client.start(["cat", "/sys/class/net/lo/flags"])).collect()
            assert int(out, 16) & 1  # lo is up
        finally:
            await client.close()

    vm.run(go())


def test_a_command_runs_and_its_exit_status_comes_back(vm):
    async def go():
        client = await vm.client()
        try:
            out, err, status = await (await client.start(["/init", "version"])).collect()
            assert (out, err, status.code) == (b"tai-agent protocol 1\n", b"", 0)
            out, err, status = await (await client.start(["/init", "no-such-mode"])).collect()
            assert (out, status.code, status.signal) == (b"", 64, None) and b"usage: tai-agent" in err
            out, _, status = await (await client.start(["sh", "-c", "echo $((6 * 7)); exit 3"])).collect()
            assert (out, status.code) == (b"42\n", 3)
            with pytest.raises(AgentError) as e:
                await client.start(["no-such-program"])
            assert e.value.code == "ENOENT"
            out, _, status = await (await client.start(["busybox", "tty"], pty=True)).collect()
            assert status.code == 0 and out.startswith(b"/dev/pts/")
        finally:
            await client.close()

    vm.run(go())


def test_a_command_outlives_a_host_disconnect_and_resumes_where_the_client_left(vm):
    async def go():
        client = await vm.client()
        cmd = await client.start(["sh", "-c", 'echo one; read line; echo "two $line"'], label="outlives")
        assert await cmd.read() == ("stdout", b"one\n")
        await client.close()  # the host side of the port goes away; the command waits on its stdin

        client = await vm.client()
        try:
            [held] = [c for c in await client.list() if c.get("label") == "outlives"]
            assert held["running"] and not held["attached"] and held["output"]["stdout"] == [0, 4]
            again = await client.attach(held["id"], stdout=4)
            await again.write(b"x\n")
            await again.close_stdin()
            out, err, status = await again.collect()
            assert (out, err, status.code) == (b"two x\n", b"", 0)
            await again.release()
        finally:
            await client.close()

    vm.run(go())


def test_a_kill_stops_the_commands_whole_group(vm):
    async def go():
        client = await vm.client()
        try:
            cmd = await client.start(["sh", "-c", "sleep 300 & echo $!; sleep 300 & echo $!; wait"])
            pids = b""
            while pids.count(b"\n") < 2:
                pids += (await cmd.read())[1]
            children = pids.split()
            killed = await cmd.kill()
            status = await cmd.wait()
            assert killed["exited"] and status.signal == 9 and status.killed
            for pid in children:  # the group's other processes went too (and were reaped by PID 1)
                for _ in range(50):
                    try:
                        await client.stat("/proc", pid.decode())
                    except AgentError as e:
                        assert e.code == "ENOENT"
                        break
                    await asyncio.sleep(0.05)
                else:
                    pytest.fail(f"process {pid.decode()} of the killed group is still there")
            await cmd.release()
        finally:
            await client.close()

    vm.run(go())


def test_a_host_that_reconnects_at_once_gets_a_clean_connection(vm):
    """The port has no connections of its own: a host back at once is often never seen gone by the guest,
    and what the former connection had in flight comes first. A new HELLO begins a connection there, and the
    client skips what comes before the reply that echoes its nonce."""

    async def go():
        for _ in range(10):  # idle: the former connection left between frames
            client = await vm.client()
            await client.ping()
            await client.close()
        for _ in range(3):  # cut while the agent streams output to it
            client = await vm.client()
            cmd = await client.start(["yes", "y" * 100])
            got = 0
            while got < 200_000:
                got += len((await cmd.read())[1])
            client._writer.transport.abort()
            await client.close()
            client = await vm.client()
            try:
                again = await client.attach(cmd.id, stdout=got)
                await client.ping()
                await again.kill()
                assert (await again.wait()).signal == 9
                await again.release()
            finally:
                await client.close()

    vm.run(go())


def test_a_client_cut_short_inside_a_frame_costs_the_next_client_a_try_not_the_port(vm):
    """A HELLO that comes before the agent saw the former client gone completes that client's frame; the
    client's next try (after a pause) is seen as a new host's."""

    async def go():
        client = await vm.client()
        client._writer.write(p.encode(p.PING, 7, b"x" * 1000)[:19])  # says 1005 bytes, sends 10 of them
        await client._writer.drain()
        client._writer.transport.abort()
        await client.close()
        started = time.monotonic()
        client = await vm.client()
        try:
            await client.ping()
            assert time.monotonic() - started < RETRY_ATTEMPT + 2
        finally:
            await client.close()

    vm.run(go())
