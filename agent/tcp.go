// TCP connections into the session (CONNECT), carried like commands without a process.

package main

import (
	"fmt"
	"net"
	"sync"
	"time"
)

type connectRequest struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Window uint64 `json:"window"`
}

// connectTCP opens a TCP connection inside the session (its network namespace: works with network none)
// and carries it like a command: STDOUT is what the peer sends, STDIN what the client sends, STDIN_CLOSE a
// half-close, KILL a close; EXIT {"code": 0} once the peer's side has ended.
func (a *agent) connectTCP(cn *conn, id uint32, req connectRequest) {
	if req.Port <= 0 || req.Port > 65535 {
		cn.fail(id, "start", "EINVAL", "port out of range")
		return
	}
	host := req.Host
	if host == "" {
		host = "127.0.0.1"
	}
	addr := net.JoinHostPort(host, fmt.Sprint(req.Port))
	if !a.hasRoom(cn, id) { // before the dial: the listener never sees a connection the agent then drops
		return
	}
	tc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		cn.fail(id, "start", errnoName(err), err.Error())
		return
	}
	c := &command{a: a, id: id, argv: []string{"tcp", addr}, started: time.Now(), tcp: tc, reaped: true}
	c.cond = sync.NewCond(&c.mu)
	c.streams = []*stream{{name: "stdout", f: tc}}
	c.stdin = halfCloser{tc}
	c.eofSent = make([]bool, 1)
	c.stdinWake = make(chan struct{}, 1)
	c.credit = min(req.Window, maxCredit)
	a.mu.Lock()
	if _, dup := a.cmds[id]; dup || len(a.cmds) >= maxCommands { // taken during the dial
		a.mu.Unlock()
		tc.Close()
		failNoRoom(cn, id, dup)
		return
	}
	c.conn = cn
	a.cmds[id] = c
	a.mu.Unlock()
	_ = cn.writeJSON(tStarted, id, map[string]any{"pid": 0, "stdin_window": stdinWindow})
	go c.readStream(c.streams[0])
	go c.sendLoop()
	go c.stdinLoop()
}

// halfCloser makes closing a connection's stdin a TCP half-close.
type halfCloser struct{ net.Conn }

func (h halfCloser) Close() error {
	if tc, ok := h.Conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return h.Conn.Close()
}

// hasRoom answers EEXIST or EAGAIN (and false) when the agent holds id already or as many commands and
// connections as it may.
func (a *agent) hasRoom(cn *conn, id uint32) bool {
	a.mu.Lock()
	_, dup := a.cmds[id]
	full := len(a.cmds) >= maxCommands
	a.mu.Unlock()
	if dup || full {
		failNoRoom(cn, id, dup)
		return false
	}
	return true
}

func failNoRoom(cn *conn, id uint32, dup bool) {
	code := "EEXIST"
	if !dup {
		code = "EAGAIN"
	}
	cn.fail(id, "start", code, "no room for the connection")
}
