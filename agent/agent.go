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

const (
	maxCommands  = 64      // command records held at once, running or finished and not yet released
	ringSize     = 1 << 20 // per stream: output kept for a resume (at least a client window); at most twice this is held
	stdinWindow  = 2 << 20 // stdin bytes a client may have in flight per command
	maxCredit    = 1 << 40
	killWait     = 4 * time.Second // a kill waits this long for the command's exit before it answers
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
	cut   bool // ended by a kill (or a release) rather than by every writer closing it
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
	stdinQ      chan []byte // nil entry closes stdin
	stdinClosed bool        // STDIN_CLOSE received
	stdinUsed   uint64      // bytes accepted and not yet written (bounded by stdinWindow)
	stdinBroken string      // why writes stopped (the command closed its stdin)
	master      *os.File
	timer       *time.Timer
	tcp         net.Conn // a TCP connection into the session, not a process (no pid, no group)
}

// ----- connections -----

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
	if len(p) > maxControlLen {
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
		if err := decodeControl(f.payload, &req); err != nil {
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
	case tStart, tResize, tSignal, tAttach, tConnect:
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

// ----- starting -----

type startRequest struct {
	Argv      []string `json:"argv"`
	Env       []string `json:"env"`
	Cwd       string   `json:"cwd"`
	Pty       bool     `json:"pty"`
	Rows      int      `json:"rows"`
	Cols      int      `json:"cols"`
	Window    uint64   `json:"window"`     // output credit granted with the start
	TimeoutMs int64    `json:"timeout_ms"` // 0: none; else the agent kills the group at the deadline
	Uid       *uint32  `json:"uid"`        // run as this uid (gid defaults to it), no supplementary groups
	Gid       *uint32  `json:"gid"`
	Label     string   `json:"label"` // the client's own note on the command, kept and listed back
	Root      string   `json:"root"`  // chroot the command here (absolute); its program and cwd are looked up there
}

// maxLabel bounds a START's label: what a client needs to find its command again, not storage.
const maxLabel = 4096

// credential is the identity a command runs as: nil keeps the agent's own (root, its groups).
func (r startRequest) credential() *syscall.Credential {
	if r.Uid == nil && r.Gid == nil {
		return nil
	}
	cred := &syscall.Credential{Groups: []uint32{}} // setgroups(0): no supplementary group is kept
	if r.Uid != nil {
		cred.Uid, cred.Gid = *r.Uid, *r.Uid
	}
	if r.Gid != nil {
		cred.Gid = *r.Gid
	}
	return cred
}

func errnoName(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		for name, v := range map[string]syscall.Errno{"ENOENT": syscall.ENOENT, "EACCES": syscall.EACCES,
			"ENOEXEC": syscall.ENOEXEC, "ENOTDIR": syscall.ENOTDIR, "EPERM": syscall.EPERM, "E2BIG": syscall.E2BIG,
			"ENOMEM": syscall.ENOMEM, "EAGAIN": syscall.EAGAIN, "EISDIR": syscall.EISDIR, "ELOOP": syscall.ELOOP,
			"ETXTBSY": syscall.ETXTBSY, "EMFILE": syscall.EMFILE, "EXDEV": syscall.EXDEV,
			"EEXIST": syscall.EEXIST, "ENOTEMPTY": syscall.ENOTEMPTY, "EINVAL": syscall.EINVAL,
			"ENOSYS": syscall.ENOSYS, "EBADF": syscall.EBADF, "ENOSPC": syscall.ENOSPC, "EROFS": syscall.EROFS,
			"ECONNREFUSED": syscall.ECONNREFUSED, "ETIMEDOUT": syscall.ETIMEDOUT,
			"EHOSTUNREACH": syscall.EHOSTUNREACH, "ENETUNREACH": syscall.ENETUNREACH,
			"EADDRNOTAVAIL": syscall.EADDRNOTAVAIL} {
			if e == v {
				return name
			}
		}
		return fmt.Sprintf("errno %d", int(e))
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return "ETIMEDOUT"
	}
	return "EIO"
}

// lookPath finds argv[0] on the command's own PATH (the agent's environment is not the command's), under the
// folder root the command will be chrooted into ("" or "/": the agent's own root); the path is as the command
// sees it.
func lookPath(name string, env []string, root string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			path = kv[5:]
		}
	}
	denied := false
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		var st syscall.Stat_t
		if syscall.Stat(strings.TrimSuffix(root, "/")+p, &st) != nil || st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			continue
		}
		if st.Mode&0o111 == 0 {
			denied = true
			continue
		}
		return p, nil
	}
	if denied {
		return "", syscall.EACCES
	}
	return "", syscall.ENOENT
}

func (a *agent) start(cn *conn, id uint32, req startRequest) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		cn.fail(id, "start", "EINVAL", "argv is empty")
		return
	}
	if len(req.Label) > maxLabel {
		cn.fail(id, "start", "EINVAL", fmt.Sprintf("the label is longer than %d bytes", maxLabel))
		return
	}
	env := req.Env
	if env == nil {
		env = []string{"PATH=" + defaultPath}
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if req.Root != "" && !strings.HasPrefix(req.Root, "/") {
		cn.fail(id, "start", "EINVAL", "root must be an absolute path")
		return
	}
	path, err := lookPath(req.Argv[0], env, req.Root)
	if err != nil {
		cn.fail(id, "start", errnoName(err), fmt.Sprintf("%s: %v", req.Argv[0], err))
		return
	}
	c := &command{a: a, id: id, argv: req.Argv, pty: req.Pty, started: time.Now(), label: req.Label, oomBefore: oomKills()}
	if req.TimeoutMs > 0 {
		c.deadline = c.started.Add(time.Duration(req.TimeoutMs) * time.Millisecond)
	}
	c.cond = sync.NewCond(&c.mu)
	var childFiles []*os.File
	var files []uintptr
	if req.Pty {
		master, slave, err := openPty()
		if err != nil {
			cn.fail(id, "start", errnoName(err), "pty: "+err.Error())
			return
		}
		rows, cols := req.Rows, req.Cols
		if rows <= 0 || cols <= 0 {
			rows, cols = 24, 80
		}
		_ = setWinsize(master, rows, cols)
		c.master, c.stdin = master, master
		c.streams = []*stream{{name: "stdout", f: master}}
		childFiles = []*os.File{slave}
		fd := slave.Fd()
		files = []uintptr{fd, fd, fd}
	} else {
		inR, inW, err1 := os.Pipe()
		outR, outW, err2 := os.Pipe()
		errR, errW, err3 := os.Pipe()
		if err := errors.Join(err1, err2, err3); err != nil {
			for _, f := range []*os.File{inR, inW, outR, outW, errR, errW} {
				if f != nil {
					f.Close()
				}
			}
			cn.fail(id, "start", errnoName(err), "pipes: "+err.Error())
			return
		}
		c.stdin = inW
		c.streams = []*stream{{name: "stdout", f: outR}, {name: "stderr", f: errR}}
		growPipe(outR, pipeSize)
		growPipe(inW, pipeSize)
		childFiles = []*os.File{inR, outW, errW}
		files = []uintptr{inR.Fd(), outW.Fd(), errW.Fd()}
	}
	closeAll := func() {
		for _, f := range childFiles {
			f.Close()
		}
	}
	c.eofSent = make([]bool, len(c.streams))
	c.stdinQ = make(chan []byte, stdinWindow/1024+2)
	c.credit = min(req.Window, maxCredit)
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: req.credential(), Chroot: req.Root}
	argv := req.Argv
	var leaderPid, leaderW *os.File // with pty: where the terminal's leader tells the command's pid
	if req.Pty {
		// the terminal's session is led by `tai-agent pty`, which starts the command as its child and exits
		// with its status: the command is then no group's leader, so setsid(1) runs it in place (as for a
		// command without pty) and a kill still reaches its own process by pid
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			c.closeParentFiles()
			cn.fail(id, "start", errnoName(err), "pipe: "+err.Error())
			return
		}
		defer r.Close()
		defer w.Close()
		files = append(files, w.Fd())
		leaderW = w
		argv = append([]string{"tai-agent", "pty", path}, req.Argv...)
		path = "/proc/self/exe"
		leaderPid = r
	}
	if !req.Pty {
		// a group led by a holder, not by the command: a command that is no group's leader may call setsid()
		// itself (setsid(1) then runs it in place instead of forking a copy outside the group), and a kill
		// still reaches its own process by pid
		sys = &syscall.SysProcAttr{Setpgid: true, Credential: req.credential(), Chroot: req.Root}
	}
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: files, Sys: sys}

	a.mu.Lock()
	if _, dup := a.cmds[id]; dup {
		a.mu.Unlock()
		closeAll()
		c.closeParentFiles()
		cn.fail(id, "start", "EEXIST", "a command with this id exists")
		return
	}
	if len(a.cmds) >= maxCommands {
		a.mu.Unlock()
		closeAll()
		c.closeParentFiles()
		cn.fail(id, "start", "EAGAIN", fmt.Sprintf("%d commands held: release finished ones", maxCommands))
		return
	}
	holder := 0
	if !req.Pty {
		if holder, err = startHolder(); err != nil {
			a.mu.Unlock()
			closeAll()
			c.closeParentFiles()
			cn.fail(id, "start", errnoName(err), "the command's group holder: "+err.Error())
			return
		}
		sys.Pgid = holder
	}
	pid, err := syscall.ForkExec(path, argv, attr)
	if err == nil {
		victimFirst(pid)
	}
	own := pid
	if leaderW != nil {
		_ = leaderW.Close()
	}
	if err == nil && leaderPid != nil {
		if own, err = readLeader(leaderPid); err != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			reap(pid)
		}
	}
	if err != nil {
		if holder > 0 {
			_ = syscall.Kill(holder, syscall.SIGKILL)
			reap(holder)
		}
		a.mu.Unlock()
		closeAll()
		c.closeParentFiles()
		cn.fail(id, "start", errnoName(err), fmt.Sprintf("%s: %v", req.Argv[0], err))
		return
	}
	c.pid, c.pgid, c.own = pid, pid, own
	if holder > 0 {
		c.pgid = holder
		a.holders[holder] = c
	}
	c.conn = cn
	a.cmds[id] = c
	a.byPid[pid] = c
	a.mu.Unlock()
	closeAll()
	_ = cn.writeJSON(tStarted, id, map[string]any{"pid": own, "stdin_window": stdinWindow})
	if req.TimeoutMs > 0 {
		c.timer = time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { c.kill(nil, true) })
	}
	for _, s := range c.streams {
		go c.readStream(s)
	}
	go c.sendLoop()
	go c.stdinLoop()
	// an exit before the registration is not missed: the reaper takes a.mu (held across fork and register)
	// before it looks at the leaders, and a SIGCHLD arriving meanwhile runs it again afterwards
}

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
	c.stdinQ = make(chan []byte, stdinWindow/1024+2)
	c.credit = min(req.Window, maxCredit)
	a.mu.Lock()
	if _, dup := a.cmds[id]; dup || len(a.cmds) >= maxCommands {
		a.mu.Unlock()
		tc.Close()
		code := "EEXIST"
		if !dup {
			code = "EAGAIN"
		}
		cn.fail(id, "start", code, "no room for the connection")
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

func (c *command) closeParentFiles() {
	for _, s := range c.streams {
		s.f.Close()
	}
	if c.stdin != nil {
		c.stdin.Close()
	}
}

// ----- output -----

// readStream takes the command's output in while the ring has room for unsent bytes; it never drops a byte
// that was not sent: a command nobody reads blocks in its own write, and only it. It reads straight into the
// ring's free tail (the pipe's bytes are copied once, by the kernel); a full ring is compacted into a fresh
// array, so a slice of the old one that a sender is still writing stays intact.
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
		if cap(s.buf)-len(s.buf) < room {
			s.compact()
		}
		tail := s.buf[len(s.buf) : len(s.buf)+room]
		c.mu.Unlock()
		n, err := s.f.Read(tail) // only this goroutine writes past len(s.buf); senders read below it
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

// compact keeps the newest ringSize bytes (every unsent one among them: fewer than ringSize are unsent when
// the reader asks for room) in a fresh array of twice that, so the stream never holds more than 2 x ringSize.
func (s *stream) compact() {
	keep := s.start
	if s.end > ringSize {
		keep = max(keep, s.end-ringSize)
	}
	keep = min(keep, s.sent)
	nb := make([]byte, s.end-keep, 2*ringSize)
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

// ----- stdin -----

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
	c.stdinQ <- p // never blocks: the window bounds what is queued
	return nil
}

func (c *command) closeStdin(cn *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stdinClosed {
		return
	}
	c.stdinClosed = true
	c.stdinQ <- nil
}

func (c *command) stdinLoop() {
	for p := range c.stdinQ {
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

// ----- control -----

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
	c.cond.Broadcast()
	c.mu.Unlock()
	select {
	case c.stdinQ <- nil:
	default:
	}
	a.mu.Lock()
	delete(a.cmds, c.id)
	a.mu.Unlock()
	_ = cn.write(tReleased, c.id)
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

// ----- reaping -----

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
