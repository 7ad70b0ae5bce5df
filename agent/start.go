// Starting a command: its request, program lookup, pipes or terminal, group holder, fork and exec.

package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

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

// errnoNames are the errno values the agent names in an ERROR frame's code (frames.json's error_codes hold
// them and the codes the agent sends by name).
var errnoNames = map[string]syscall.Errno{"ENOENT": syscall.ENOENT, "EACCES": syscall.EACCES,
	"ENOEXEC": syscall.ENOEXEC, "ENOTDIR": syscall.ENOTDIR, "EPERM": syscall.EPERM, "E2BIG": syscall.E2BIG,
	"ENOMEM": syscall.ENOMEM, "EAGAIN": syscall.EAGAIN, "EISDIR": syscall.EISDIR, "ELOOP": syscall.ELOOP,
	"ETXTBSY": syscall.ETXTBSY, "EMFILE": syscall.EMFILE, "EXDEV": syscall.EXDEV,
	"EEXIST": syscall.EEXIST, "ENOTEMPTY": syscall.ENOTEMPTY, "EINVAL": syscall.EINVAL,
	"ENOSYS": syscall.ENOSYS, "EBADF": syscall.EBADF, "ENOSPC": syscall.ENOSPC, "EROFS": syscall.EROFS,
	"ECONNREFUSED": syscall.ECONNREFUSED, "ETIMEDOUT": syscall.ETIMEDOUT,
	"EHOSTUNREACH": syscall.EHOSTUNREACH, "ENETUNREACH": syscall.ENETUNREACH,
	"EADDRNOTAVAIL": syscall.EADDRNOTAVAIL, "ENODEV": syscall.ENODEV, "ENXIO": syscall.ENXIO}

func errnoName(err error) string {
	var e syscall.Errno
	if errors.As(err, &e) {
		for name, v := range errnoNames {
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
	c.stdinWake = make(chan struct{}, 1)
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

func (c *command) closeParentFiles() {
	for _, s := range c.streams {
		s.f.Close()
	}
	if c.stdin != nil {
		c.stdin.Close()
	}
}
