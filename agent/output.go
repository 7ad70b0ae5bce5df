// Output: the rings a command's streams are read into, and sending them within the client's credit.

package main

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"syscall"
	"time"
)

// readStream takes the command's output in while the ring has room for unsent bytes; it never drops a byte
// that was not sent: a command nobody reads blocks in its own write, and only it. It reads straight into the
// ring's free tail (the pipe's bytes are copied once, by the kernel), as long as that tail is a quarter of the
// array or holds all the room left; then the ring is compacted into a fresh array, so a slice of the old one
// that a sender is still writing stays intact. (Compacting whenever the tail held less than the room left
// did it at nearly every read of a fast stream, a 2 MiB array and a 1 MiB copy each time.) The array starts
// small and doubles as the stream needs (to 2 x ringSize): a command with little output holds a few KiB.
func (c *command) readStream(s *stream) {
	for {
		c.mu.Lock()
		for s.end-s.sent >= ringSize && !c.killed && !c.released {
			c.cond.Wait()
		}
		if c.killed && s.end-s.sent >= ringSize || c.released {
			s.eof, s.cut = true, true
			if c.tcp != nil && !c.exited {
				c.exited, c.status = true, exitStatus{exited: true}
			}
			c.afterChange()
			c.mu.Unlock()
			s.f.Close()
			return
		}
		room := int(ringSize - (s.end - s.sent))
		if free := cap(s.buf) - len(s.buf); free < min(room, cap(s.buf)/4) || free == 0 {
			s.compact()
		}
		tail := s.buf[len(s.buf) : len(s.buf)+min(room, cap(s.buf)-len(s.buf))]
		c.mu.Unlock()
		n, err := s.f.Read(tail) // only this goroutine writes past len(s.buf); senders read below it
		if errors.Is(err, os.ErrDeadlineExceeded) && s.late < pipeSize {
			n, err = readNow(s.f, tail) // past a pipe's worth, a holder is still writing: cut
			s.late += uint64(n)
		}
		c.mu.Lock()
		if n > 0 {
			s.buf = s.buf[:len(s.buf)+n]
			s.end += uint64(n)
		}
		if err != nil {
			s.eof = true
			s.cut = errors.Is(err, os.ErrDeadlineExceeded) || c.released
			if c.tcp != nil && !c.exited { // a connection "exits" when its read side ends
				c.exited, c.status = true, exitStatus{exited: true}
			}
			c.afterChange()
			c.mu.Unlock()
			s.f.Close()
			return
		}
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

// readNow is one read of what a pipe or terminal holds this moment, for a read whose deadline (a kill's or a
// release's) passed. The deadline gave the command's writers their moment to close the stream; whether they
// did is the pipe's to say, not the order in which the runtime woke the read: a guest whose vCPU was paused
// past cutAfterKill sees the deadline's timer fire before the end that came in time. So: bytes, the end
// (io.EOF), or os.ErrDeadlineExceeded while a writer still holds it. The deadline stays passed, so the next
// Read comes straight back here.
func readNow(f streamSource, p []byte) (int, error) {
	file, ok := f.(*os.File)
	if !ok {
		return 0, os.ErrDeadlineExceeded // a TCP connection's kill ends it
	}
	raw, err := file.SyscallConn()
	if err != nil {
		return 0, os.ErrDeadlineExceeded
	}
	_ = file.SetReadDeadline(time.Time{}) // RawConn.Read does not start past a deadline
	defer file.SetReadDeadline(time.Unix(1, 0))
	var n int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		for {
			if n, rerr = syscall.Read(int(fd), p); rerr != syscall.EINTR {
				return true // never wait: the fd is non-blocking, EAGAIN says it is held and empty
			}
		}
	}); err != nil {
		return 0, os.ErrDeadlineExceeded
	}
	switch {
	case rerr == syscall.EAGAIN:
		return 0, os.ErrDeadlineExceeded
	case rerr != nil:
		return 0, rerr // a terminal's master reads EIO once the terminal closed: its end
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// compact keeps the newest ringSize bytes (every unsent one among them: fewer than ringSize are unsent when
// the reader asks for room) in a fresh array of twice the old one's size (firstRing at first), at most twice
// ringSize, so the stream never holds more than 2 x ringSize. The array is at least twice what it keeps, or
// holds ringSize free, so the reader has room to read into again.
func (s *stream) compact() {
	keep := s.start
	if s.end > ringSize {
		keep = max(keep, s.end-ringSize)
	}
	keep = min(keep, s.sent)
	size := min(max(firstRing, 2*cap(s.buf)), 2*ringSize)
	nb := make([]byte, s.end-keep, size)
	copy(nb, s.buf[keep-s.start:])
	s.buf, s.start = nb, keep
}

// afterChange wakes the sender and reaps the leader once it has exited and its output has ended: from then
// on the group is not held (the docker rule: held while the command runs or something holds its output).
func (c *command) afterChange() {
	c.cond.Broadcast()
	if c.exited && !c.reaped && c.outputEnded() {
		c.a.mu.Lock()
		c.letGo()
		c.a.mu.Unlock()
	}
}

// letGo collects the command's zombie and its holder's: the group is no longer held (c.mu and a.mu held).
func (c *command) letGo() {
	reap(c.pid)
	if c.pgid != c.pid {
		_ = syscall.Kill(c.pgid, syscall.SIGKILL) // it exits at once; a stop of the session may have cut it short
		waitReap(c.pgid)
		delete(c.a.holders, c.pgid)
	}
	c.reaped = true
	delete(c.a.byPid, c.pid)
}

func (c *command) outputEnded() bool {
	for _, s := range c.streams {
		if !s.eof {
			return false
		}
	}
	return true
}

func (c *command) hasWork() bool {
	if c.conn == nil {
		return false
	}
	if c.exited && !c.exitSent {
		return true
	}
	for i, s := range c.streams {
		if c.credit > 0 && s.sent < s.end {
			return true
		}
		if s.eof && s.sent == s.end && !c.eofSent[i] {
			return true
		}
	}
	return false
}

func (c *command) sendLoop() {
	var offsetBuf [offsetSize]byte
	for {
		c.mu.Lock()
		for !c.released && !c.hasWork() {
			c.cond.Wait()
		}
		if c.released {
			c.mu.Unlock()
			return
		}
		cn := c.conn
		var typ byte
		var payload []byte
		var js any
		offset := offsetBuf[:0]
		for i, s := range c.streams {
			if c.credit > 0 && s.sent < s.end {
				n := min(s.end-s.sent, c.credit, dataChunk)
				lo := s.sent - s.start
				offset = binary.BigEndian.AppendUint64(offset[:0], s.sent)
				payload = s.buf[lo : lo+n : lo+n] // no copy: bytes below len(s.buf) never change (see compact)
				s.sent += n
				c.credit -= n
				typ = tStdout + byte(i)
				break
			}
		}
		if typ == 0 {
			for i, s := range c.streams {
				if s.eof && s.sent == s.end && !c.eofSent[i] {
					c.eofSent[i] = true
					typ, js = tEOF, map[string]any{"stream": s.name, "offset": s.end, "cut": s.cut}
					break
				}
			}
		}
		if typ == 0 && c.exited && !c.exitSent {
			c.exitSent = true
			typ, js = tExit, c.exitJSON()
		}
		c.cond.Broadcast() // the readers may have room now
		c.mu.Unlock()
		var err error
		if js != nil {
			err = cn.writeJSON(typ, c.id, js)
		} else {
			err = cn.write(typ, c.id, offset, payload)
		}
		if err != nil {
			c.mu.Lock()
			if c.conn == cn {
				c.conn = nil
			}
			c.mu.Unlock()
		}
	}
}

func (c *command) exitJSON() map[string]any {
	m := map[string]any{"timed_out": c.timedOut, "killed": c.killed}
	if c.oomKilled {
		m["oom_killed"] = true
	}
	if c.status.exited {
		m["code"] = c.status.code
	} else {
		m["signal"] = c.status.signal
		m["core"] = c.status.core
	}
	return m
}

func (c *command) grant(cn *conn, n uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != cn {
		return // a grant from a connection that lost the command to another
	}
	c.credit = min(c.credit+n, maxCredit)
	c.cond.Broadcast()
}
