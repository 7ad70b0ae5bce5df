package main

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func TestStdinIsWrittenAndItsCreditReturned(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"cat"}, "window": 1 << 20})
	if m := cl.expect(tStarted, id); m["stdin_window"] != float64(stdinWindow) {
		t.Fatal(m)
	}
	cl.send(tStdin, id, []byte("hello"))
	if f := cl.next(id, tStdinCredit); len(f.payload) != creditSize || binary.BigEndian.Uint64(f.payload) != 5 {
		t.Fatalf("STDIN_CREDIT % x", f.payload)
	}
	big := bytes.Repeat([]byte("z"), maxPayload)
	cl.send(tStdin, id, big)
	cl.send(tStdinClose, id, nil)
	returned := uint64(0)
	for returned < uint64(len(big)) {
		returned += binary.BigEndian.Uint64(cl.next(id, tStdinCredit).payload)
	}
	out := cl.collect(id, 2)
	if !bytes.Equal(out.streams["stdout"], append([]byte("hello"), big...)) || out.exit["code"] != 0.0 {
		t.Fatalf("%d bytes out, exit %v", len(out.streams["stdout"]), out.exit)
	}
	cl.send(tStdin, id, []byte("late"))
	cl.expectError(id, "EPIPE")
	cl.release(id)
}

// A command that closed its stdin drops what it is sent (the contract's rule), and the credit still returns.
func TestStdinToAClosedStdinIsDroppedAndCredited(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"/bin/sh", "-c", "exec <&-; echo ready; sleep 30"}, "window": 1 << 20})
	cl.expect(tStarted, id)
	cl.next(id, tStdout)
	for i := 0; i < 3; i++ {
		cl.send(tStdin, id, []byte("dropped"))
		if n := binary.BigEndian.Uint64(cl.next(id, tStdinCredit).payload); n != 7 {
			t.Fatalf("credit %d", n)
		}
	}
	cl.send(tKill, id, nil)
	cl.expect(tKilled, id)
	cl.release(id)
}

// More stdin than the window granted is a protocol error: the connection closes, the command lives on.
func TestStdinBeyondTheWindowClosesTheConnectionNotTheCommand(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}})
	cl.expect(tStarted, id)
	chunk := make([]byte, maxPayload)
	for sent := 0; sent <= stdinWindow+2*pipeSize; sent += len(chunk) {
		if _, err := cl.c.Write(encode(tStdin, id, chunk)); err != nil {
			break // the agent closed the connection
		}
	}
	var code string
	for f := range cl.frames {
		if f.typ == tError {
			code = string(f.payload)
		}
	}
	if !strings.Contains(code, `"EPROTO"`) || !strings.Contains(code, "window") {
		t.Fatalf("ERROR %s", code)
	}
	cl2 := hello(t)
	cl2.send(tList, 1, nil)
	running := false
	for _, e := range cl2.decodeList(cl2.next(1, tListReply)) {
		if e["id"] == float64(id) {
			running = e["running"] == true
		}
	}
	if !running {
		t.Fatal("the command did not outlive its connection")
	}
	cl2.sendJSON(tAttach, id, map[string]any{"stdout": 0, "stderr": 0, "window": 0})
	cl2.expect(tAttached, id)
	cl2.send(tKill, id, nil)
	cl2.expect(tKilled, id)
	cl2.release(id)
}
