// The agent: the commands it holds (their records, streams and state), and collecting their exits.

package main

import (
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
	"time"
)

const (
	maxCommands  = 64      // command records held at once, running or finished and not yet released
	ringSize     = 1 << 20 // per stream: output kept for a resume (at least a client window); at most twice this is held
	firstRing    = 1 << 10 // a stream's first array: it doubles as the output grows (compact)
	stdinWindow  = 2 << 20 // stdin bytes a client may have in flight per command
	maxCredit    = 1 << 40
	killWait     = 4 * time.Second // a kill waits this long for the command's exit before it answers
	idleTrim     = time.Second     // the agent gives its free memory back this long after the last release
	cutAfterKill = 20 * time.Millisecond
	pipeSize     = 1 << 20 // a command's stdout and stdin pipes (F_SETPIPE_SZ, best effort)
	// how long a pty command's terminal leader may take to report the command's pid
	leaderReportWait = 5 * time.Second
	defaultPath      = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

type agent struct {
	mu      sync.Mutex // cmds, byPid, holders; held across fork+exec+register so the reaper never takes a new leader
	cmds    map[uint32]*command
	byPid   map[int]*command
	holders map[int]*command // a command's group holder (its zombie keeps the group id) -> the command
	connMu  sync.Mutex
	conns   map[*conn]struct{}
	trimMu  sync.Mutex
	trim    *time.Timer // trimSoon's: idleTrim after the last release or connection end
}

func newAgent() *agent {
	return &agent{cmds: map[uint32]*command{}, byPid: map[int]*command{}, holders: map[int]*command{},
		conns: map[*conn]struct{}{}}
}

// streamSource is a command's pipe or pty master, or a TCP connection's socket.
type streamSource interface {
	Read([]byte) (int, error)
	Close() error
	SetReadDeadline(time.Time) error
}

type stream struct {
	name  string
	f     streamSource
	buf   []byte // bytes [start, end)
	start uint64
	end   uint64
	sent  uint64 // next byte for the attached connection
	eof   bool
	cut   bool   // ended by a kill (or a release) rather than by every writer closing it
	late  uint64 // bytes read past the read deadline (readStream's alone): the pipe held at most pipeSize then
}

type command struct {
	a        *agent
	id       uint32
	pid      int // the process whose exit is the command's: the command itself, or with pty its terminal's leader
	pgid     int // the command's group: its holder's pid, or with pty its terminal's leader's
	own      int // the command's own process (with pty: the leader's child)
	argv     []string
	pty      bool
	started  time.Time
	deadline time.Time // zero: none
	label    string

	mu      sync.Mutex
	cond    *sync.Cond
	streams []*stream
	credit  uint64
	conn    *conn

	exited   bool
	status   exitStatus
	timedOut bool
	killed   bool
	// the session's OOM kills (its cgroup's oom_kill count) at the start (-1: unknown), and whether the
	// count grew by the time a SIGKILL nobody sent ended the command
	oomBefore int64
	oomKilled bool
	reaped    bool // the leader's zombie is collected: its group id may belong to someone else now
	released  bool
	exitSent  bool
	eofSent   []bool

	stdin       io.WriteCloser
	stdinQ      [][]byte      // written in order by stdinLoop; a nil entry closes stdin
	stdinWake   chan struct{} // one slot: stdinQ has entries
	stdinClosed bool          // STDIN_CLOSE received
	stdinUsed   uint64        // bytes accepted and not yet written (bounded by stdinWindow)
	stdinBroken string        // why writes stopped (the command closed its stdin)
	master      *os.File
	timer       *time.Timer
	tcp         net.Conn // a TCP connection into the session, not a process (no pid, no group)
}

func (a *agent) get(id uint32) *command {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cmds[id]
}

func (a *agent) detachAll(cn *conn) {
	a.mu.Lock()
	cmds := make([]*command, 0, len(a.cmds))
	for _, c := range a.cmds {
		cmds = append(cmds, c)
	}
	a.mu.Unlock()
	for _, c := range cmds {
		c.mu.Lock()
		if c.conn == cn {
			c.conn = nil
		}
		c.mu.Unlock()
	}
}

// reapChildren records the exit of command leaders (keeping their zombies, which hold the group id) and
// collects every other zombie child: orphans reparented to PID 1.
func (a *agent) reapChildren() {
	a.mu.Lock()
	leaders := make([]*command, 0, len(a.byPid))
	for _, c := range a.byPid {
		leaders = append(leaders, c)
	}
	a.mu.Unlock()
	for _, c := range leaders {
		c.mu.Lock()
		if !c.exited && !c.reaped {
			if st, done, err := peekExit(c.pid); err == nil && done {
				c.exited, c.status = true, st
				c.oomKilled = !st.exited && st.signal == int(syscall.SIGKILL) && !c.killed && !c.timedOut &&
					c.oomBefore >= 0 && oomKills() > c.oomBefore
				if c.timer != nil {
					c.timer.Stop()
				}
				c.afterChange()
			}
		}
		c.mu.Unlock()
	}
	a.mu.Lock()
	known := make(map[int]bool, len(a.byPid)+len(a.holders))
	for pid := range a.byPid {
		known[pid] = true
	}
	for pid := range a.holders {
		known[pid] = true
	}
	a.mu.Unlock()
	zombies := zombieChildren(known) // read without a.mu: starts go on meanwhile
	a.mu.Lock()
	for _, pid := range zombies {
		_, leader := a.byPid[pid] // a command registered since (a.mu is held across its fork)
		_, holder := a.holders[pid]
		if !leader && !holder {
			reap(pid)
		}
	}
	a.mu.Unlock()
}

// trimSoon gives the agent's free memory back to the kernel once idleTrim has passed with no other release
// or connection end (each one moves it later): the heap a command's streams and records took is garbage
// after its release, and the Go runtime would otherwise keep those pages, up to its next collection's goal
// (4 MiB at least), charged to the session's memory. Threads the runtime made past serveThreads meanwhile
// end then too (trimThreads).
func (a *agent) trimSoon() {
	a.trimMu.Lock()
	defer a.trimMu.Unlock()
	if a.trim == nil {
		a.trim = time.AfterFunc(idleTrim, func() {
			debug.FreeOSMemory()
			trimThreads(serveThreads)
		})
	} else {
		a.trim.Reset(idleTrim)
	}
}

// shutdown stops every running command's group before the agent exits (the engine's stop).
func (a *agent) shutdown() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.cmds {
		if !c.reaped && c.pid > 0 {
			_ = syscall.Kill(c.own, syscall.SIGKILL)
			_ = syscall.Kill(c.pid, syscall.SIGKILL)
			_ = syscall.Kill(-c.pgid, syscall.SIGKILL)
			if c.pty {
				killSession(c.pid)
			}
		}
	}
}
