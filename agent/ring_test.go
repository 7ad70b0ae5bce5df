package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A ring after compact keeps every unsent byte and the newest sent ones up to ringSize, in a fresh array
// of twice ringSize, with offsets unchanged.
func TestRingCompactKeepsUnsentAndNewestBytes(t *testing.T) {
	data := make([]byte, ringSize+ringSize/2)
	for i := range data {
		data[i] = byte(i * 7)
	}
	s := &stream{buf: append([]byte(nil), data...), end: uint64(len(data)), sent: uint64(len(data)) - 100}
	old := s.buf
	s.compact()
	if s.start != s.end-ringSize || s.end != uint64(len(data)) {
		t.Fatalf("start %d end %d", s.start, s.end)
	}
	if cap(s.buf) != 2*ringSize || !bytes.Equal(s.buf, data[s.start:]) {
		t.Fatal("compact lost or moved bytes")
	}
	if &old[0] == &s.buf[0] || !bytes.Equal(old, data) {
		t.Fatal("compact wrote into the array a sender may still be writing from")
	}
	// fewer than ringSize sent: everything from the first unsent byte is kept even beyond ringSize back
	s = &stream{buf: append([]byte(nil), data...), end: uint64(len(data)), sent: 10}
	s.compact()
	if s.start != 10 || !bytes.Equal(s.buf, data[10:]) {
		t.Fatalf("start %d: an unsent byte was dropped", s.start)
	}
	// a short stream keeps all
	s = &stream{buf: []byte("abc"), end: 3, sent: 3}
	s.compact()
	if s.start != 0 || string(s.buf) != "abc" {
		t.Fatalf("start %d buf %q", s.start, s.buf)
	}
}

// The agent sends output only within the client's credit, and resumes exactly at each CREDIT.
func TestOutputStaysWithinTheCreditWindow(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"head", "-c", "100000", "/dev/zero"}, "window": 1000})
	cl.expect(tStarted, id)
	got := 0
	for got < 1000 {
		f := cl.next(id, tStdout)
		if off := binary.BigEndian.Uint64(f.payload); off != uint64(got) {
			t.Fatalf("offset %d, want %d", off, got)
		}
		got += len(f.payload) - offsetSize
	}
	if got != 1000 {
		t.Fatalf("%d bytes for a window of 1000", got)
	}
	select {
	case f := <-cl.frames:
		if f.typ == tStdout {
			t.Fatalf("STDOUT beyond the window (offset %d)", binary.BigEndian.Uint64(f.payload))
		}
		cl.held = append(cl.held, f)
	case <-time.After(300 * time.Millisecond):
	}
	cl.credit(id, 500)
	f := cl.next(id, tStdout)
	if off, n := binary.BigEndian.Uint64(f.payload), len(f.payload)-offsetSize; off != 1000 || n > 500 {
		t.Fatalf("after a credit of 500: %d bytes at %d", n, off)
	}
	cl.credit(id, 1<<20)
	out := cl.collectAfter(id, 2, make([]byte, 1000+len(f.payload)-offsetSize))
	if len(out.streams["stdout"]) != 100000 || out.exit["code"] != 0.0 {
		t.Fatalf("%d bytes, exit %v", len(out.streams["stdout"]), out.exit)
	}
	cl.release(id)
}

// Chunks are at most dataChunk even with a larger credit, so one command shares the link.
func TestOutputChunksAreBounded(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"head", "-c", "3000000", "/dev/zero"}, "window": 1 << 30})
	cl.expect(tStarted, id)
	total := 0
	for total < 3000000 {
		f := cl.next(id, tStdout)
		n := len(f.payload) - offsetSize
		if n > dataChunk || n <= 0 {
			t.Fatalf("a chunk of %d bytes", n)
		}
		total += n
	}
	cl.collectAfter(id, 2, make([]byte, total))
	cl.release(id)
}

// A client that attaches at an offset the ring no longer holds is told LOST [from, to) and resumes at to;
// at an offset it holds, it gets exactly the bytes from there; past the end is ERANGE.
func TestAttachResumesOrReportsLost(t *testing.T) {
	const size = 3 << 20
	cl := hello(t)
	id := newID()
	// a pattern where each byte tells its offset (mod 251), so a resumed byte can be checked in place
	pattern := make([]byte, size)
	for i := range pattern {
		pattern[i] = byte(i % 251)
	}
	file := filepath.Join(t.TempDir(), "pattern")
	if err := os.WriteFile(file, pattern, 0o644); err != nil {
		t.Fatal(err)
	}
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"cat", file}, "window": 1 << 40})
	cl.expect(tStarted, id)
	out := cl.collect(id, 2)
	if len(out.streams["stdout"]) != size {
		t.Fatalf("%d bytes", len(out.streams["stdout"]))
	}
	if !bytes.Equal(out.streams["stdout"], pattern) {
		t.Fatal("the output is not the file")
	}
	cl2 := hello(t)
	cl2.sendJSON(tAttach, id, map[string]any{"stdout": size + 1, "stderr": 0, "window": 1 << 20})
	cl2.expectError(id, "ERANGE")

	cl2.sendJSON(tAttach, id, map[string]any{"stdout": 0, "stderr": 0, "window": 1 << 30})
	att := cl2.expect(tAttached, id)
	if att["running"] != false {
		t.Fatal(att)
	}
	// the first connection lost the command to the second
	cl.next(id, tDetached)
	rng := att["stdout"].(map[string]any)
	start, end := uint64(rng["start"].(float64)), uint64(rng["end"].(float64))
	if end != size || start == 0 || end-start < ringSize || end-start > 2*ringSize {
		t.Fatalf("ring [%d, %d) for %d bytes: it keeps between ring and twice ring", start, end, size)
	}
	lost := cl2.expect(tLost, id)
	if lost["stream"] != "stdout" || lost["from"] != 0.0 || lost["to"] != float64(start) {
		t.Fatalf("LOST %v, want [0, %d)", lost, start)
	}
	f := cl2.next(id, tStdout)
	if off := binary.BigEndian.Uint64(f.payload); off != start || f.payload[offsetSize] != byte(start%251) {
		t.Fatalf("resumed at %d with %d", off, f.payload[offsetSize])
	}
	// an offset the ring holds: exactly the bytes after it, nothing lost
	cl3 := hello(t)
	cl3.sendJSON(tAttach, id, map[string]any{"stdout": size - 10, "stderr": 0, "window": 1 << 20})
	cl3.expect(tAttached, id)
	out3 := cl3.collectAfter(id, 2, make([]byte, size-10))
	if !bytes.Equal(out3.streams["stdout"][size-10:], out.streams["stdout"][size-10:]) {
		t.Fatal("resumed bytes differ")
	}
	cl3.release(id)
}
