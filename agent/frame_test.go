package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The frame types of PROTOCOL.md's tables, by name: a type added or renumbered in one place and not the
// other fails TestFrameTypesMatchProtocolMd.
var clientTypes = map[string]byte{
	"HELLO": tHello, "PING": tPing, "START": tStart, "STDIN": tStdin, "STDIN_CLOSE": tStdinClose,
	"RESIZE": tResize, "SIGNAL": tSignal, "KILL": tKill, "CREDIT": tCredit, "ATTACH": tAttach,
	"RELEASE": tRelease, "LIST": tList, "CONNECT": tConnect,
	"FILE_STAT": tFileStat, "FILE_LIST": tFileList, "FILE_READ": tFileRead, "UPLOAD_OPEN": tUploadOpen,
	"UPLOAD_DATA": tUploadData, "UPLOAD_COMMIT": tUploadCommit, "UPLOAD_ABORT": tUploadAbort,
	"FILE_DELETE": tFileDelete, "FILE_RENAME": tFileRename, "FILE_MKDIR": tFileMkdir,
}

var agentTypes = map[string]byte{
	"HELLO": tHelloReply, "PONG": tPong, "STARTED": tStarted, "STDOUT": tStdout, "STDERR": tStderr,
	"EOF": tEOF, "EXIT": tExit, "LOST": tLost, "STDIN_CREDIT": tStdinCredit, "KILLED": tKilled,
	"RELEASED": tReleased, "LIST": tListReply, "ATTACHED": tAttached, "DETACHED": tDetached, "ACK": tAck,
	"ERROR": tError, "FILE_REPLY": tFileReply, "FILE_DATA": tFileData,
}

func encode(typ byte, id uint32, payload []byte) []byte {
	return append(appendHeader(nil, typ, id, len(payload)), payload...)
}

func TestFrameRoundTripsEveryType(t *testing.T) {
	payloads := [][]byte{nil, {}, []byte(`{"version":1}`), bytes.Repeat([]byte{0xff}, 1000), make([]byte, maxPayload)}
	for _, types := range []map[string]byte{clientTypes, agentTypes} {
		for name, typ := range types {
			for _, id := range []uint32{0, 1, 0xdeadbeef, ^uint32(0)} {
				for _, p := range payloads {
					b := encode(typ, id, p)
					if got := binary.BigEndian.Uint32(b); got != uint32(len(p)+5) {
						t.Fatalf("%s: length %d for a payload of %d", name, got, len(p))
					}
					f, err := readFrame(bytes.NewReader(b))
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if f.typ != typ || f.id != id || !bytes.Equal(f.payload, p) {
						t.Fatalf("%s id %d: decoded type 0x%02x id %d, %d payload bytes", name, id, f.typ, f.id, len(f.payload))
					}
				}
			}
		}
	}
}

func TestFrameHeaderIsBigEndianLengthTypeId(t *testing.T) {
	got := encode(tStdout, 0x01020304, []byte("hi"))
	want := []byte{0, 0, 0, 7, 0x91, 1, 2, 3, 4, 'h', 'i'}
	if !bytes.Equal(got, want) {
		t.Fatalf("% x, want % x", got, want)
	}
}

func TestFrameReadsBackToBackFrames(t *testing.T) {
	var stream []byte
	for i := 0; i < 100; i++ {
		stream = append(stream, encode(tStdin, uint32(i), bytes.Repeat([]byte{byte(i)}, i))...)
	}
	r := bytes.NewReader(stream)
	for i := 0; i < 100; i++ {
		f, err := readFrame(r)
		if err != nil || f.id != uint32(i) || len(f.payload) != i {
			t.Fatalf("frame %d: %v %+v", i, err, f)
		}
	}
	if _, err := readFrame(r); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

func TestFrameLengthBounds(t *testing.T) {
	for _, n := range []uint32{0, 1, 4} {
		b := binary.BigEndian.AppendUint32(nil, n)
		b = append(b, 0x02, 0, 0, 0, 0)
		_, err := readFrame(bytes.NewReader(b))
		if err == nil || !strings.Contains(err.Error(), "below the header") {
			t.Fatalf("length %d: %v, want below the header", n, err)
		}
	}
	for _, n := range []uint32{maxFrameBody + 1, 1 << 31, ^uint32(0)} {
		b := binary.BigEndian.AppendUint32(nil, n)
		b = append(b, 0x02, 0, 0, 0, 0)
		if _, err := readFrame(bytes.NewReader(b)); !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("length %d: %v, want errFrameTooLarge", n, err)
		}
	}
	// exactly the bounds are accepted
	if f, err := readFrame(bytes.NewReader(encode(tPing, 9, nil))); err != nil || f.payload != nil {
		t.Fatalf("length 5: %v %+v", err, f)
	}
	if f, err := readFrame(bytes.NewReader(encode(tPing, 9, make([]byte, maxPayload)))); err != nil || len(f.payload) != maxPayload {
		t.Fatalf("length %d: %v", maxFrameBody, err)
	}
}

// countingReader reports how many bytes were asked of it: an oversized length must be refused before its
// body is read (or allocated).
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestFrameOversizedIsRefusedBeforeItsBody(t *testing.T) {
	b := binary.BigEndian.AppendUint32(nil, maxFrameBody+1)
	b = append(b, 0x11, 0, 0, 0, 1)
	b = append(b, make([]byte, 4096)...)
	cr := &countingReader{r: bytes.NewReader(b)}
	if _, err := readFrame(cr); !errors.Is(err, errFrameTooLarge) {
		t.Fatal(err)
	}
	if cr.n != headerSize {
		t.Fatalf("read %d bytes, want only the %d of the header", cr.n, headerSize)
	}
}

func TestFrameTruncated(t *testing.T) {
	full := encode(tStart, 7, []byte(`{"argv":["true"]}`))
	for cut := 1; cut < len(full); cut++ {
		_, err := readFrame(bytes.NewReader(full[:cut]))
		// a whole header and not one byte of its payload is io.EOF from the payload's ReadFull
		if !errors.Is(err, io.ErrUnexpectedEOF) && !(cut == headerSize && err == io.EOF) {
			t.Fatalf("cut at %d of %d: %v, want ErrUnexpectedEOF", cut, len(full), err)
		}
		if !isEOF(err) {
			t.Fatalf("cut at %d: a truncated frame must read as the peer's end", cut)
		}
	}
	if _, err := readFrame(bytes.NewReader(nil)); err != io.EOF {
		t.Fatalf("empty stream: %v", err)
	}
}

func TestFrameTypesMatchProtocolMd(t *testing.T) {
	docBytes, err := os.ReadFile("PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(docBytes)
	// every "| 0xNN | NAME |" row of the client and agent tables
	rows := map[byte][]string{}
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "0x") {
			continue
		}
		name := strings.TrimSpace(cells[2])
		for _, code := range strings.Split(cells[1], "/") {
			var v byte
			if _, err := fmt.Sscanf(strings.TrimSpace(code), "0x%x", &v); err != nil {
				t.Fatalf("row %q: %v", line, err)
			}
			rows[v] = append(rows[v], name)
		}
	}
	all := map[byte]string{}
	for name, v := range clientTypes {
		all[v] = name
	}
	for name, v := range agentTypes {
		all[v] = name
	}
	// types named in prose: "`CONNECT` (0x1A)", "`FILE_REPLY` (0xA0, JSON)"
	for _, m := range proseType.FindAllStringSubmatch(doc, -1) {
		var v byte
		if _, err := fmt.Sscanf(m[2], "0x%x", &v); err != nil {
			t.Fatal(err)
		}
		rows[v] = append(rows[v], m[1])
	}
	for v, name := range all {
		names, ok := rows[v]
		if !ok {
			t.Errorf("0x%02x %s has no row in PROTOCOL.md", v, name)
			continue
		}
		if !strings.Contains(strings.Join(names, " "), strings.SplitN(name, "_", 2)[0]) {
			t.Errorf("0x%02x is %s here and %v in PROTOCOL.md", v, name, names)
		}
	}
	for v, names := range rows {
		if _, ok := all[v]; !ok {
			t.Errorf("PROTOCOL.md's 0x%02x %v is not a frame type of the agent", v, names)
		}
	}
}

// Every client frame type has a shape the agent accepts and, where it takes a fixed shape, one it refuses.
func TestCheckShapeEveryClientType(t *testing.T) {
	good := map[byte][]byte{
		tPing: []byte("x"), tStart: []byte(`{}`), tStdin: []byte("x"), tStdinClose: nil, tResize: []byte(`{}`),
		tSignal: []byte(`{}`), tKill: nil, tCredit: make([]byte, 8), tAttach: []byte(`{}`), tRelease: nil,
		tList: nil, tConnect: []byte(`{}`), tFileStat: []byte(`{}`), tFileList: []byte(`{}`),
		tFileRead: []byte(`{}`), tUploadOpen: []byte(`{}`), tUploadData: make([]byte, 8),
		tUploadCommit: nil, tUploadAbort: nil, tFileDelete: []byte(`{}`), tFileRename: []byte(`{}`),
		tFileMkdir: []byte(`{}`),
	}
	bad := map[byte][][]byte{
		tCredit:     {nil, make([]byte, 7), make([]byte, 9)},
		tStdinClose: {{0}}, tKill: {{0}}, tRelease: {{0}}, tList: {{0}},
		tStart:  {nil, []byte(`[]`), []byte(" {}"), append([]byte("{"), make([]byte, maxStartLen)...)},
		tResize: {nil}, tSignal: {nil}, tAttach: {nil}, tConnect: {nil},
		tFileStat: {nil, []byte(`"x"`)}, tFileRename: {nil}, tFileMkdir: {nil}, tFileDelete: {nil},
		tFileList: {nil}, tFileRead: {nil}, tUploadOpen: {nil},
	}
	for name, typ := range clientTypes {
		if typ == tHello {
			continue // HELLO is the handshake's, before any other frame
		}
		p, ok := good[typ]
		if !ok {
			t.Fatalf("%s has no good shape in this test", name)
		}
		if err := checkShape(frame{typ: typ, id: 1, payload: p}); err != nil {
			t.Errorf("%s %q: %v", name, p, err)
		}
		for _, p := range bad[typ] {
			if err := checkShape(frame{typ: typ, id: 1, payload: p}); err == nil {
				t.Errorf("%s with %d bytes %.10q accepted", name, len(p), p)
			}
		}
	}
	for _, typ := range []byte{0x00, tHello, 0x03, 0x1B, 0x2F, 0x3A, tHelloReply, tStdout, tError, 0xFF} {
		if err := checkShape(frame{typ: typ}); err == nil || !strings.Contains(err.Error(), "unknown frame type") {
			t.Errorf("type 0x%02x: %v, want unknown", typ, err)
		}
	}
}

func TestDecodeControlRefusesUnknownFieldsAndOversize(t *testing.T) {
	var req startRequest
	if err := decodeControl([]byte(`{"argv":["a"],"env":["K=V"],"window":5}`), &req); err != nil || req.Argv[0] != "a" || req.Window != 5 {
		t.Fatalf("%v %+v", err, req)
	}
	for _, p := range []string{`{"argv":["a"],"nope":1}`, `{"argv":"a"}`, `{`, ``, `{"window":-1}`} {
		if err := decodeControl([]byte(p), &startRequest{}); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
	big := `{"label":"` + strings.Repeat("x", maxControlLen) + `"}`
	if err := decodeControl([]byte(big), &startRequest{}); err == nil || !strings.Contains(err.Error(), "control payload") {
		t.Fatalf("a %d-byte payload: %v", len(big), err)
	}
}

// A START carries the contract's 1 MiB of argv and env however it is escaped; no other frame grows with it.
func TestAStartFrameCarriesTheContractsArgvAndEnvJSONEscaped(t *testing.T) {
	arg := strings.Repeat("\x01", 128<<10-1) // one string at Linux's MAX_ARG_STRLEN, each byte 6 in JSON
	argv := make([]string, 8)
	for i := range argv {
		argv[i] = arg
	}
	payload, err := json.Marshal(map[string]any{"argv": argv})
	must(t, err)
	if len(payload) <= maxFrameBody {
		t.Fatalf("the payload (%d bytes) does not test past one ordinary frame", len(payload))
	}
	f, err := readFrame(bytes.NewReader(encode(tStart, 3, payload)))
	must(t, err)
	if err := checkShape(f); err != nil {
		t.Fatal(err)
	}
	var req startRequest
	if err := decodeJSON(f.payload, maxStartLen, &req); err != nil || len(req.Argv) != 8 {
		t.Fatalf("%v %d", err, len(req.Argv))
	}
	if _, err := readFrame(bytes.NewReader(encode(tAttach, 3, payload))); err != errFrameTooLarge {
		t.Fatalf("an ATTACH of %d bytes: %v", len(payload), err)
	}
	if _, err := readFrame(bytes.NewReader(encode(tStart, 3, make([]byte, maxStartLen+1)))); err != errFrameTooLarge {
		t.Fatalf("a START past its limit: %v", err)
	}
}

var proseType = regexp.MustCompile("`([A-Z_]+)` \\((0x[0-9A-Fa-f]{2})")
