package main

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// `tai-agent vm` is the agent as PID 1 of a microVM: the kernel runs it from the initramfs as /init, with "vm"
// after "--" on its command line (the kernel passes what follows "--" to init as its arguments). It makes the
// mounts a session needs, loads the initramfs's kernel modules, finds the virtio-serial ports named "tai",
// "tai1", ... (`tai-agent vm N`: N of them, 1 by default) and then is the agent of `serve`, serving its
// protocol over each port (one host connection at a time on each) as well as on the abstract socket.

const (
	portName    = "tai" // the first port; the others are "tai1", "tai2", ...
	maxPorts    = 16
	moduleOrder = "/lib/modules/load.order" // one module path a line, each after the modules it needs
	portWait    = 30 * time.Second
	// how often a port with no host is asked again: it reports POLLHUP without waiting while none is there
	hostPoll = 20 * time.Millisecond
	pollIn   = 0x1
	pollHup  = 0x10
)

// finit_module(2); amd64's syscall table in the standard library stops short of it.
var sysFinitModule = map[string]uintptr{"amd64": 313, "arm64": 273}

func vm() {
	if os.Getpid() != 1 {
		fatal("vm: not PID 1 (it mounts over /dev, /proc, /sys, /tmp and /run)")
	}
	oomCountFiles = []string{"/proc/vmstat"} // the guest kernel's: the whole guest is the session
	for _, m := range []struct {
		fstype, target string
		flags          uintptr
		data           string
	}{
		{"devtmpfs", "/dev", syscall.MS_NOSUID, "mode=0755"},
		{"devpts", "/dev/pts", syscall.MS_NOSUID | syscall.MS_NOEXEC, "mode=0620,ptmxmode=0666"},
		{"tmpfs", "/dev/shm", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777"},
		{"proc", "/proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
		{"sysfs", "/sys", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
		{"tmpfs", "/tmp", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=0755"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			fatal("vm: %v", err)
		}
		if err := syscall.Mount(m.fstype, m.target, m.fstype, m.flags, m.data); err != nil {
			fatal("vm: mount %s on %s: %v", m.fstype, m.target, err)
		}
	}
	if err := loopbackUp(); err != nil {
		fmt.Fprintln(os.Stderr, "tai-agent: vm: lo:", err)
	}
	// The guest's RAM is the session's whole memory and the agent is its PID 1, whose death panics the guest:
	// the Go heap is held near a quarter of it (a soft limit: the collector works harder there, nothing fails),
	// so the garbage of many busy commands' output rings cannot take the guest into out-of-memory.
	if total := memTotalBytes(); total > 0 {
		debug.SetMemoryLimit(total / 4)
	}
	loadModules(moduleOrder)
	count := 1
	if len(os.Args) > 2 {
		n, err := strconv.Atoi(os.Args[2])
		if err != nil || n < 1 || n > maxPorts {
			fatal("vm: the number of ports must be 1 to %d, not %q", maxPorts, os.Args[2])
		}
		count = n
	}
	ports := make([]string, count)
	for i := range ports {
		name := portName
		if i > 0 {
			name = portName + strconv.Itoa(i)
		}
		port, err := findPort(name, portWait)
		if err != nil {
			fatal("vm: %v", err)
		}
		ports[i] = port
	}
	serve(func(a *agent) {
		for _, port := range ports[1:] {
			go a.servePort(port)
		}
		a.servePort(ports[0])
	})
}

// loopbackUp sets lo up; the kernel gives it 127.0.0.1 and ::1 then.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	var ifr [40]byte // struct ifreq: the name, then ifr_flags
	copy(ifr[:], "lo")
	if err := ioctl(fd, syscall.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); err != nil {
		return err
	}
	*(*uint16)(unsafe.Pointer(&ifr[16])) |= syscall.IFF_UP
	return ioctl(fd, syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0])))
}

// loadModules loads the modules the list names, in its order; one already there (built in, or loaded) is fine.
// A module that fails is reported on the console and the boot goes on: what needed it fails visibly later.
func loadModules(list string) {
	b, err := os.ReadFile(list)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(os.Stderr, "tai-agent: vm: modules:", err)
		}
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		path := strings.TrimSpace(line)
		if path == "" || strings.HasPrefix(path, "#") {
			continue
		}
		if err := finitModule(path); err != nil && !errors.Is(err, syscall.EEXIST) {
			fmt.Fprintf(os.Stderr, "tai-agent: vm: module %s: %v\n", path, err)
		}
	}
}

func finitModule(path string) error {
	nr, ok := sysFinitModule[runtime.GOARCH]
	if !ok {
		return syscall.ENOSYS
	}
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	params := []byte{0}
	if _, _, e := syscall.Syscall(nr, uintptr(fd), uintptr(unsafe.Pointer(&params[0])), 0); e != 0 {
		return e
	}
	return nil
}

// findPort waits for the virtio-serial port called name: its device appears once virtio_console has seen it,
// and its name once the host has told it.
func findPort(name string, wait time.Duration) (string, error) {
	limit := time.Now().Add(wait)
	for {
		names, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, n := range names {
			if b, err := os.ReadFile(n); err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(n))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(limit) {
			return "", fmt.Errorf("no virtio-serial port named %q after %v (ports: %v)", name, wait, names)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A port is one byte stream with no connections of its own: all the guest sees of the host's side is
// whether a host is there (QEMU's chardev has a client), and that unreliably. A host that leaves and comes
// back at once is often never seen gone (the kernel takes both changes before the reader looks), and one
// that has just come back can be seen gone for a moment (its bytes can come before the news of it). So on
// a port a HELLO is what begins a connection: one at a frame boundary of the connection before it ends
// that one, and so does one that comes first after the host was seen away, whatever the connection was in
// the middle of (that host left inside a frame). Otherwise an absence only pauses the stream.
type port struct {
	fd      int
	f       *os.File
	in      *bufio.Reader // over the port (Read): one reader for every connection, so no byte is lost between two
	away    bool          // no host was there since the last byte given
	held    []byte        // read but not given yet (what came after an absence, until it is known)
	scratch []byte
}

// errNewHost is a port's read meeting a new host's HELLO after an absence; the HELLO stays to be read.
var errNewHost = errors.New("a new host on the port")

// servePort serves the host over the port at path, one connection at a time, for the agent's life. Each
// connection writes through a dup of the port of its own, so ending it (closing the dup) stops its blocked
// writes (a port with no host blocks them) and no other's. The port stays open throughout: closing it would
// throw away what a host that came back has already sent.
func (a *agent) servePort(path string) {
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if err != nil {
		fatal("vm: open %s: %v", path, err)
	}
	// O_NONBLOCK (shared with the dups) makes these files of the runtime's poller: a close wakes their calls
	p := &port{fd: fd, f: os.NewFile(uintptr(fd), path), scratch: make([]byte, 64<<10)}
	p.in = bufio.NewReaderSize(p, 64<<10)
	for {
		dup, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			fatal("vm: dup %s: %v", path, e)
		}
		cn := a.newConn(os.NewFile(dup, path))
		cn.port = p
		if !cn.serve() {
			// a protocol error: this host's stream is dropped until a new host's HELLO
			if _, err := io.Copy(io.Discard, p.in); !errors.Is(err, errNewHost) {
				fatal("vm: port: %v", err)
			}
		}
	}
}

// Read waits while no host is there; what comes first after an absence is held until it is known whether
// it begins with a HELLO (errNewHost).
func (p *port) Read(b []byte) (int, error) {
	if len(p.held) == 0 && !p.away {
		n, err := p.f.Read(b)
		if err != io.EOF {
			return n, err
		}
		p.away = true
		p.waitHost()
	}
	for len(p.held) == 0 || p.away && len(p.held) < helloStart && mayBeHello(p.held) {
		n, err := p.f.Read(p.scratch)
		switch {
		case n > 0:
			p.held = append(p.held, p.scratch[:n]...)
		case err == io.EOF:
			p.away = true
			p.waitHost()
		case err != nil:
			return 0, err
		}
	}
	if p.away {
		p.away = false
		if mayBeHello(p.held) {
			return 0, errNewHost
		}
	}
	n := copy(b, p.held)
	p.held = p.held[n:]
	return n, nil
}

// helloStart is how much of a frame tells a HELLO: its length, type, id 0 and the JSON's "{".
const helloStart = headerSize + 1

// mayBeHello says whether b (of any length) can begin a HELLO frame.
func mayBeHello(b []byte) bool {
	want := []byte{0, 0xff, 0xff, 0xff, tHello, 0, 0, 0, 0, '{'} // 0xff: any byte (a length below 16 MiB)
	for i := 0; i < len(b) && i < len(want); i++ {
		if want[i] != 0xff && b[i] != want[i] {
			return false
		}
	}
	return true
}

// next runs at each frame boundary of a connection on the port: it says whether the connection has ended
// (the next frame is a new host's HELLO).
func (p *port) next(hello bool) bool {
	for {
		h, err := p.in.Peek(headerSize)
		switch {
		case err == nil:
			return hello && h[4] == tHello
		case !errors.Is(err, errNewHost):
			return false // readFrame meets it
		}
		_, _ = p.in.Discard(len(h)) // a former host's last bytes
		if hello {
			return true
		}
	}
}

// waitHost returns once a host is on the port: it no longer reports POLLHUP (it has data, or is connected).
func (p *port) waitHost() {
	for {
		if revents := ppoll(p.fd, pollIn); revents&pollHup == 0 {
			return
		}
		time.Sleep(hostPoll)
	}
}

// ppoll waits, with no time limit, until fd has one of events, or POLLHUP or POLLERR; it returns revents.
func ppoll(fd int, events int16) int16 {
	pfd := struct {
		fd      int32
		events  int16
		revents int16
	}{fd: int32(fd), events: events}
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, 0, 0, 0, 0)
		if e == 0 {
			return pfd.revents
		}
		if e != syscall.EINTR {
			fatal("vm: ppoll: %v", e)
		}
	}
}

// RNDADDENTROPY: adds bytes to the kernel's entropy pool and credits them (needs CAP_SYS_ADMIN: PID 1 has it).
const rndAddEntropy = 0x40085203

// RNDRESEEDCRNG: reseeds the kernel's CRNG from its pool now. Credited entropy alone is taken only at the
// CRNG's next scheduled reseed (up to a minute away), and until then clones would give the same bytes.
const rndReseedCrng = 0x5207

const maxSeed = 512 // hex digits

// refreshGuest makes a guest restored from a snapshot its own: the host's seed goes into the kernel's RNG
// (clones of one snapshot must not share its state) and the host's clock becomes the guest's (the snapshot's
// is as old as the snapshot). A HELLO over a port carries both; what was done is the reply's "refreshed".
func refreshGuest(unix float64, seedHex string) map[string]any {
	done := map[string]any{}
	if seed, err := hex.DecodeString(seedHex); err == nil && len(seed) > 0 && len(seedHex) <= maxSeed {
		buf := make([]byte, 8+len(seed)) // struct rand_pool_info { int entropy_count; int buf_size; u32 buf[]; }
		binary.LittleEndian.PutUint32(buf[0:], uint32(8*len(seed)))
		binary.LittleEndian.PutUint32(buf[4:], uint32(len(seed)))
		copy(buf[8:], seed)
		if f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0); err == nil {
			_, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0])))
			if e == 0 {
				_, _, e = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), rndReseedCrng, 0)
			}
			f.Close()
			done["seed"] = e == 0
		}
	}
	if unix > 0 {
		now := float64(time.Now().UnixNano()) / 1e9
		if unix-now > 0.05 || now-unix > 0.05 {
			sec := int64(unix)
			tv := syscall.Timeval{Sec: sec, Usec: int64((unix - float64(sec)) * 1e6)}
			done["clock"] = syscall.Settimeofday(&tv) == nil
		}
	}
	return done
}

// memTotalBytes is the guest's RAM as the kernel counts it (/proc/meminfo's MemTotal); 0 when unreadable.
func memTotalBytes() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
