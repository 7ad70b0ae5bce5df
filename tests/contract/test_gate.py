"""The gate applies the exec-time policy on the sessions it hands out, for every door at once.

Driven through the real local provider behind ``register_sandbox``: the timeout ceiling is refused
(never clamped) for one-shot and interactive commands on sessions from ``create`` and ``get``;
one-shot output is limited and scrubbed with the command's byte counts kept; interactive output is
scrubbed across chunk boundaries; a byte transport keeps the ceiling but not the scrub.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.contract import (
    ExecRequest,
    ExitItem,
    OutputChunk,
    OutputTooLargeError,
    SandboxExecTimeoutError,
    SandboxRequestError,
    SessionSpec,
)
from jupyter_tai_sandbox.gate import GatedExecResult, GatedSession, start_transport
from jupyter_tai_sandbox.policy import SandboxPolicy
from jupyter_tai_sandbox.providers.local import LocalSandbox

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cr3t-Gate-Value"
CEILING = 5.0


@pytest.fixture
def gate(tmp_path, monkeypatch):
    monkeypatch.setenv("TAI_GATE_SECRET", SECRET)
    policy = SandboxPolicy(
        isolation="none",
        max_timeout_seconds=CEILING,
        scrub_transcript=True,
        credentials={"*": ["TAI_GATE_SECRET"]},
    )
    return sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")), policy=policy, output_limit=4096
    )


def run(gate, scenario):
    async def main():
        created = await gate.create(SessionSpec(consumer="user:test", ttl_seconds=300))
        try:
            fetched = await sandboxes.require_sandbox().get(created.id)
            return await scenario(created, fetched)
        finally:
            await created.destroy()

    return asyncio.run(main())


async def collect(handle) -> tuple[dict[str, bytes], list[int]]:
    out = {"stdout": b"", "stderr": b""}
    exits = []
    async for item in handle.output:
        if isinstance(item, OutputChunk):
            out[item.stream] += item.data
        else:
            assert isinstance(item, ExitItem)
            exits.append(item.exit_code)
    await handle.kill()
    return out, exits


def test_create_and_get_hand_out_gated_sessions(gate):
    async def scenario(created, fetched):
        assert isinstance(created, GatedSession) and isinstance(fetched, GatedSession)
        assert fetched.id == created.id and not isinstance(fetched.session, GatedSession)
        assert fetched.workspace == created.session.workspace  # the provider's own attributes are reachable

    run(gate, scenario)


def test_a_timeout_over_the_ceiling_is_refused_for_exec_and_exec_start_never_clamped(gate, tmp_path):
    marker = tmp_path / "ran"

    async def scenario(created, fetched):
        argv = ["sh", "-c", f"touch {marker}"]
        for session in (created, fetched):
            with pytest.raises(SandboxRequestError) as one_shot:
                await session.exec(argv, timeout_seconds=CEILING + 1)
            with pytest.raises(SandboxRequestError) as interactive:
                await session.exec_start(argv, timeout_seconds=CEILING + 1)
            with pytest.raises(SandboxRequestError):
                await session.run(ExecRequest(argv, CEILING * 1000))
            for refused in (one_shot.value, interactive.value):
                assert refused.field == "timeout_seconds"
                assert str(refused) == (
                    f"timeout_seconds: {CEILING + 1:g} s is over the operator's maximum of {CEILING:g} s "
                    "(SandboxPolicy.max_timeout_seconds)"
                )
        assert not marker.exists()  # refused before anything ran
        # at the ceiling the command runs with the deadline it asked for
        result = await fetched.exec(["sh", "-c", "echo ok"], timeout_seconds=CEILING)
        assert (result.exit_code, result.stdout) == (0, b"ok\n")

    run(gate, scenario)


def test_the_ceiling_follows_the_policy_in_force(gate):
    async def scenario(created, fetched):
        sandboxes.use_policy(SandboxPolicy(isolation="none", max_timeout_seconds=0))  # 0: no maximum
        result = await fetched.exec(["true"], timeout_seconds=CEILING * 100)
        assert result.exit_code == 0

    run(gate, scenario)


def test_one_shot_output_is_scrubbed_with_the_commands_byte_counts(gate):
    async def scenario(created, fetched):
        result = await fetched.exec(
            ["sh", "-c", 'printf "\\377$TAI_GATE_SECRET\\000"; echo "err:$TAI_GATE_SECRET" >&2'],
            timeout_seconds=CEILING,
        )
        assert isinstance(result, GatedExecResult)
        assert result.stdout == b"\xff[scrubbed]\x00" and result.stderr == b"err:[scrubbed]\n"
        assert (result.stdout_bytes, result.stderr_bytes) == (len(SECRET) + 2, len(SECRET) + 5)
        # a large output is scrubbed (off the loop) as exactly as a small one
        big = await fetched.exec(
            ["sh", "-c", 'for i in $(seq 1 40); do printf "%0100d$TAI_GATE_SECRET" 0; done'],
            timeout_seconds=CEILING,
        )
        assert big.stdout == (b"0" * 100 + b"[scrubbed]") * 40

    sandboxes.register_sandbox(gate.provider, policy=gate.policy, output_limit=0, replace=True)  # no limit
    gate = sandboxes.require_sandbox()
    run(gate, scenario)


def test_one_shot_output_past_the_limit_stops_the_command(gate):
    async def scenario(created, fetched):
        with pytest.raises(OutputTooLargeError) as raised:
            await fetched.exec(["yes"], timeout_seconds=CEILING)
        assert raised.value.stdout_bytes + raised.value.stderr_bytes > 4096
        # a request's own lower limit stays; a higher one is held to the gate's
        with pytest.raises(OutputTooLargeError):
            await fetched.run(ExecRequest(["sh", "-c", "head -c 200 /dev/zero"], CEILING, output_limit=100))
        with pytest.raises(OutputTooLargeError):
            await fetched.run(
                ExecRequest(["sh", "-c", "head -c 5000 /dev/zero"], CEILING, output_limit=1 << 30)
            )
        assert (
            len((await fetched.exec(["sh", "-c", "head -c 4000 /dev/zero"], timeout_seconds=CEILING)).stdout)
            == 4000
        )

    run(gate, scenario)


def test_a_timeout_keeps_the_byte_counts_of_what_the_command_wrote(gate):
    async def scenario(created, fetched):
        with pytest.raises(SandboxExecTimeoutError) as raised:
            await fetched.exec(
                ["sh", "-c", 'printf "%s" "$TAI_GATE_SECRET"; echo ab >&2; sleep 30'], timeout_seconds=1
            )
        assert (raised.value.stdout_bytes, raised.value.stderr_bytes) == (len(SECRET), 3)
        handle = await fetched.exec_start(
            ["sh", "-c", 'printf "%s" "$TAI_GATE_SECRET"; sleep 30'], timeout_seconds=1
        )
        seen = b""
        with pytest.raises(SandboxExecTimeoutError) as raised:
            async for item in handle.output:
                if isinstance(item, OutputChunk):
                    seen += item.data
        await handle.kill()
        assert raised.value.stdout_bytes == len(SECRET) and seen == b"[scrubbed]"

    run(gate, scenario)


def test_interactive_output_is_scrubbed_across_chunks_and_stays_binary_safe(gate):
    head, tail = SECRET[:6], SECRET[6:]

    async def scenario(created, fetched):
        handle = await fetched.exec_start(
            [
                "sh",
                "-c",
                'printf %s "$A"; sleep 0.3; printf "%s\\n" "$B"; printf %s "$A" >&2; sleep 0.3; echo "$B" >&2',
            ],
            timeout_seconds=CEILING,
            env={"A": head, "B": tail},
        )
        out, exits = await collect(handle)
        assert out == {"stdout": b"[scrubbed]\n", "stderr": b"[scrubbed]\n"} and exits == [0]
        assert handle.byte_counts == {"stdout": len(SECRET) + 1, "stderr": len(SECRET) + 1}
        # what a scrubber held back (the start of a value that never came) is released before the exit item
        handle = await fetched.exec_start(
            ["sh", "-c", 'printf "x%s" "$A"; printf "%s" "$A" >&2'], timeout_seconds=CEILING, env={"A": head}
        )
        out, exits = await collect(handle)
        assert out == {"stdout": b"x" + head.encode(), "stderr": head.encode()} and exits == [0]
        data = bytearray(os.urandom(256 << 10))
        for offset in (0, 65535, 65536 - 3, len(data) - len(SECRET)):
            data[offset : offset + len(SECRET)] = SECRET.encode()
        handle = await fetched.exec_start(["cat"], timeout_seconds=CEILING)
        writer = asyncio.ensure_future(_feed(handle, bytes(data)))
        out, exits = await collect(handle)
        await writer
        assert out["stdout"] == bytes(data).replace(SECRET.encode(), b"[scrubbed]") and exits == [0]

    run(gate, scenario)


async def _feed(handle, data: bytes) -> None:
    for i in range(0, len(data), 10_000):
        await handle.write(data[i : i + 10_000])
    await handle.close_stdin()


def test_nothing_to_scrub_hands_out_the_providers_handle(tmp_path):
    gate = sandboxes.register_sandbox(
        LocalSandbox(root=str(tmp_path / "root")),
        policy=SandboxPolicy(isolation="none", max_timeout_seconds=CEILING),
    )

    async def scenario(created, fetched):
        handle = await fetched.exec_start(["echo", "hi"], timeout_seconds=CEILING)
        assert type(handle).__module__.startswith("jupyter_tai_sandbox.providers")
        out, exits = await collect(handle)
        assert out["stdout"] == b"hi\n" and exits == [0]
        with pytest.raises(SandboxRequestError, match="max_timeout_seconds"):
            await fetched.exec_start(["true"], timeout_seconds=CEILING + 1)

    run(gate, scenario)


def test_a_transport_keeps_the_ceiling_but_not_the_scrub(gate):
    async def scenario(created, fetched):
        with pytest.raises(SandboxRequestError, match="max_timeout_seconds"):
            await start_transport(fetched, ExecRequest(["true"], CEILING + 1))
        handle = await start_transport(
            fetched, ExecRequest(["sh", "-c", 'printf %s "$TAI_GATE_SECRET"'], CEILING)
        )
        out, exits = await collect(handle)
        assert out["stdout"] == SECRET.encode() and exits == [0]

    run(gate, scenario)


def test_the_server_output_limit_reaches_a_plugin_registered_later(tmp_path):
    sandboxes.use_policy(SandboxPolicy(isolation="none"), output_limit=123)
    gate = sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "root")))
    assert gate.output_limit == 123
    sandboxes.use_policy(gate.policy, output_limit=0)
    assert sandboxes.require_sandbox().output_limit == 0
    sandboxes.unregister_sandbox()
    assert sandboxes.register_sandbox(LocalSandbox(root=str(tmp_path / "root"))).output_limit == 64 << 20
