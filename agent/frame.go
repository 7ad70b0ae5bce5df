package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ProtocolVersion is the version both sides announce in HELLO; a different major closes the connection.
const ProtocolVersion = 1

const (
	headerSize    = 9       // length (4) + type (1) + id (4)
	maxFrameBody  = 1 << 20 // type + id + payload, at most 1 MiB
	maxPayload    = maxFrameBody - 5
	dataChunk     = 512 << 10 // output sent in chunks this size at most, so one busy command shares the link
	offsetSize    = 8
	creditSize    = 8
	maxControlLen = 64 << 10 // JSON payloads (ATTACH, RESIZE, file requests...) stay small
	// a START carries the contract's 1 MiB of argv and env (MAX_COMMAND_BYTES), JSON-escaped: at most 6 bytes a byte
	maxStartLen  = 8 << 20
	maxStartBody = maxStartLen + 5
)

// maxBody is the longest frame body (type, id, payload) a frame of type typ may have.
func maxBody(typ byte) uint32 {
	if typ == tStart {
		return maxStartBody
	}
	return maxFrameBody
}

// Frame types, client to agent.
const (
	tHello      byte = 0x01
	tPing       byte = 0x02
	tStart      byte = 0x10
	tStdin      byte = 0x11
	tStdinClose byte = 0x12
	tResize     byte = 0x13
	tSignal     byte = 0x14
	tKill       byte = 0x15
	tCredit     byte = 0x16
	tAttach     byte = 0x17
	tRelease    byte = 0x18
	tList       byte = 0x19
	tConnect    byte = 0x1A
)

// Frame types, agent to client.
const (
	tHelloReply  byte = 0x81
	tPong        byte = 0x82
	tStarted     byte = 0x90
	tStdout      byte = 0x91
	tStderr      byte = 0x92
	tEOF         byte = 0x93
	tExit        byte = 0x94
	tLost        byte = 0x95
	tStdinCredit byte = 0x96
	tKilled      byte = 0x97
	tReleased    byte = 0x98
	tListReply   byte = 0x99
	tAttached    byte = 0x9A
	tDetached    byte = 0x9B
	tAck         byte = 0x9C
	tError       byte = 0xEE
)

type frame struct {
	typ     byte
	id      uint32
	payload []byte
}

var errFrameTooLarge = errors.New("frame too large")

// readFrame reads one frame; a length below 5 or above its type's maxBody is a protocol error.
func readFrame(r io.Reader) (frame, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	n := binary.BigEndian.Uint32(h[0:4])
	if n < 5 {
		return frame{}, fmt.Errorf("frame length %d below the header", n)
	}
	if n > maxBody(h[4]) {
		return frame{}, errFrameTooLarge
	}
	f := frame{typ: h[4], id: binary.BigEndian.Uint32(h[5:9])}
	if n > 5 {
		f.payload = make([]byte, n-5)
		if _, err := io.ReadFull(r, f.payload); err != nil {
			return frame{}, err
		}
	}
	return f, nil
}

func appendHeader(b []byte, typ byte, id uint32, payloadLen int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(payloadLen+5))
	b = append(b, typ)
	return binary.BigEndian.AppendUint32(b, id)
}
