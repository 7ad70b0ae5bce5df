package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The tests drive the agent's own code: one agent for the test process (its reaper, like serve's, collects
// every zombie child it does not hold, so two would take each other's), and a connection per test over a
// socketpair, served by conn.serve exactly as acceptLoop serves a unix socket's.
var testAgent *agent

func TestMain(m *testing.M) {
	// the agent re-executes itself (/proc/self/exe) as a pty command's terminal leader and, where a memfd
	// cannot be run, as a group holder: here that is the test binary, which then does what main would
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "hold":
			os.Exit(0)
		case "pty":
			os.Exit(ptyLead())
		}
	}
	_ = prctl(prSetChildSubreaper, 1)
	makeHolder()
	testAgent = newAgent()
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond) // a SIGCHLD merged with another is not missed for long
		for {
			select {
			case <-sigs:
			case <-tick.C:
			}
			testAgent.reapChildren()
		}
	}()
	os.Exit(m.Run())
}

var nextID atomic.Uint32

func newID() uint32 { return nextID.Add(1) + 1000 }

// client is the test's end of one connection to the agent.
type client struct {
	t      *testing.T
	c      net.Conn
	frames chan frame
	held   []frame // read while waiting for another frame
	done   chan bool
}

// socketPair gives two connected unix stream sockets as net.Conns.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// dial serves a new connection of testAgent and returns its client, before HELLO.
func dial(t *testing.T) *client {
	t.Helper()
	ours, theirs := socketPair(t)
	cl := &client{t: t, c: ours, frames: make(chan frame, 1024), done: make(chan bool, 1)}
	go func() { cl.done <- testAgent.newConn(theirs).serve() }()
	go func() {
		defer close(cl.frames)
		for {
			f, err := readFrame(ours)
			if err != nil {
				return
			}
			cl.frames <- f
		}
	}()
	t.Cleanup(func() { ours.Close() })
	return cl
}

// hello dials and completes the handshake.
func hello(t *testing.T) *client {
	t.Helper()
	cl := dial(t)
	cl.sendJSON(tHello, 0, map[string]any{"version": ProtocolVersion})
	cl.expect(tHelloReply, 0)
	return cl
}

func (cl *client) send(typ byte, id uint32, payload []byte) {
	cl.t.Helper()
	b := appendHeader(nil, typ, id, len(payload))
	if _, err := cl.c.Write(append(b, payload...)); err != nil {
		cl.t.Fatalf("send 0x%02x: %v", typ, err)
	}
}

func (cl *client) sendJSON(typ byte, id uint32, v any) {
	cl.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.send(typ, id, b)
}

func (cl *client) credit(id uint32, n uint64) {
	cl.t.Helper()
	cl.send(tCredit, id, binary.BigEndian.AppendUint64(nil, n))
}

// next is the next frame for id of one of types (others are kept for a later call), within 10 s.
func (cl *client) next(id uint32, types ...byte) frame {
	cl.t.Helper()
	match := func(f frame) bool {
		if f.id != id {
			return false
		}
		for _, t := range types {
			if f.typ == t {
				return true
			}
		}
		return false
	}
	for i, f := range cl.held {
		if match(f) {
			cl.held = append(cl.held[:i], cl.held[i+1:]...)
			return f
		}
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case f, ok := <-cl.frames:
			if !ok {
				cl.t.Fatalf("connection closed waiting for 0x%02x of %d", types, id)
			}
			if match(f) {
				return f
			}
			cl.held = append(cl.held, f)
		case <-timeout:
			held := ""
			for _, f := range cl.held {
				held += fmt.Sprintf(" 0x%02x/%d %.80q", f.typ, f.id, f.payload)
			}
			cl.t.Fatalf("no frame %x for %d in 10 s; held:%s", types, id, held)
		}
	}
}

// expect is next, decoding a JSON payload.
func (cl *client) expect(typ byte, id uint32) map[string]any {
	cl.t.Helper()
	f := cl.next(id, typ)
	m := map[string]any{}
	if len(f.payload) > 0 {
		if err := json.Unmarshal(f.payload, &m); err != nil {
			cl.t.Fatalf("frame 0x%02x: %v: %q", typ, err, f.payload)
		}
	}
	return m
}

// expectError waits for an ERROR for id and checks its code.
func (cl *client) expectError(id uint32, code string) map[string]any {
	cl.t.Helper()
	m := cl.expect(tError, id)
	if m["code"] != code {
		cl.t.Fatalf("ERROR code %v, want %s (%v)", m["code"], code, m["message"])
	}
	return m
}

// closedBy waits for the agent to end the connection and reports whether serve saw the peer end it.
func (cl *client) closedBy() (peerEnded bool) {
	cl.t.Helper()
	select {
	case p := <-cl.done:
		return p
	case <-time.After(10 * time.Second):
		cl.t.Fatal("the agent kept the connection open")
	}
	return false
}

// output is what a command wrote and how it exited: its streams are read to their EOF and then the EXIT.
type output struct {
	streams map[string][]byte
	exit    map[string]any
}

// collect reads a started command's frames (crediting as it reads) until its EXIT after every stream's EOF.
func (cl *client) collect(id uint32, nstreams int) output {
	cl.t.Helper()
	return cl.collectAfter(id, nstreams, nil)
}

// collectAfter is collect for a command whose first stdout bytes were read already.
func (cl *client) collectAfter(id uint32, nstreams int, stdout []byte) output {
	cl.t.Helper()
	out := output{streams: map[string][]byte{"stdout": stdout, "stderr": nil}}
	eofs := 0
	for eofs < nstreams || out.exit == nil {
		f := cl.next(id, tStdout, tStderr, tEOF, tExit, tLost)
		switch f.typ {
		case tStdout, tStderr:
			name := map[byte]string{tStdout: "stdout", tStderr: "stderr"}[f.typ]
			off := binary.BigEndian.Uint64(f.payload)
			if off != uint64(len(out.streams[name])) {
				cl.t.Fatalf("%s chunk at %d, want %d", name, off, len(out.streams[name]))
			}
			out.streams[name] = append(out.streams[name], f.payload[offsetSize:]...)
			cl.credit(id, uint64(len(f.payload)-offsetSize))
		case tEOF:
			eofs++
		case tExit:
			if err := json.Unmarshal(f.payload, &out.exit); err != nil {
				cl.t.Fatal(err)
			}
		case tLost:
			cl.t.Fatalf("LOST while reading from the start: %s", f.payload)
		}
	}
	return out
}

// run starts argv without a pty and returns its output and exit.
func (cl *client) run(req map[string]any) (uint32, output) {
	cl.t.Helper()
	id := newID()
	if _, ok := req["window"]; !ok {
		req["window"] = 1 << 20
	}
	cl.sendJSON(tStart, id, req)
	cl.expect(tStarted, id)
	n := 2
	if pty, _ := req["pty"].(bool); pty {
		n = 1
	}
	out := cl.collect(id, n)
	cl.release(id)
	return id, out
}

func (cl *client) release(id uint32) {
	cl.t.Helper()
	cl.send(tRelease, id, nil)
	cl.next(id, tReleased)
}
