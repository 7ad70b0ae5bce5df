package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func sh(script string) map[string]any {
	return map[string]any{"argv": []string{"/bin/sh", "-c", script}}
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	state, _, err := procStat(pid)
	return err == nil && state != 'Z' && state != 'X'
}

func TestHelloAnnouncesTheLimits(t *testing.T) {
	cl := dial(t)
	cl.sendJSON(tHello, 0, map[string]any{"version": ProtocolVersion, "nonce": "abc"})
	m := cl.expect(tHelloReply, 0)
	want := map[string]float64{"version": ProtocolVersion, "max_frame": maxFrameBody, "max_commands": maxCommands,
		"ring": ringSize, "stdin_window": stdinWindow, "pid": float64(os.Getpid())}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	if m["nonce"] != "abc" {
		t.Errorf("nonce %v not echoed", m["nonce"])
	}
	if _, ok := m["refreshed"]; ok {
		t.Error("a socket's HELLO never refreshes the guest")
	}
}

func TestHelloOfAnotherVersionIsRefusedAndCloses(t *testing.T) {
	cl := dial(t)
	cl.sendJSON(tHello, 0, map[string]any{"version": ProtocolVersion + 1})
	cl.expectError(0, "EPROTONOSUPPORT")
	if cl.closedBy() {
		t.Fatal("the agent, not the peer, ends a connection of another version")
	}
}

func TestFirstFrameOtherThanHelloClosesWithEPROTO(t *testing.T) {
	cl := dial(t)
	cl.send(tPing, 1, []byte("x"))
	cl.expectError(0, "EPROTO")
	if cl.closedBy() {
		t.Fatal("want the agent to close")
	}
}

func TestProtocolErrorsCloseTheConnection(t *testing.T) {
	cases := map[string][]byte{
		"oversized length":    binary.BigEndian.AppendUint32(nil, maxFrameBody+1),
		"length below five":   {0, 0, 0, 4, 0x02, 0, 0, 0, 0},
		"unknown type":        encode(0x7f, 1, nil),
		"credit of 7 bytes":   encode(tCredit, 1, make([]byte, 7)),
		"payload on KILL":     encode(tKill, 1, []byte{1}),
		"START not JSON":      encode(tStart, 1, []byte("argv")),
		"START unknown field": encode(tStart, 1, []byte(`{"argv":["true"],"bogus":1}`)),
		"FILE_STAT bad JSON":  encode(tFileStat, 1, []byte(`{"root":`)),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			cl := hello(t)
			if _, err := cl.c.Write(append(b, make([]byte, 16)...)); err != nil {
				t.Fatal(err)
			}
			code := ""
			for f := range cl.frames {
				if f.typ == tError {
					code = string(f.payload)
					break
				}
			}
			if !strings.Contains(code, `"code":"EPROTO"`) {
				t.Fatalf("ERROR %s, want EPROTO", code)
			}
			if cl.closedBy() {
				t.Fatal("want the agent to close")
			}
		})
	}
}

func TestPingIsAnsweredWithItsBytes(t *testing.T) {
	cl := hello(t)
	cl.send(tPing, 42, []byte("\x00ping\xff"))
	if f := cl.next(42, tPong); !bytes.Equal(f.payload, []byte("\x00ping\xff")) {
		t.Fatalf("PONG %q", f.payload)
	}
}

func TestRequestsForAnUnknownCommandAnswerESRCHAndKeepTheConnection(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.send(tKill, id, nil)
	cl.expectError(id, "ESRCH")
	cl.sendJSON(tSignal, id, map[string]any{"signal": 15})
	cl.expectError(id, "ESRCH")
	cl.send(tPing, 1, nil)
	cl.next(1, tPong)
}

func TestCommandOutputAndExitCode(t *testing.T) {
	cl := hello(t)
	_, out := cl.run(sh("echo out; echo err >&2; exit 3"))
	if string(out.streams["stdout"]) != "out\n" || string(out.streams["stderr"]) != "err\n" {
		t.Fatalf("stdout %q stderr %q", out.streams["stdout"], out.streams["stderr"])
	}
	if out.exit["code"] != 3.0 || out.exit["killed"] != false || out.exit["timed_out"] != false {
		t.Fatalf("exit %v", out.exit)
	}
}

func TestCommandEnvAndCwdAreTheRequests(t *testing.T) {
	cl := hello(t)
	dir := t.TempDir()
	req := sh(`echo "$FOO:$(pwd)"; env | grep -c . `)
	req["env"] = []string{"FOO=bar", "PATH=/usr/bin:/bin"}
	req["cwd"] = dir
	_, out := cl.run(req)
	lines := strings.Split(string(out.streams["stdout"]), "\n")
	if lines[0] != "bar:"+dir {
		t.Fatalf("%q", lines[0])
	}
	// the agent's own environment is never passed on: sh adds PWD (and maybe SHLVL, _) only
	if n, _ := strconv.Atoi(lines[1]); n > 5 {
		t.Fatalf("%d variables: %s", n, out.streams["stdout"])
	}
}

func TestStartErrorsAreErrnoNamesNotExitCodes(t *testing.T) {
	cl := hello(t)
	cases := []struct {
		req  map[string]any
		code string
	}{
		{map[string]any{"argv": []string{"no-such-program-tai"}}, "ENOENT"},
		{map[string]any{"argv": []string{"/no/such/path"}}, "ENOENT"},
		{map[string]any{"argv": []string{}}, "EINVAL"},
		{map[string]any{"argv": []string{"true"}, "label": strings.Repeat("x", maxLabel+1)}, "EINVAL"},
		{map[string]any{"argv": []string{"true"}, "cwd": "/no/such/dir"}, "ENOENT"},
		{map[string]any{"argv": []string{"true"}, "root": "relative"}, "EINVAL"},
		{map[string]any{"argv": []string{t.TempDir()}}, "EACCES"},
	}
	for _, c := range cases {
		id := newID()
		cl.sendJSON(tStart, id, c.req)
		m := cl.expectError(id, c.code)
		if m["op"] != "start" {
			t.Fatalf("op %v", m["op"])
		}
	}
	// the connection is healthy afterwards
	_, out := cl.run(sh("exit 0"))
	if out.exit["code"] != 0.0 {
		t.Fatal(out.exit)
	}
}

func TestStartWithAnIdInUseIsEEXIST(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}})
	cl.expect(tStarted, id)
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"true"}})
	cl.expectError(id, "EEXIST")
	cl.send(tKill, id, nil)
	cl.expect(tKilled, id)
	cl.release(id)
}

func TestSignalReachesTheCommand(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}, "window": 1 << 20})
	cl.expect(tStarted, id)
	cl.sendJSON(tSignal, id, map[string]any{"signal": 0})
	cl.expectError(id, "EINVAL")
	cl.sendJSON(tSignal, id, map[string]any{"signal": int(syscall.SIGTERM)})
	if m := cl.expect(tAck, id); m["delivered"] != true || m["op"] != "signal" {
		t.Fatal(m)
	}
	out := cl.collect(id, 2)
	if out.exit["signal"] != float64(syscall.SIGTERM) || out.exit["killed"] != false {
		t.Fatalf("exit %v", out.exit)
	}
	cl.release(id)
	// after the release nothing of the command is left to signal
	cl.sendJSON(tSignal, id, map[string]any{"signal": 15})
	cl.expectError(id, "ESRCH")
}

func TestKillStopsTheWholeGroupAndReportsTheExit(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"/bin/sh", "-c", "sleep 300 & echo $!; sleep 300"}, "window": 1 << 20})
	started := cl.expect(tStarted, id)
	f := cl.next(id, tStdout)
	child, err := strconv.Atoi(strings.TrimSpace(string(f.payload[offsetSize:])))
	if err != nil {
		t.Fatal(err)
	}
	pid := int(started["pid"].(float64))
	if !alive(pid) || !alive(child) {
		t.Fatal("the command and its child should run")
	}
	// it is not its group's leader: a holder leads the group
	if pgid, _ := syscall.Getpgid(pid); pgid == pid {
		t.Fatal("the command leads its own group")
	}
	cl.send(tKill, id, nil)
	if m := cl.expect(tKilled, id); m["exited"] != true {
		t.Fatal(m)
	}
	var exit map[string]any
	for exit == nil {
		f := cl.next(id, tEOF, tExit)
		if f.typ == tExit {
			exit = cl.decode(f)
		}
	}
	if exit["signal"] != 9.0 || exit["killed"] != true || exit["timed_out"] != false {
		t.Fatalf("exit %v", exit)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(child) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(child) {
		t.Fatalf("the command's background child %d outlived the kill", child)
	}
	cl.release(id)
}

func TestDeadlineKillsTheCommandWhileNoClientIsConnected(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}, "timeout_ms": 300, "window": 1 << 20})
	cl.expect(tStarted, id)
	cl.c.Close()
	time.Sleep(600 * time.Millisecond)
	cl2 := hello(t)
	var entry map[string]any
	cl2.send(tList, 7, nil)
	for _, e := range cl2.decodeList(cl2.next(7, tListReply)) {
		if e["id"] == float64(id) {
			entry = e
		}
	}
	if entry == nil || entry["running"] != false || entry["attached"] != false {
		t.Fatalf("list entry %v", entry)
	}
	exit := entry["exit"].(map[string]any)
	if exit["timed_out"] != true || exit["signal"] != 9.0 {
		t.Fatalf("exit %v", exit)
	}
	if _, ok := entry["deadline"]; !ok {
		t.Fatal("no deadline listed")
	}
	cl2.release(id)
}

func TestReleaseOfARunningCommandIsEBUSY(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}, "label": "mine"})
	cl.expect(tStarted, id)
	cl.send(tRelease, id, nil)
	cl.expectError(id, "EBUSY")
	cl.send(tList, 3, nil)
	found := false
	for _, e := range cl.decodeList(cl.next(3, tListReply)) {
		if e["id"] == float64(id) {
			found = e["label"] == "mine" && e["running"] == true && e["attached"] == true
		}
	}
	if !found {
		t.Fatal("LIST does not show the running command with its label")
	}
	cl.send(tKill, id, nil)
	cl.expect(tKilled, id)
	cl.release(id)
}

func TestPtyCommandHasATerminalResizeAndItsOwnExit(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"/bin/sh", "-c", "stty size; read x; stty size; test -t 0 && exit 4"},
		"pty": true, "rows": 33, "cols": 101, "window": 1 << 20})
	cl.expect(tStarted, id)
	var got []byte
	for !bytes.Contains(got, []byte("33 101")) {
		f := cl.next(id, tStdout)
		got = append(got, f.payload[offsetSize:]...)
	}
	cl.sendJSON(tResize, id, map[string]any{"rows": 20, "cols": 70})
	cl.expect(tAck, id)
	cl.send(tStdin, id, []byte("\n"))
	out := cl.collectAfter(id, 1, got)
	if !strings.Contains(string(out.streams["stdout"]), "20 70") {
		t.Fatalf("stdout %q", out.streams["stdout"])
	}
	if out.exit["code"] != 4.0 {
		t.Fatalf("exit %v", out.exit)
	}
	cl.release(id)
}

func TestResizeWithoutATerminalIsENOTTY(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}})
	cl.expect(tStarted, id)
	cl.sendJSON(tResize, id, map[string]any{"rows": 10, "cols": 10})
	cl.expectError(id, "ENOTTY")
	cl.send(tKill, id, nil)
	cl.expect(tKilled, id)
	cl.release(id)
}

func TestConnectCarriesATCPConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 5)
		_, _ = c.Read(buf)
		_, _ = c.Write(bytes.ToUpper(buf))
		c.Close()
	}()
	cl := hello(t)
	id := newID()
	cl.sendJSON(tConnect, id, map[string]any{"port": ln.Addr().(*net.TCPAddr).Port, "window": 1 << 20})
	if m := cl.expect(tStarted, id); m["pid"] != 0.0 {
		t.Fatal(m)
	}
	cl.send(tStdin, id, []byte("hello"))
	out := cl.collect(id, 1)
	if string(out.streams["stdout"]) != "HELLO" || out.exit["code"] != 0.0 {
		t.Fatalf("%q %v", out.streams["stdout"], out.exit)
	}
	cl.release(id)
	bad := newID()
	cl.sendJSON(tConnect, bad, map[string]any{"port": 0})
	cl.expectError(bad, "EINVAL")
}

func (cl *client) decode(f frame) map[string]any {
	cl.t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal(f.payload, &m); err != nil {
		cl.t.Fatal(err)
	}
	return m
}

func (cl *client) decodeList(f frame) []map[string]any {
	cl.t.Helper()
	var l []map[string]any
	if err := json.Unmarshal(f.payload, &l); err != nil {
		cl.t.Fatal(err)
	}
	return l
}

// A pty command's shell may put its jobs in groups of their own within the terminal's session: a kill still
// stops them (every process of the session, pass after pass).
func TestKillOfAPtyCommandStopsJobsInOtherGroupsOfItsSession(t *testing.T) {
	cl := hello(t)
	id := newID()
	cl.sendJSON(tStart, id, map[string]any{"argv": []string{"/bin/sh", "-c", "set -m; sleep 300 & echo job=$!; wait"},
		"pty": true, "window": 1 << 20})
	started := cl.expect(tStarted, id)
	var got []byte
	for !bytes.Contains(got, []byte("\n")) {
		got = append(got, cl.next(id, tStdout).payload[offsetSize:]...)
	}
	job, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(got)), "job=")))
	if err != nil {
		t.Fatalf("%q: %v", got, err)
	}
	pid := int(started["pid"].(float64))
	jobGroup, _ := syscall.Getpgid(job)
	shellGroup, _ := syscall.Getpgid(pid)
	if jobGroup == shellGroup || !alive(job) {
		t.Fatalf("the job %d should run in a group of its own (%d, the shell's %d)", job, jobGroup, shellGroup)
	}
	cl.send(tKill, id, nil)
	cl.expect(tKilled, id)
	deadline := time.Now().Add(5 * time.Second)
	for alive(job) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(job) {
		t.Fatal("a job of the terminal's session outlived the kill")
	}
	cl.collectAfter(id, 1, got)
	cl.release(id)
}

// fillTheTable starts sleeps until the agent holds maxCommands; it returns their ids.
func (cl *client) fillTheTable() []uint32 {
	cl.t.Helper()
	cl.send(tList, 1, nil)
	held := len(cl.decodeList(cl.next(1, tListReply)))
	var ids []uint32
	for i := held; i < maxCommands; i++ {
		id := newID()
		cl.sendJSON(tStart, id, map[string]any{"argv": []string{"sleep", "30"}})
		cl.expect(tStarted, id)
		ids = append(ids, id)
	}
	return ids
}

func (cl *client) killAndRelease(ids []uint32) {
	cl.t.Helper()
	for _, id := range ids {
		cl.send(tKill, id, nil)
	}
	for _, id := range ids {
		cl.expect(tKilled, id)
		cl.release(id)
	}
}

// A CONNECT while the agent holds maxCommands is EAGAIN before it dials: the listener in the session never
// sees a connection opened and closed at once.
func TestConnectBeyondTheCommandLimitIsEAGAINWithoutADial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	cl := hello(t)
	ids := cl.fillTheTable()
	over := newID()
	cl.sendJSON(tConnect, over, map[string]any{"port": ln.Addr().(*net.TCPAddr).Port, "window": 1 << 20})
	cl.expectError(over, "EAGAIN")
	select {
	case <-accepted:
		t.Fatal("the listener was dialled for a connection the agent had no room for")
	case <-time.After(200 * time.Millisecond):
	}
	cl.killAndRelease(ids)
}

// At most maxCommands are held (running, or finished and not released): one more START is EAGAIN.
func TestStartBeyondTheCommandLimitIsEAGAIN(t *testing.T) {
	cl := hello(t)
	ids := cl.fillTheTable()
	over := newID()
	cl.sendJSON(tStart, over, map[string]any{"argv": []string{"true"}})
	cl.expectError(over, "EAGAIN")
	cl.killAndRelease(ids)
	// room again
	_, out := cl.run(sh("exit 0"))
	if out.exit["code"] != 0.0 {
		t.Fatal(out.exit)
	}
}
