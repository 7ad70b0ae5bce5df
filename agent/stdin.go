// Stdin: the per-command credit window and the writer.

package main

import (
	"encoding/binary"
	"errors"
)

func (c *command) stdinData(cn *conn, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != cn {
		cn.fail(c.id, "stdin", "EBUSY", "the command is attached to another connection")
		return nil
	}
	if c.stdinClosed || c.exited {
		cn.fail(c.id, "stdin", "EPIPE", "stdin is closed or the command has exited")
		return nil
	}
	if c.stdinUsed+uint64(len(p)) > stdinWindow {
		return errors.New("stdin beyond the granted window")
	}
	c.stdinUsed += uint64(len(p))
	c.queueStdin(p)
	return nil
}

func (c *command) closeStdin(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stdinClosed {
		return
	}
	c.stdinClosed = true
	c.queueStdin(nil)
}

// queueStdin hands p to stdinLoop (c.mu held); it never blocks: the window bounds the bytes queued. A slice
// rather than a channel sized for the window's worst case: a command's queue costs nothing until used.
func (c *command) queueStdin(p []byte) {
	c.stdinQ = append(c.stdinQ, p)
	select {
	case c.stdinWake <- struct{}{}:
	default:
	}
}

// nextStdin waits for stdinLoop's next entry.
func (c *command) nextStdin() []byte {
	c.mu.Lock()
	for len(c.stdinQ) == 0 {
		c.mu.Unlock()
		<-c.stdinWake
		c.mu.Lock()
	}
	p := c.stdinQ[0]
	c.stdinQ[0] = nil
	c.stdinQ = c.stdinQ[1:]
	if len(c.stdinQ) == 0 {
		c.stdinQ = nil // the array goes with its last entry
	}
	c.mu.Unlock()
	return p
}

func (c *command) stdinLoop() {
	for {
		p := c.nextStdin()
		if p == nil {
			c.mu.Lock()
			released := c.released
			c.mu.Unlock()
			if c.pty && !released {
				_, _ = c.stdin.Write([]byte{4}) // ^D: the terminal's end of input
			} else {
				c.stdin.Close()
				return
			}
			continue
		}
		c.mu.Lock()
		broken := c.stdinBroken != ""
		c.mu.Unlock()
		if !broken {
			if _, err := c.stdin.Write(p); err != nil {
				c.mu.Lock()
				c.stdinBroken = err.Error() // the command closed its stdin: what it did not read is dropped
				c.mu.Unlock()
			}
		}
		c.mu.Lock()
		c.stdinUsed -= uint64(len(p))
		cn := c.conn
		released := c.released
		c.mu.Unlock()
		if released {
			return
		}
		if cn != nil {
			var b [creditSize]byte
			binary.BigEndian.PutUint64(b[:], uint64(len(p)))
			_ = cn.write(tStdinCredit, c.id, b[:])
		}
	}
}
