package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
)

// The fuzz targets feed the agent's decoders what a client could send. Each must return an error or a value,
// never panic, and never allocate more than the frame's bound. Seeds: testdata/fuzz/<target>/ (committed)
// and the f.Add calls. CI runs each for a bounded time (.ci/run); `go test` alone runs the seeds.

// FuzzFrameDecode reads frames from any byte stream: a frame that decodes re-encodes to the same bytes and
// stays within the bounds; a length out of bounds is refused before its body is read.
func FuzzFrameDecode(f *testing.F) {
	f.Add(encode(tHello, 0, []byte(`{"version":1}`)))
	f.Add(encode(tCredit, 5, make([]byte, 8)))
	f.Add(append(encode(tPing, 1, nil), encode(tStdin, 2, []byte("abc"))...))
	f.Add([]byte{0, 0, 0, 4, 1, 0, 0, 0, 0})
	f.Add([]byte{0x00, 0x10, 0x00, 0x01, 0x11, 0, 0, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x11, 0, 0, 0, 1})
	f.Add([]byte{0, 0, 0, 9, 0x10})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &countingReader{r: bytes.NewReader(data)}
		consumed := 0
		for {
			fr, err := readFrame(r)
			if err != nil {
				if errors.Is(err, errFrameTooLarge) && r.n != consumed+headerSize {
					t.Fatalf("an oversized frame's body was read (%d bytes past its header)", r.n-consumed-headerSize)
				}
				if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, errFrameTooLarge) &&
					!strings.Contains(err.Error(), "below the header") {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(fr.payload) > maxPayload {
				t.Fatalf("a payload of %d bytes", len(fr.payload))
			}
			again := encode(fr.typ, fr.id, fr.payload)
			if !bytes.Equal(again, data[consumed:r.n]) {
				t.Fatalf("re-encoded % x, read % x", again, data[consumed:r.n])
			}
			consumed = r.n
			_ = checkShape(fr) // any type, any payload: an error or nil
		}
	})
}

// FuzzHello decodes a HELLO as serve does.
func FuzzHello(f *testing.F) {
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"nonce":"0123456789abcdef","time":1733366400.5,"seed":"00ff"}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":"1"}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		var h helloRequest
		if json.Unmarshal(p, &h) != nil {
			return
		}
		// what the reply would echo is bounded whatever was sent
		if h.Nonce != "" && len(h.Nonce) <= maxNonce {
			if _, err := json.Marshal(map[string]any{"nonce": h.Nonce}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzStart decodes a START payload as handle does and derives what start derives before it forks.
func FuzzStart(f *testing.F) {
	f.Add([]byte(`{"argv":["/bin/sh","-c","echo hi"],"env":["PATH=/bin"],"cwd":"/tmp","window":1048576}`))
	f.Add([]byte(`{"argv":["bash"],"pty":true,"rows":24,"cols":80,"timeout_ms":1000,"label":"x"}`))
	f.Add([]byte(`{"argv":["id"],"uid":1000,"gid":100,"root":"/srv/img"}`))
	f.Add([]byte(`{"argv":["id"],"uid":-1}`))
	f.Add([]byte(`{"argv":[],"bogus":true}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		if checkShape(frame{typ: tStart, id: 1, payload: p}) != nil {
			return
		}
		var req startRequest
		if err := decodeJSON(p, maxStartLen, &req); err != nil {
			return
		}
		if len(p) > maxStartLen {
			t.Fatalf("a %d-byte payload decoded", len(p))
		}
		cred := req.credential()
		if (req.Uid == nil && req.Gid == nil) != (cred == nil) {
			t.Fatalf("credential %+v for uid %v gid %v", cred, req.Uid, req.Gid)
		}
		if cred != nil && len(cred.Groups) != 0 {
			t.Fatal("a command kept supplementary groups")
		}
	})
}

// FuzzControl decodes the small control payloads (RESIZE, SIGNAL, ATTACH, CONNECT) by frame type, and the
// binary ones (CREDIT, UPLOAD_DATA), as handle does.
func FuzzControl(f *testing.F) {
	f.Add(tResize, []byte(`{"rows":40,"cols":120}`))
	f.Add(tSignal, []byte(`{"signal":15,"group":true}`))
	f.Add(tAttach, []byte(`{"stdout":1024,"stderr":0,"window":1048576}`))
	f.Add(tConnect, []byte(`{"host":"127.0.0.1","port":8888,"window":65536}`))
	f.Add(tCredit, binary.BigEndian.AppendUint64(nil, 1<<62))
	f.Add(tUploadData, append(binary.BigEndian.AppendUint64(nil, 10), "data"...))
	f.Add(tSignal, []byte(`{"signal":1e400}`))
	f.Fuzz(func(t *testing.T, typ byte, p []byte) {
		if checkShape(frame{typ: typ, id: 1, payload: p}) != nil {
			return
		}
		var err error
		switch typ {
		case tResize:
			err = decodeControl(p, &resizeRequest{})
		case tSignal:
			err = decodeControl(p, &signalRequest{})
		case tAttach:
			err = decodeControl(p, &attachRequest{})
		case tConnect:
			err = decodeControl(p, &connectRequest{})
		case tCredit:
			if len(p) != creditSize {
				t.Fatalf("CREDIT of %d bytes passed", len(p))
			}
			_ = binary.BigEndian.Uint64(p)
		}
		if err == nil && len(p) > maxControlLen {
			t.Fatalf("a %d-byte payload decoded", len(p))
		}
	})
}

// FuzzFileRequest decodes a file frame's payload as handleFile does, and splits its paths as the operations
// do: a last component is a plain name (a folder may still be absolute, "//x": openat2 refuses it, EXDEV).
func FuzzFileRequest(f *testing.F) {
	f.Add(tFileStat, []byte(`{"root":"/home/u","path":"a/b.txt"}`))
	f.Add(tFileRead, []byte(`{"root":"/w","path":"../etc/passwd","offset":-1,"length":9223372036854775807}`))
	f.Add(tUploadOpen, []byte(`{"root":"/w","path":"d/e/f","mode":4294967295,"parents":true,"uid":1,"gid":1}`))
	f.Add(tFileRename, []byte(`{"root":"/w","path":"a","to":"/abs","parents":true}`))
	f.Add(tFileDelete, []byte(`{"root":"/w","path":"a//b/","recursive":true}`))
	f.Add(tFileMkdir, []byte(`{"root":"/w","path":"..","uid":0}`))
	f.Fuzz(func(t *testing.T, typ byte, p []byte) {
		if checkShape(frame{typ: typ, id: 1, payload: p}) != nil {
			return
		}
		switch typ {
		case tFileStat, tFileList, tFileRead, tUploadOpen, tFileDelete, tFileRename, tFileMkdir:
		default:
			return
		}
		var req fileRequest
		if decodeControl(p, &req) != nil {
			return
		}
		if own, err := req.owner(); err == nil && own != nil && (own.uid < 0 || own.gid < 0) {
			t.Fatalf("owner %+v", own)
		}
		for _, path := range []string{req.Path, req.To} {
			dir, base, err := splitParent(path)
			if err != nil {
				continue
			}
			if dir == "" || strings.Contains(base, "/") || base == "." || base == ".." || base == "" {
				t.Fatalf("%q split into %q and %q", path, dir, base)
			}
		}
		if fd, err := openRoot(req.Root); err == nil {
			syscall.Close(fd)
			if !strings.HasPrefix(req.Root, "/") {
				t.Fatalf("relative root %q opened", req.Root)
			}
		}
	})
}
