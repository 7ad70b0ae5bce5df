package main

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
)

// killedWithPipe is a killed command whose one stream is a pipe's read end, read by readStream as a kill
// leaves it: with its read deadline set.
func killedWithPipe(t *testing.T) (*command, *stream, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	c := &command{a: newAgent(), killed: true, exited: true, reaped: true}
	c.cond = sync.NewCond(&c.mu)
	s := &stream{name: "stdout", f: r}
	c.streams = []*stream{s}
	return c, s, w
}

func readToEnd(t *testing.T, c *command, s *stream) {
	t.Helper()
	done := make(chan struct{})
	go func() { c.readStream(s); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end after its deadline")
	}
}

// A kill's read deadline that passes before the read saw the pipe's end (a guest paused past cutAfterKill)
// does not make the stream cut: every writer had closed it, and every byte is kept.
func TestAStreamWhoseWritersClosedItIsNotCutWhenTheDeadlineWinsTheRace(t *testing.T) {
	c, s, w := killedWithPipe(t)
	if _, err := w.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	w.Close()
	_ = s.f.SetReadDeadline(time.Unix(1, 0)) // passed before the read starts: the timer fired first
	readToEnd(t, c, s)
	if !s.eof || s.cut {
		t.Fatalf("eof %v cut %v: a pipe whose writers all closed it was cut", s.eof, s.cut)
	}
	if !bytes.Equal(s.buf, []byte("last words")) || s.end != 10 {
		t.Fatalf("kept %q (end %d)", s.buf, s.end)
	}
}

// A pipe that a process outside the group still holds is cut at the kill's deadline, after what it held.
func TestAStreamStillHeldAtTheKillDeadlineIsCutAfterItsBytes(t *testing.T) {
	c, s, w := killedWithPipe(t)
	if _, err := w.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = s.f.SetReadDeadline(time.Now().Add(cutAfterKill))
	readToEnd(t, c, s)
	if !s.eof || !s.cut {
		t.Fatalf("eof %v cut %v: a held pipe was not cut", s.eof, s.cut)
	}
	if string(s.buf) != "held" {
		t.Fatalf("kept %q", s.buf)
	}
}

// A process that keeps writing into the pipe after the kill's deadline does not keep the stream open:
// past what the pipe could hold at the deadline, the stream is cut.
func TestAHolderThatKeepsWritingIsCutPromptly(t *testing.T) {
	c, s, w := killedWithPipe(t)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}
	}()
	_ = s.f.SetReadDeadline(time.Now().Add(cutAfterKill))
	readToEnd(t, c, s)
	if !s.eof || !s.cut {
		t.Fatalf("eof %v cut %v", s.eof, s.cut)
	}
}
