package main

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// A command's group holder is a process that only exits: its zombie, kept by the agent, holds the group id.
// Exec'ing the agent itself for that maps 3 MiB and starts the Go runtime for nothing, so the agent keeps a
// 130-byte static program that calls exit_group(0) in a sealed memfd and execs that (less work per
// command, and less CPU taken from the command itself). The memfd is sealed against every change, so nothing, not even a
// process that could reach the agent's fds, can swap the program the agent runs as root. Where a memfd
// cannot be made or executed (a kernel with vm.memfd_noexec=2, a seccomp filter), the agent falls back to
// "/proc/self/exe hold".

const (
	mfdCloexec      = 0x1
	mfdAllowSealing = 0x2
	fAddSeals       = 1033
	sealAll         = 0x1 | 0x2 | 0x4 | 0x8 // F_SEAL_SEAL, SHRINK, GROW, WRITE
)

// exitCode is exit_group(0) for each architecture the agent is built for; its memfd_create syscall number.
var exitCode = map[string]struct {
	machine uint16
	code    []byte
	memfd   uintptr
}{
	// xor edi, edi; mov eax, 231; syscall
	"amd64": {0x3e, []byte{0x31, 0xff, 0xb8, 0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05}, 319},
	// mov x0, #0; mov x8, #94; svc #0
	"arm64": {0xb7, []byte{0x00, 0x00, 0x80, 0xd2, 0xc8, 0x0b, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4}, 279},
}

// exitProgram is a minimal ELF64 executable: the header, one loadable segment, the code.
func exitProgram(machine uint16, code []byte) []byte {
	const base, ehsize, phsize = 0x400000, 64, 56
	size := ehsize + phsize + len(code)
	b := make([]byte, size)
	le := binary.LittleEndian
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	le.PutUint16(b[16:], 2) // ET_EXEC
	le.PutUint16(b[18:], machine)
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base+ehsize+phsize) // entry
	le.PutUint64(b[32:], ehsize)             // program headers
	le.PutUint16(b[52:], ehsize)
	le.PutUint16(b[54:], phsize)
	le.PutUint16(b[56:], 1)
	ph := b[ehsize:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint32(ph[4:], 5) // R+X
	le.PutUint64(ph[16:], base)
	le.PutUint64(ph[24:], base)
	le.PutUint64(ph[32:], uint64(size))
	le.PutUint64(ph[40:], uint64(size))
	le.PutUint64(ph[48:], 0x10000)
	copy(b[ehsize+phsize:], code)
	return b
}

// holderPath is the sealed exit program's path for exec, or "" (the agent's own "hold" is used).
var holderPath string

// makeHolder writes the exit program into a sealed memfd and checks that it runs; on any failure the
// holder stays the agent's own "hold".
func makeHolder() {
	arch, ok := exitCode[runtime.GOARCH]
	if !ok {
		return
	}
	name := []byte("tai-hold\x00")
	fd, _, errno := syscall.Syscall(arch.memfd, uintptr(unsafe.Pointer(&name[0])), mfdCloexec|mfdAllowSealing, 0)
	if errno != 0 {
		return
	}
	program := exitProgram(arch.machine, arch.code)
	if n, err := syscall.Write(int(fd), program); err != nil || n != len(program) {
		_ = syscall.Close(int(fd))
		return
	}
	if _, _, errno = syscall.Syscall(syscall.SYS_FCNTL, fd, fAddSeals, sealAll); errno != 0 {
		_ = syscall.Close(int(fd))
		return
	}
	path := fmt.Sprintf("/proc/self/fd/%d", fd)
	pid, err := syscall.ForkExec(path, []string{"tai-hold"}, &syscall.ProcAttr{Dir: "/", Env: []string{}})
	if err != nil {
		_ = syscall.Close(int(fd))
		return
	}
	var ws syscall.WaitStatus
	for {
		if _, err = syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
			break
		}
	}
	if err != nil || !ws.Exited() || ws.ExitStatus() != 0 {
		_ = syscall.Close(int(fd))
		return
	}
	holderPath = path // the fd stays open (close-on-exec) for the agent's life
}
