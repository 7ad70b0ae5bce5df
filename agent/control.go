// Control: RESIZE, SIGNAL and KILL.

package main

import (
	"syscall"
	"time"
)

func (c *command) resize(cn *conn, rows, cols int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.master == nil {
		cn.fail(c.id, "resize", "ENOTTY", "the command has no terminal")
		return
	}
	if err := setWinsize(c.master, rows, cols); err != nil {
		cn.fail(c.id, "resize", errnoName(err), err.Error())
		return
	}
	_ = cn.writeJSON(tAck, c.id, map[string]string{"op": "resize"})
}

func (c *command) signal(cn *conn, sig int, group bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sig <= 0 || sig >= 65 {
		cn.fail(c.id, "signal", "EINVAL", "no such signal")
		return
	}
	if c.reaped { // the group id may belong to another group now: nothing of ours is left to signal
		_ = cn.writeJSON(tAck, c.id, map[string]any{"op": "signal", "delivered": false})
		return
	}
	var err error
	if group {
		err = syscall.Kill(-c.pgid, syscall.Signal(sig))
	} else {
		err = syscall.Kill(c.own, syscall.Signal(sig))
	}
	_ = cn.writeJSON(tAck, c.id, map[string]any{"op": "signal", "delivered": err == nil})
}

// kill stops the command's own process and its whole group, waits for its exit (bounded), then ends its
// output after what is already readable. cn is nil for the agent's own deadline.
func (c *command) kill(cn *conn, deadline bool) {
	c.mu.Lock()
	if deadline && !c.exited {
		c.timedOut = true
	}
	c.killed = true
	if c.tcp != nil {
		_ = c.tcp.SetReadDeadline(time.Now())
	} else if !c.reaped {
		if !c.exited {
			_ = syscall.Kill(c.pid, syscall.SIGKILL)
			_ = syscall.Kill(c.own, syscall.SIGKILL) // with pty it may have left the terminal's session
		}
		_ = syscall.Kill(-c.pgid, syscall.SIGKILL)
		if c.pty {
			killSession(c.pid) // a shell's jobs run in groups of their own within the terminal's session
		}
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	c.a.reapChildren()
	limit := time.Now().Add(killWait)
	c.mu.Lock()
	for !c.exited && time.Now().Before(limit) {
		c.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		c.a.reapChildren()
		c.mu.Lock()
	}
	for _, s := range c.streams {
		if !s.eof {
			_ = s.f.SetReadDeadline(time.Now().Add(cutAfterKill))
		}
	}
	exited := c.exited
	c.cond.Broadcast()
	c.mu.Unlock()
	if cn != nil {
		_ = cn.writeJSON(tKilled, c.id, map[string]any{"exited": exited})
	}
}
