// Connections: accepting them, writing frames, the handshake, and dispatching each client frame.

package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

type conn struct {
	a      *agent
	c      io.ReadWriteCloser // a unix socket connection, or a VM's virtio-serial port (vm_linux.go)
	port   *port              // a VM's port (vm_linux.go): serve reads it, not c
	wmu    sync.Mutex
	closed bool
	files  *fileState
}

func (a *agent) acceptLoop(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		cred, err := unixPeerCred(c)
		if err == nil {
			err = trustedClient(cred)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "tai-agent: refused a connection:", err)
			_ = c.Close()
			continue
		}
		go a.newConn(c).serve()
	}
}

func (a *agent) newConn(c io.ReadWriteCloser) *conn {
	cn := &conn{a: a, c: c, files: newFileState()}
	a.connMu.Lock()
	a.conns[cn] = struct{}{}
	a.connMu.Unlock()
	return cn
}

func (cn *conn) write(typ byte, id uint32, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	hdr := appendHeader(make([]byte, 0, headerSize), typ, id, n)
	bufs := net.Buffers(append([][]byte{hdr}, parts...))
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	if cn.closed {
		return net.ErrClosed
	}
	var err error
	if _, ok := cn.c.(net.Conn); ok {
		_, err = bufs.WriteTo(cn.c)
	} else { // a port has no writev: one write per frame, not one per part
		_, err = cn.c.Write(bytes.Join(bufs, nil))
	}
	if err != nil {
		cn.closed = true
		_ = cn.c.Close()
	}
	return err
}

func (cn *conn) writeJSON(typ byte, id uint32, v any) error {
	b, _ := json.Marshal(v)
	return cn.write(typ, id, b)
}

func (cn *conn) fail(id uint32, op, code, msg string) {
	_ = cn.writeJSON(tError, id, map[string]string{"op": op, "code": code, "message": msg})
}

func (cn *conn) close() {
	_ = cn.c.Close() // first: a write blocked in it (a port whose host has gone) returns and lets go of wmu
	cn.wmu.Lock()
	cn.closed = true
	cn.wmu.Unlock()
}

// serve reads the client's frames; a malformed one ends the connection (the commands live on). It reports
// whether the client's side ended it (its stream ended; on a port, a new host's HELLO came) rather than the
// agent, for a protocol error.
func (cn *conn) serve() (peerEnded bool) {
	defer func() {
		cn.close()
		cn.files.abortAll() // an upload not committed leaves nothing behind
		cn.a.detachAll(cn)
		cn.a.connMu.Lock()
		delete(cn.a.conns, cn)
		cn.a.connMu.Unlock()
		cn.a.trimSoon()
	}()
	hello := false
	var r *bufio.Reader
	if cn.port != nil {
		r = cn.port.in
	} else {
		r = bufio.NewReaderSize(cn.c, 64<<10) // small frames (credits, control) cost no syscall each
	}
	for {
		if cn.port != nil && cn.port.next(hello) {
			return true
		}
		f, err := readFrame(r)
		if err != nil {
			if cn.port != nil && errors.Is(err, errNewHost) {
				return true // a port's host left inside a frame, and a new one has come
			}
			if errors.Is(err, errFrameTooLarge) || !isEOF(err) {
				cn.fail(0, "read", "EPROTO", err.Error())
				return false
			}
			return true
		}
		if !hello {
			if f.typ != tHello {
				cn.fail(0, "hello", "EPROTO", "the first frame must be HELLO")
				return false
			}
			var h helloRequest
			if json.Unmarshal(f.payload, &h) != nil || h.Version != ProtocolVersion {
				cn.fail(0, "hello", "EPROTONOSUPPORT", fmt.Sprintf("agent speaks protocol %d", ProtocolVersion))
				return false
			}
			hello = true
			reply := map[string]any{
				"version": ProtocolVersion, "max_frame": maxFrameBody, "max_commands": maxCommands,
				"ring": ringSize, "stdin_window": stdinWindow, "pid": os.Getpid(),
			}
			if h.Nonce != "" && len(h.Nonce) <= maxNonce {
				reply["nonce"] = h.Nonce // lets a port's client tell its reply from a former connection's bytes
			}
			if cn.port != nil && (h.Time != 0 || h.Seed != "") {
				// a VM's host: the guest may be a restored snapshot, with the snapshot's clock and RNG state
				reply["refreshed"] = refreshGuest(h.Time, h.Seed)
			}
			_ = cn.writeJSON(tHelloReply, 0, reply)
			continue
		}
		if err := cn.handle(f); err != nil {
			cn.fail(f.id, "frame", "EPROTO", err.Error())
			return false
		}
	}
}

const maxNonce = 64

// The control payloads decoded in serve and handle (START's, CONNECT's and the file frames' have their own).
type helloRequest struct {
	Version int     `json:"version"`
	Nonce   string  `json:"nonce"`
	Time    float64 `json:"time"`
	Seed    string  `json:"seed"`
}

type resizeRequest struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

type signalRequest struct {
	Signal int  `json:"signal"`
	Group  bool `json:"group"`
}

type attachRequest struct {
	Stdout uint64 `json:"stdout"`
	Stderr uint64 `json:"stderr"`
	Window uint64 `json:"window"`
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET)
}

func decodeControl(p []byte, v any) error {
	return decodeJSON(p, maxControlLen, v)
}

func decodeJSON(p []byte, limit int, v any) error {
	if len(p) > limit {
		return fmt.Errorf("control payload of %d bytes", len(p))
	}
	d := json.NewDecoder(strings.NewReader(string(p)))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("malformed payload: %v", err)
	}
	return nil
}

// handle acts on one frame; an error is a protocol violation and closes the connection.
func (cn *conn) handle(f frame) error {
	a := cn.a
	if err := checkShape(f); err != nil {
		return err
	}
	switch f.typ {
	case tPing:
		return cn.write(tPong, f.id, f.payload)
	case tStart:
		var req startRequest
		if err := decodeJSON(f.payload, maxStartLen, &req); err != nil {
			return err
		}
		a.start(cn, f.id, req)
		return nil
	case tList:
		return cn.writeJSON(tListReply, f.id, a.list())
	case tConnect:
		var req connectRequest
		if err := decodeControl(f.payload, &req); err != nil {
			return err
		}
		go a.connectTCP(cn, f.id, req)
		return nil
	case tFileStat, tFileList, tFileRead, tUploadOpen, tUploadData, tUploadCommit, tUploadAbort, tFileDelete,
		tFileRename, tFileMkdir:
		return cn.handleFile(f)
	}
	c := a.get(f.id)
	if c == nil {
		// a client racing a RELEASE may still send for a command: an error frame, not a protocol violation
		switch f.typ {
		case tStdin, tStdinClose, tResize, tSignal, tKill, tCredit, tAttach, tRelease:
			cn.fail(f.id, opName(f.typ), "ESRCH", "no such command")
			return nil
		}
		return fmt.Errorf("unknown frame type 0x%02x", f.typ)
	}
	switch f.typ {
	case tStdin:
		return c.stdinData(cn, f.payload)
	case tStdinClose:
		c.closeStdin(cn)
	case tResize:
		var r resizeRequest
		if err := decodeControl(f.payload, &r); err != nil {
			return err
		}
		c.resize(cn, r.Rows, r.Cols)
	case tSignal:
		var s signalRequest
		if err := decodeControl(f.payload, &s); err != nil {
			return err
		}
		c.signal(cn, s.Signal, s.Group)
	case tKill:
		go c.kill(cn, false)
	case tCredit:
		c.grant(cn, binary.BigEndian.Uint64(f.payload))
	case tAttach:
		var r attachRequest
		if err := decodeControl(f.payload, &r); err != nil {
			return err
		}
		c.attach(cn, []uint64{r.Stdout, r.Stderr}, r.Window)
	case tRelease:
		a.release(cn, c)
	default:
		return fmt.Errorf("unknown frame type 0x%02x", f.typ)
	}
	return nil
}

// checkShape rejects a frame whose payload cannot be right for its type, whatever command it names.
func checkShape(f frame) error {
	switch f.typ {
	case tCredit:
		if len(f.payload) != creditSize {
			return errors.New("CREDIT takes 8 bytes")
		}
	case tStdinClose, tKill, tRelease, tList:
		if len(f.payload) != 0 {
			return fmt.Errorf("frame 0x%02x takes no payload", f.typ)
		}
	case tStart:
		if len(f.payload) == 0 || len(f.payload) > maxStartLen || f.payload[0] != '{' {
			return errors.New("START takes a JSON object")
		}
	case tResize, tSignal, tAttach, tConnect:
		if len(f.payload) == 0 || len(f.payload) > maxControlLen || f.payload[0] != '{' {
			return fmt.Errorf("frame 0x%02x takes a JSON object", f.typ)
		}
	case tStdin, tPing:
	case tFileStat, tFileList, tFileRead, tUploadOpen, tFileDelete, tFileRename, tFileMkdir:
		if len(f.payload) == 0 || len(f.payload) > maxControlLen || f.payload[0] != '{' {
			return fmt.Errorf("frame 0x%02x takes a JSON object", f.typ)
		}
	case tUploadData, tUploadCommit, tUploadAbort:
	default:
		return fmt.Errorf("unknown frame type 0x%02x", f.typ)
	}
	return nil
}

func opName(t byte) string {
	return map[byte]string{tStdin: "stdin", tStdinClose: "stdin_close", tResize: "resize", tSignal: "signal",
		tKill: "kill", tCredit: "credit", tAttach: "attach", tRelease: "release"}[t]
}
