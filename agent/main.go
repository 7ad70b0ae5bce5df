// Command tai-agent is the session agent: PID 1 of a container session, holding its commands, and the
// relay a server reaches it through. See PROTOCOL.md.
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// socketName is the agent's abstract unix socket: it has no file that session code could remove or replace,
// and it lives in the container's network namespace, which a `docker exec` joins. Anyone there may dial it;
// the agent answers only a peer that passes trustedPeer.
const socketName = "@tai-agent"

func main() {
	nonDumpable() // first: nothing below may run while same-uid code could still read /proc/self
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		serve(nil)
	case "vm": // PID 1 of a microVM (vm_linux.go)
		vm()
	case "connect":
		os.Exit(connect())
	case "gateway": // an owner's egress gateway (gateway.go, GATEWAY.md)
		os.Exit(gatewayMain(os.Args[2:]))
	case "hold": // a command's group holder (startHolder): its zombie is what holds the group
		os.Exit(0)
	case "pty": // a pty command's terminal leader (ptyLead)
		os.Exit(ptyLead())
	case "version":
		fmt.Printf("tai-agent protocol %d\n", ProtocolVersion)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tai-agent serve | vm | connect | gateway [--dir DIR] [--ca DIR] | version")
	os.Exit(64)
}

// serve runs the agent on its abstract socket, and with also on whatever else also serves (a VM's port).
func serve(also func(*agent)) {
	// every catchable signal comes to this channel, so the Go runtime never dies of one (a same-uid command may
	// signal PID 1 only where a handler is installed) and the commands still start with default dispositions
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs)
	if os.Getpid() != 1 {
		_ = prctl(prSetChildSubreaper, 1) // outside a container (tests): orphans still come back to us
	}
	syscall.Umask(0o022) // what a container process usually has (runc's default), and commands inherit it
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketName, Net: "unix"})
	if err != nil {
		fatal("listen: %v", err)
	}
	reserveThreads(serveThreads)
	makeHolder()
	a := newAgent()
	go a.acceptLoop(ln)
	if also != nil {
		go also(a)
	}
	for s := range sigs {
		switch s {
		case syscall.SIGCHLD:
			a.reapChildren()
		case syscall.SIGTERM:
			a.shutdown()
			os.Exit(0)
		}
	}
}

// The OS threads each process has from its start, made while the container has pids to spare. The Go
// runtime keeps idle threads for reuse, and a thread it cannot create is fatal: a command that takes every
// pid the container may have (a fork bomb under pids_limit) must not then kill the relay, or PID 1, the
// moment one more blocking call needs a thread. Few are needed: the agent's goroutines run on at most
// maxProcs threads at once, and its pipes, terminals and sockets are the runtime poller's, so a goroutine
// waiting on one holds no thread; only short system calls (a fork, a /proc read, a file operation) do.
// The counts include the runtime's own threads (its monitor, the one that waits for signals).
const (
	maxProcs       = 2
	serveThreads   = 8
	connectThreads = 6
)

// reserveThreads has the runtime make OS threads until the process has n (or k reached n), and leaves them
// idle in its pool: for a moment GOMAXPROCS is k and k goroutines spin until all of them run at once, each
// on a thread of its own, for k = 1, 2, ... (Goroutines locked to their threads would do too, but a locked
// thread handing its work off makes the runtime start a template thread as well: one thread more.) Then
// GOMAXPROCS is the runtime's own again (the session's CPU limit, followed as it changes, or $GOMAXPROCS),
// but at most maxProcs.
func reserveThreads(n int) {
	procs := runtime.GOMAXPROCS(0)
	for k := 1; k <= n && threadCount() < n; k++ { // an unreadable count (-1) goes on to k = n
		runtime.GOMAXPROCS(k)
		runTogether(k)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.SetDefaultGOMAXPROCS()
		procs = runtime.GOMAXPROCS(0)
	}
	if procs > maxProcs || runtime.GOMAXPROCS(0) != procs {
		runtime.GOMAXPROCS(min(procs, maxProcs))
	}
}

// runTogether returns once k goroutines have all been running at the same moment (or after a second).
func runTogether(k int) {
	var started atomic.Int32
	var done sync.WaitGroup
	deadline := time.Now().Add(time.Second)
	done.Add(k)
	for i := 0; i < k; i++ {
		go func() {
			defer done.Done()
			started.Add(1)
			for started.Load() < int32(k) && time.Now().Before(deadline) {
			}
		}()
	}
	done.Wait()
}

// threadCount is the process's OS threads (/proc/self/status); -1 when it cannot be read.
func threadCount() int {
	b, err := readProc("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Threads:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(rest)); err == nil {
				return n
			}
		}
	}
	return -1
}

// trimThreads ends the OS threads the runtime made past n after the start's reserve (a burst of long system
// calls, a large stream's, can take one or two more), one at a time: a goroutine that returns while locked to
// its thread takes the thread with it (as a file operation's as a user does). Called when the agent is idle.
func trimThreads(n int) {
	for extra := threadCount() - n; extra > 0; extra-- {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(done)
		}()
		<-done
	}
}

// pollable returns a pipe or socket file as one the runtime's poller reads and writes (non-blocking): a
// goroutine waiting on it parks and holds no thread. Anything else is returned as it is.
func pollable(f *os.File) *os.File {
	fd := int(f.Fd())
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil {
		return f
	}
	if kind := st.Mode & syscall.S_IFMT; kind != syscall.S_IFIFO && kind != syscall.S_IFSOCK {
		return f
	}
	if syscall.SetNonblock(fd, true) != nil {
		return f
	}
	return os.NewFile(uintptr(fd), f.Name())
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "tai-agent: "+format+"\n", args...)
	os.Exit(70)
}

// connect relays stdin/stdout to the agent's socket, after checking the listener is the agent itself.
func connect() int {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socketName, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "tai-agent connect:", err)
		return 69
	}
	cred, err := unixPeerCred(c)
	if err == nil {
		err = trustedPeer(cred)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tai-agent connect: refusing the listener:", err)
		return 77
	}
	reserveThreads(connectThreads)
	stdin, stdout := pollable(os.Stdin), pollable(os.Stdout)
	growPipe(stdin, pipeSize) // the exec stream's pipes: more bytes per wake-up of the relay and the engine
	growPipe(stdout, pipeSize)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = relay(c, stdin)
		_ = c.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		_, _ = relay(stdout, c)
		done <- struct{}{}
	}()
	<-done // either side ending ends the relay: the agent sees the connection close
	return 0
}

func unixPeerCred(c *net.UnixConn) (*syscall.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// relay copies with plain reads and writes of up to 1 MiB: io.Copy's splice between the socket and the exec
// stream's pipe moved a few KiB per call and cost several times the CPU of the bytes it carried.
func relay(dst io.Writer, src io.Reader) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 1<<20))
}
