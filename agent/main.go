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
	"sync"
	"syscall"
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

// The OS threads each process makes at its start, while the container has pids to spare. The Go runtime
// keeps idle threads for reuse, and a thread it cannot create is fatal: a command that takes every pid the
// container may have (a fork bomb under pids_limit) must not then kill the relay, or PID 1, the moment one
// more blocking call needs a thread.
const (
	serveThreads   = 16
	connectThreads = 6
)

// reserveThreads makes n OS threads now and leaves them idle in the runtime's pool: each of n goroutines
// holds a thread of its own (LockOSThread) until all are running, then lets it go.
func reserveThreads(n int) {
	var locked sync.WaitGroup
	release := make(chan struct{})
	locked.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	close(release)
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
	growPipe(os.Stdin, pipeSize) // the exec stream's pipes: more bytes per wake-up of the relay and the engine
	growPipe(os.Stdout, pipeSize)
	done := make(chan struct{}, 2)
	go func() {
		_, _ = relay(c, os.Stdin)
		_ = c.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		_, _ = relay(os.Stdout, c)
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
