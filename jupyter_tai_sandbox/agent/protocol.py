"""The session agent's wire format (agent/PROTOCOL.md): pure encoding and decoding, no I/O.

A frame is ``length (u32 BE) | type (u8) | id (u32 BE) | payload`` where ``length`` counts type, id and
payload and is at most :data:`MAX_FRAME_BODY` (a START's payload: :data:`MAX_START_PAYLOAD`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Literal

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">IBI")
HEADER_SIZE = HEADER.size
MAX_FRAME_BODY = 1 << 20
MAX_PAYLOAD = MAX_FRAME_BODY - 5
#: a START carries the contract's 1 MiB of argv and env (MAX_COMMAND_BYTES) JSON-escaped: at most 6 bytes a byte
MAX_START_PAYLOAD = 8 << 20
#: a command's output streams (a STDOUT or STDERR frame's)
Stream = Literal["stdout", "stderr"]
U64 = struct.Struct(">Q")

# client -> agent
HELLO = 0x01
PING = 0x02
START = 0x10
STDIN = 0x11
STDIN_CLOSE = 0x12
RESIZE = 0x13
SIGNAL = 0x14
KILL = 0x15
CREDIT = 0x16
ATTACH = 0x17
RELEASE = 0x18
LIST = 0x19
CONNECT = 0x1A
FILE_STAT = 0x30
FILE_LIST = 0x31
FILE_READ = 0x32
UPLOAD_OPEN = 0x33
UPLOAD_DATA = 0x34
UPLOAD_COMMIT = 0x35
UPLOAD_ABORT = 0x36
FILE_DELETE = 0x37
FILE_RENAME = 0x38
FILE_MKDIR = 0x39
# agent -> client
HELLO_REPLY = 0x81
PONG = 0x82
STARTED = 0x90
STDOUT = 0x91
STDERR = 0x92
EOF = 0x93
EXIT = 0x94
LOST = 0x95
STDIN_CREDIT = 0x96
KILLED = 0x97
RELEASED = 0x98
LIST_REPLY = 0x99
ATTACHED = 0x9A
DETACHED = 0x9B
ACK = 0x9C
FILE_REPLY = 0xA0
FILE_DATA = 0xA1
ERROR = 0xEE
#: bytes of a FILE_READ answer at most (a frame's payload less the file size before the bytes)
MAX_READ_CHUNK = (1 << 20) - 5 - 8

AGENT_TYPES = frozenset(
    {
        HELLO_REPLY,
        PONG,
        STARTED,
        STDOUT,
        STDERR,
        EOF,
        EXIT,
        LOST,
        STDIN_CREDIT,
        KILLED,
        RELEASED,
        LIST_REPLY,
        ATTACHED,
        DETACHED,
        ACK,
        FILE_REPLY,
        FILE_DATA,
        ERROR,
    }
)


class ProtocolError(Exception):
    """A frame that breaks the protocol: the connection carrying it is closed."""


@dataclass(frozen=True)
class Frame:
    """One frame. A STDOUT/STDERR frame out of :class:`FrameDecoder` has its u64 offset already split off:
    ``offset`` holds it and ``payload`` is the bytes alone (one copy fewer per byte of output)."""

    type: int
    id: int
    payload: bytes = b""
    offset: int | None = None

    def json(self) -> Any:
        try:
            return json.loads(self.payload)
        except ValueError as e:
            raise ProtocolError(f"frame 0x{self.type:02x} carries malformed JSON: {e}") from None

    def data(self) -> tuple[int, bytes]:
        """The absolute offset and bytes of a STDOUT/STDERR frame."""
        if self.offset is not None:
            return self.offset, self.payload
        if len(self.payload) < U64.size:
            raise ProtocolError("data frame shorter than its offset")
        return U64.unpack_from(self.payload)[0], self.payload[U64.size :]

    def u64(self) -> int:
        if len(self.payload) != U64.size:
            raise ProtocolError(f"frame 0x{self.type:02x} must carry 8 bytes")
        value: int = U64.unpack(self.payload)[0]
        return value


def encode(type_: int, id_: int, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """One frame as bytes (the payload copied once, whatever buffer it comes in)."""
    limit = MAX_START_PAYLOAD if type_ == START else MAX_PAYLOAD
    if len(payload) > limit:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {limit}")
    return HEADER.pack(len(payload) + 5, type_, id_) + payload


def json_payload(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def encode_json(type_: int, id_: int, value: Any) -> bytes:
    return encode(type_, id_, json_payload(value))


def encode_u64(type_: int, id_: int, value: int) -> bytes:
    return encode(type_, id_, U64.pack(value))


def parse_header(header: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int, int]:
    """``(payload length, type, id)`` of the 9-byte header at ``offset``; a length out of bounds is a
    ProtocolError."""
    length, type_, id_ = HEADER.unpack_from(header, offset)
    if length < 5 or length > MAX_FRAME_BODY:
        raise ProtocolError(f"frame length {length} out of bounds [5, {MAX_FRAME_BODY}]")
    return length - 5, type_, id_


DATA_TYPES = frozenset({STDOUT, STDERR})


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive (any bytes-like object: it is copied before ``feed``
    returns), take whole frames. Each byte is copied into the decoder's buffer once and out of it once, into
    its frame's payload; each feed moves only the unparsed rest (less than a frame), so large reads stay linear."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        buf = self._buf
        buf += data
        frames = []
        pos, end = 0, len(buf)
        with memoryview(buf) as view:  # slices of a view copy once (a bytearray's slice would copy twice)
            while end - pos >= HEADER_SIZE:
                size, type_, id_ = parse_header(buf, pos)
                stop = pos + HEADER_SIZE + size
                if stop > end:
                    break
                start = pos + HEADER_SIZE
                if type_ in DATA_TYPES and size >= U64.size:
                    frames.append(
                        Frame(
                            type_, id_, bytes(view[start + U64.size : stop]), U64.unpack_from(buf, start)[0]
                        )
                    )
                else:
                    frames.append(Frame(type_, id_, bytes(view[start:stop])))
                pos = stop
        del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buf)
