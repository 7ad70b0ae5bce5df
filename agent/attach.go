// Resuming and listing: ATTACH (with LOST), RELEASE and LIST.

package main

import (
	"fmt"
	"time"
)

// attach moves the command to this connection and resumes each stream at the client's offset.
func (c *command) attach(cn *conn, offsets []uint64, window uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.streams {
		if offsets[i] > s.end {
			cn.fail(c.id, "attach", "ERANGE", fmt.Sprintf("%s offset %d is past its end %d", s.name, offsets[i], s.end))
			return
		}
	}
	if old := c.conn; old != nil && old != cn {
		go old.write(tDetached, c.id) // never wait on a stalled former client while holding the command
	}
	c.conn = cn
	c.credit = min(window, maxCredit)
	c.exitSent = false
	reply := map[string]any{"running": !c.exited, "pid": c.own, "pty": c.pty,
		"stdin_window": stdinWindow - c.stdinUsed}
	for i, s := range c.streams {
		c.eofSent[i] = false
		reply[s.name] = map[string]uint64{"start": s.start, "end": s.end}
	}
	_ = cn.writeJSON(tAttached, c.id, reply)
	for i, s := range c.streams {
		off := offsets[i]
		if off < s.start {
			_ = cn.writeJSON(tLost, c.id, map[string]any{"stream": s.name, "from": off, "to": s.start})
			off = s.start
		}
		s.sent = off
	}
	c.cond.Broadcast()
}

func (a *agent) release(cn *conn, c *command) {
	c.mu.Lock()
	if !c.exited {
		c.mu.Unlock()
		cn.fail(c.id, "release", "EBUSY", "the command is running: kill it first")
		return
	}
	c.released = true
	if c.timer != nil {
		c.timer.Stop()
	}
	for _, s := range c.streams {
		if !s.eof {
			_ = s.f.SetReadDeadline(time.Now())
		}
	}
	if !c.reaped { // something left the group holding the output: the agent stops holding it
		a.mu.Lock()
		c.letGo()
		a.mu.Unlock()
	}
	c.queueStdin(nil) // stdinLoop ends
	c.cond.Broadcast()
	c.mu.Unlock()
	a.mu.Lock()
	delete(a.cmds, c.id)
	a.mu.Unlock()
	_ = cn.write(tReleased, c.id)
	a.trimSoon()
}

type listEntry struct {
	ID       uint32            `json:"id"`
	Pid      int               `json:"pid"`
	Argv     []string          `json:"argv"`
	Pty      bool              `json:"pty"`
	Running  bool              `json:"running"`
	Exit     map[string]any    `json:"exit,omitempty"`
	Started  float64           `json:"started"`
	Deadline float64           `json:"deadline,omitempty"`
	Label    string            `json:"label,omitempty"`
	Output   map[string][2]int `json:"output"`
	Attach   bool              `json:"attached"`
}

func (a *agent) list() []listEntry {
	a.mu.Lock()
	cmds := make([]*command, 0, len(a.cmds))
	for _, c := range a.cmds {
		cmds = append(cmds, c)
	}
	a.mu.Unlock()
	out := []listEntry{}
	for _, c := range cmds {
		c.mu.Lock()
		e := listEntry{ID: c.id, Pid: c.own, Argv: c.argv, Pty: c.pty, Running: !c.exited,
			Started: float64(c.started.UnixNano()) / 1e9, Output: map[string][2]int{}, Attach: c.conn != nil,
			Label: c.label}
		if !c.deadline.IsZero() {
			e.Deadline = float64(c.deadline.UnixNano()) / 1e9
		}
		if c.exited {
			e.Exit = c.exitJSON()
		}
		for _, s := range c.streams {
			e.Output[s.name] = [2]int{int(s.start), int(s.end)}
		}
		c.mu.Unlock()
		out = append(out, e)
	}
	return out
}
