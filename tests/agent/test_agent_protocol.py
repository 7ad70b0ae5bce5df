"""The agent's wire codec and binary locator, without a container."""

from __future__ import annotations

import struct

import pytest

from jupyter_tai_sandbox.agent import AgentBinaryMissing, ExitStatus, agent_binary
from jupyter_tai_sandbox.agent import binary as agent_bin
from jupyter_tai_sandbox.agent import protocol as p


def test_frames_round_trip_through_the_incremental_decoder_byte_by_byte():
    frames = [
        p.encode_json(p.START, 7, {"argv": ["true"]}),
        p.encode(p.STDIN, 7, b"x" * 1000),
        p.encode_u64(p.CREDIT, 7, 1 << 33),
        p.encode(p.KILL, 0xFFFFFFFF),
    ]
    decoder = p.FrameDecoder()
    got = []
    for byte in b"".join(frames):
        got += decoder.feed(bytes([byte]))
    assert [(f.type, f.id) for f in got] == [(p.START, 7), (p.STDIN, 7), (p.CREDIT, 7), (p.KILL, 0xFFFFFFFF)]
    assert got[0].json() == {"argv": ["true"]} and got[1].payload == b"x" * 1000 and got[2].u64() == 1 << 33
    assert decoder.pending == 0


def test_data_frames_carry_their_absolute_offset():
    frame = p.FrameDecoder().feed(p.encode(p.STDOUT, 3, struct.pack(">Q", 12345) + b"hello"))[0]
    assert frame.data() == (12345, b"hello")
    with pytest.raises(p.ProtocolError):
        p.Frame(p.STDOUT, 3, b"short").data()


@pytest.mark.parametrize("length", [0, 4, p.MAX_FRAME_BODY + 1, 0xFFFFFFFF])
def test_a_length_out_of_bounds_is_a_protocol_error(length):
    with pytest.raises(p.ProtocolError):
        p.FrameDecoder().feed(struct.pack(">IBI", length, p.HELLO, 0))


def test_the_largest_frame_is_accepted_and_one_byte_more_is_refused_by_the_encoder():
    (frame,) = p.FrameDecoder().feed(p.encode(p.STDIN, 1, bytes(p.MAX_PAYLOAD)))
    assert len(frame.payload) == p.MAX_PAYLOAD
    with pytest.raises(ValueError):
        p.encode(p.STDIN, 1, bytes(p.MAX_PAYLOAD + 1))


def test_malformed_json_and_credit_are_protocol_errors():
    with pytest.raises(p.ProtocolError):
        p.Frame(p.EXIT, 1, b"{nope").json()
    with pytest.raises(p.ProtocolError):
        p.Frame(p.STDIN_CREDIT, 1, b"\0\0").u64()


def test_exit_status_keeps_a_signal_apart_from_a_code():
    assert ExitStatus.from_json({"code": 3}).returncode == 3
    killed = ExitStatus.from_json({"signal": 9, "killed": True})
    assert (killed.code, killed.signal, killed.returncode, killed.killed) == (None, 9, 137, True)


def test_binary_locator_names_the_architecture_and_says_how_to_build(monkeypatch, tmp_path):
    assert agent_bin.normalize_arch("x86_64") == "amd64" and agent_bin.normalize_arch("aarch64") == "arm64"
    with pytest.raises(AgentBinaryMissing):
        agent_bin.normalize_arch("riscv64")
    monkeypatch.setattr(agent_bin, "BIN_DIR", tmp_path)
    with pytest.raises(AgentBinaryMissing, match=r"python -m jupyter_tai_sandbox\.agent"):
        agent_binary("arm64")
    (tmp_path / "tai-agent-linux-arm64").write_bytes(b"\x7fELF")
    assert agent_binary("aarch64") == tmp_path / "tai-agent-linux-arm64"


def test_docker_exec_protocol_keeps_stdout_whole_across_any_split_and_keeps_stderr_apart():
    from jupyter_tai_sandbox.agent.transport import STDERR_KEPT, DockerExecProtocol

    def mux(kind: int, data: bytes) -> bytes:
        return bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data

    stdout = [bytes([i]) * (i * 997 % 70000) for i in range(40)]
    wire = b"".join(mux(1, chunk) + mux(2, b"relay says no\n") for chunk in stdout)

    class Sink:  # what an AgentClient is to the protocol: it copies what it is fed
        def __init__(self) -> None:
            self.got, self.eof = bytearray(), None

        def feed(self, data) -> None:
            self.got += data

        def feed_eof(self, message=None) -> None:
            self.eof = message or "eof"

    proto, sink = DockerExecProtocol(), Sink()
    early = 5000
    for i in range(
        0, len(wire), 4093
    ):  # splits inside headers and payloads alike, the way recv_into fills it
        if i >= early and proto.sink is None:
            proto.set_sink(sink)  # bytes that came before the client existed are handed over first
        piece = wire[i : i + 4093]
        buf = proto.get_buffer(len(piece))
        buf[: len(piece)] = piece
        proto.buffer_updated(len(piece))
    proto.eof_received()
    assert bytes(sink.got) == b"".join(stdout)
    assert sink.eof == "eof"
    assert proto.stderr.startswith(b"relay says no\n") and len(proto.stderr) <= STDERR_KEPT


@pytest.mark.parametrize("kind", ["relay", "socket"])
def test_a_quiet_agent_connection_holds_a_small_read_buffer_and_a_fast_stream_a_large_one(kind):
    """A buffer per session's connection: 64 KiB while quiet (1,000 sessions hold 64 MiB, not 1 GiB), the full
    1 MiB once a read fills it, small again after a small read; every byte reaches the client across the
    changes."""
    from jupyter_tai_sandbox.agent.transport import (
        QUIET_RECV_SIZE,
        RECV_SIZE,
        DockerExecProtocol,
        SocketProtocol,
    )

    class Sink:
        def __init__(self) -> None:
            self.got = bytearray()

        def feed(self, data) -> None:
            self.got += data

        def feed_eof(self, message=None) -> None:
            pass

    proto = DockerExecProtocol() if kind == "relay" else SocketProtocol()
    sink = Sink()
    proto.set_sink(sink)
    sent = bytearray()

    def arrive(payload: bytes) -> int:
        """One recv_into filling as much of the offered buffer as it can; the bytes it took."""
        wire = (
            payload if kind == "socket" else bytes([1, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
        )
        buf = proto.get_buffer(-1)
        n = min(len(buf), len(wire))
        buf[:n] = wire[:n]
        proto.buffer_updated(n)
        taken = n if kind == "socket" else max(0, n - 8)
        sent.extend(payload[:taken])
        return len(buf)

    assert arrive(b"hello") <= QUIET_RECV_SIZE + 8
    offered = arrive(b"x" * (4 * RECV_SIZE))  # a fast stream fills the small buffer
    assert offered <= QUIET_RECV_SIZE + 8
    assert len(proto.get_buffer(-1)) >= RECV_SIZE  # the next read may take a megabyte
    if kind == "socket":  # the relay's frame goes on: feed the rest of it as it would come
        arrive(b"y" * RECV_SIZE)
        arrive(b"small")
        assert len(proto.get_buffer(-1)) <= QUIET_RECV_SIZE + 8  # quiet again
    assert bytes(sink.got) == bytes(sent)
