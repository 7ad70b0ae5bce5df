package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

const (
	prSetDumpable       = 4
	prSetChildSubreaper = 36
	pWaitPID            = 1
	wNoWait             = 0x01000000
	wExited             = 4
	wNoHang             = 1
	cldExited           = 1
	cldKilled           = 2
	cldDumped           = 3
)

func prctl(option, arg uintptr) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// nonDumpable closes /proc/<self>/{fd,environ,mem,...} and ptrace to same-uid code without CAP_SYS_PTRACE.
func nonDumpable() {
	if err := prctl(prSetDumpable, 0); err != nil {
		fmt.Fprintln(os.Stderr, "tai-agent: PR_SET_DUMPABLE:", err)
		os.Exit(70)
	}
}

type exitStatus struct {
	exited bool // true: code holds the exit code; false: signal holds the killing signal
	code   int
	signal int
	core   bool
}

// peekExit reports whether child pid has ended, without reaping it (WNOWAIT): the zombie keeps the pid, so
// its process group id cannot be handed to another group while the agent may still signal it.
func peekExit(pid int) (exitStatus, bool, error) {
	var info [128]byte // siginfo_t
	_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pWaitPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])),
		wExited|wNoHang|wNoWait, 0, 0)
	if e != 0 {
		return exitStatus{}, false, e
	}
	// siginfo_t on linux (64-bit): si_signo @0, si_errno @4, si_code @8, si_pid @16, si_uid @20, si_status @24
	gotPid := int32(nativeUint32(info[16:20]))
	if gotPid == 0 {
		return exitStatus{}, false, nil
	}
	code := int32(nativeUint32(info[8:12]))
	status := int(int32(nativeUint32(info[24:28])))
	switch code {
	case cldExited:
		return exitStatus{exited: true, code: status}, true, nil
	case cldKilled, cldDumped:
		return exitStatus{signal: status, core: code == cldDumped}, true, nil
	}
	return exitStatus{}, false, nil
}

func nativeUint32(b []byte) uint32 {
	return *(*uint32)(unsafe.Pointer(&b[0]))
}

// reap collects a zombie child.
func reap(pid int) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if err != syscall.EINTR {
			return
		}
	}
}

// statFields returns the fields of /proc/<pid>/stat after the command name: state ppid pgrp session ...
func statFields(pid int) ([][]byte, error) {
	b, err := readProc("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("odd stat for %d", pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 4 {
		return nil, fmt.Errorf("odd stat for %d", pid)
	}
	return fields, nil
}

// procStat returns a process's state letter and parent pid from /proc/<pid>/stat.
func procStat(pid int) (byte, int, error) {
	fields, err := statFields(pid)
	if err != nil {
		return 0, 0, err
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	return fields[0][0], ppid, err
}

// readProc reads a small /proc file with plain system calls: os.ReadFile would also register the file with
// the runtime's poller and stat it, several calls more per file, and the agent reads one per thread of its
// own at every SIGCHLD (a system call is dear in some VMs).
func readProc(path string) ([]byte, error) {
	return readProcInto(path, make([]byte, 0, 512))
}

// readProcInto is readProc into buf's array while it is large enough (a loop reading many files reuses one).
func readProcInto(path string, buf []byte) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// zombieChildren lists this process's zombie children but the “kept“ ones: from each thread's /proc
// children list when the kernel has one (CONFIG_PROC_CHILDREN), else from a scan of every process.
func zombieChildren(kept map[int]bool) []int {
	if kids, ok := childPids(); ok {
		var out []int
		for _, pid := range kids {
			if kept[pid] {
				continue
			}
			if state, _, err := procStat(pid); err == nil && state == 'Z' {
				out = append(out, pid)
			}
		}
		return out
	}
	return scanZombieChildren(kept)
}

func childPids() ([]int, bool) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, false
	}
	var pids []int
	buf := make([]byte, 0, 512)
	for _, t := range tasks {
		b, err := readProcInto("/proc/self/task/"+t.Name()+"/children", buf)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && t.Name() != strconv.Itoa(os.Getpid()) {
				continue // a thread that ended meanwhile
			}
			return nil, false
		}
		buf = b
		for _, f := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(f)); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids, true
}

func scanZombieChildren(kept map[int]bool) []int {
	self := os.Getpid()
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || kept[pid] {
			continue
		}
		state, ppid, err := procStat(pid)
		if err == nil && state == 'Z' && ppid == self {
			out = append(out, pid)
		}
	}
	return out
}

// trustedClient is the gate on a connection to the agent: a trustedPeer, or a peer outside this pid
// namespace altogether (SO_PEERCRED's pid is 0 for a process the namespace cannot see). That is a server
// on the engine's host connecting from the container's network namespace (PROTOCOL.md, "Direct
// connections"): every process of the session is in this namespace or one below it, so none is ever 0.
func trustedClient(c *syscall.Ucred) error {
	if c.Pid == 0 {
		return nil
	}
	return trustedPeer(c)
}

// trustedPeer is the channel's gate (PROTOCOL.md, "Who may connect"): the process on the other end of the
// unix socket must have parent pid 0 in this pid namespace (entered from outside: a `docker exec`, or the
// agent itself as PID 1), be non-dumpable (its /proc/<pid>/exe closed to us: a same-uid process made
// dumpable by exec, e.g. a shell the server exec'd, could be driven by ptrace) and be named like this binary.
func trustedPeer(c *syscall.Ucred) error {
	pid := strconv.Itoa(int(c.Pid))
	_, ppid, err := procStat(int(c.Pid))
	if err != nil {
		return fmt.Errorf("peer %s: %v", pid, err)
	}
	if ppid != 0 {
		return fmt.Errorf("peer %s has parent %d, not one entered from outside the session", pid, ppid)
	}
	if _, err := os.Readlink("/proc/" + pid + "/exe"); !errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("peer %s is dumpable (%v)", pid, err)
	}
	comm, err := os.ReadFile("/proc/" + pid + "/comm")
	self, err2 := os.ReadFile("/proc/self/comm")
	if err != nil || err2 != nil || !bytes.Equal(comm, self) {
		return fmt.Errorf("peer %s is %q, not the agent", pid, bytes.TrimSpace(comm))
	}
	return nil
}

// openPty opens a pseudo-terminal pair from /dev/ptmx, without cgo.
func openPty() (master *os.File, slave *os.File, err error) {
	fd, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	var unlock int32
	if err := ioctl(fd, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		syscall.Close(fd)
		return nil, nil, err
	}
	var n uint32
	if err := ioctl(fd, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		syscall.Close(fd)
		return nil, nil, err
	}
	sfd, err := syscall.Open("/dev/pts/"+strconv.Itoa(int(n)), syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		syscall.Close(fd)
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), "ptmx"), os.NewFile(uintptr(sfd), "pts"), nil
}

func ioctl(fd int, req uintptr, arg uintptr) error {
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), req, arg); e != 0 {
		return e
	}
	return nil
}

// setWinsize sets a terminal's size through the file's raw fd (Fd() would make it blocking).
func setWinsize(f *os.File, rows, cols int) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	ws := [4]uint16{uint16(rows), uint16(cols), 0, 0}
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		ierr = ioctl(int(fd), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws[0])))
	}); err != nil {
		return err
	}
	return ierr
}

const fSetPipeSz = 1031

// growPipe asks for a larger pipe buffer (F_SETPIPE_SZ) so a busy writer and its reader trade more bytes per
// wake-up. Best effort: a file that is not a pipe, or a size over the system's or the uid's limit, keeps its own.
func growPipe(f *os.File, size int) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, fd, fSetPipeSz, uintptr(size))
	})
}

// startHolder starts a command's group holder: a program that exits at once (holder_linux.go), leading a
// new process group of the agent's session. Its zombie, kept until the command is let go, holds the group
// id: the command joins that group, and a kill of the group reaches whatever the command started in it.
func startHolder() (int, error) {
	path, argv := "/proc/self/exe", []string{"tai-agent", "hold"}
	if holderPath != "" {
		path, argv = holderPath, []string{"tai-hold"}
	}
	return syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Dir: "/", Env: []string{}, Files: []uintptr{0, 1, 2}, Sys: &syscall.SysProcAttr{Setpgid: true},
	})
}

// waitReap collects a child that was just sent SIGKILL (it is gone within moments).
func waitReap(pid int) {
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			return
		}
	}
}

// killSession sends SIGKILL to every live process of session sid, pass after pass (a job forked meanwhile
// goes too) until a pass finds none, at most maxPasses: a terminal's shell puts its jobs in groups of their
// own, all in the terminal's session. Processes that left the session (setsid) are not stopped.
func killSession(sid int) {
	const maxPasses = 50
	for pass := 0; pass < maxPasses; pass++ {
		d, err := os.Open("/proc")
		if err != nil {
			return
		}
		names, _ := d.Readdirnames(-1)
		d.Close()
		found := false
		for _, name := range names {
			pid, err := strconv.Atoi(name)
			if err != nil || pid == 1 {
				continue
			}
			state, session, ok := stateAndSession(pid)
			if ok && session == sid && state != 'Z' && state != 'X' {
				found = true
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if !found {
			return
		}
	}
}

// stateAndSession reads a process's state letter and session id from /proc/<pid>/stat.
func stateAndSession(pid int) (byte, int, bool) {
	fields, err := statFields(pid)
	if err != nil {
		return 0, 0, false
	}
	session, err := strconv.Atoi(string(fields[3]))
	return fields[0][0], session, err == nil
}

// readLeader reads what `tai-agent pty` reports on its pid pipe: the command's pid, or why it did not start
// (an errno number). The caller has closed its copy of the write end, so a leader that died reads as EOF.
func readLeader(r *os.File) (int, error) {
	_ = r.SetReadDeadline(time.Now().Add(leaderReportWait))
	buf := make([]byte, 32)
	n, err := io.ReadFull(r, buf[:1])
	if err != nil {
		return 0, fmt.Errorf("the terminal's leader did not report: %w", err)
	}
	m, _ := r.Read(buf[1:])
	text := string(buf[:n+m])
	if strings.HasPrefix(text, "E") {
		errno, _ := strconv.Atoi(text[1:])
		return 0, syscall.Errno(errno)
	}
	pid, err := strconv.Atoi(strings.TrimPrefix(text, "P"))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("the terminal's leader reported %q", text)
	}
	return pid, nil
}

// ptyLead is `tai-agent pty PATH ARGV...`: the leader of a pty command's session (started with setsid and
// the terminal as its controlling terminal). It starts the command as its child, reports the child's pid
// (or the errno of its failed start) on fd 3, waits for it and exits with its status (a signal's death by
// the same signal). Signals the terminal sends its foreground group reach this leader too: it takes them
// with handlers (so the command starts with default dispositions) and lets the command decide.
func ptyLead() int {
	report := os.NewFile(3, "pid")
	if len(os.Args) < 4 {
		return 64
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
		syscall.SIGHUP, syscall.SIGTERM, syscall.SIGWINCH, syscall.SIGCONT, syscall.SIGUSR1, syscall.SIGUSR2,
		syscall.SIGPIPE)
	go func() {
		for range sigs {
		}
	}()
	syscall.CloseOnExec(3)
	victimFirst(os.Getpid()) // the command inherits it at the fork
	pid, err := syscall.ForkExec(os.Args[2], os.Args[3:], &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}})
	if err != nil {
		errno, _ := err.(syscall.Errno)
		_, _ = fmt.Fprintf(report, "E%d", int(errno))
		return 127
	}
	_, _ = fmt.Fprintf(report, "P%d", pid)
	_ = report.Close()
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
			break
		}
	}
	if ws.Signaled() {
		signal.Reset()
		_ = syscall.Kill(os.Getpid(), ws.Signal())
		time.Sleep(time.Second)
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// commandOOMScore is every command's oom_score_adj: a memory-capped session out of memory loses a command,
// never the agent or a connection's relay (both keep the container's 0). Raising it needs no privilege.
const commandOOMScore = "500"

// victimFirst makes process pid the OOM killer's first choice over the agent (best effort: a process that is
// already gone, or a kernel without the file, changes nothing). Its children inherit it.
// (os.WriteFile's O_CREAT|O_TRUNC is refused on this proc file: a plain write-only open.)
func victimFirst(pid int) {
	fd, err := syscall.Open(fmt.Sprintf("/proc/%d/oom_score_adj", pid), syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_, _ = syscall.Write(fd, []byte(commandOOMScore))
	_ = syscall.Close(fd)
}

// oomCountFiles hold the session's OOM kill count (a line "oom_kill N"): its memory cgroup's, a container's own
// under its cgroup namespace (v2, else v1). A microVM's agent reads the guest kernel's /proc/vmstat instead: the
// whole guest is the session there (never in a container, where /proc/vmstat counts the host's).
var oomCountFiles = []string{"/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"}

// oomKills is the count of processes the kernel's OOM killer has killed in the session (oomCountFiles, the first
// readable); -1 where none is readable (no memory controller, or a kernel without the count).
func oomKills() int64 {
	for _, path := range oomCountFiles {
		data, err := readProc(path)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "oom_kill "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}
