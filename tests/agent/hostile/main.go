// Command hostile is session code trying to reach the session agent's channel; it prints one line per
// attempt, "REFUSED <name>: <error>" or "OPEN <name>", and the test requires every line to be REFUSED.
package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func report(name string, err error) {
	if err != nil {
		fmt.Printf("REFUSED %s: %v\n", name, err)
	} else {
		fmt.Printf("OPEN %s\n", name)
	}
}

// agentPids: PID 1 and every `connect` relay (comm "agent").
func agentPids() []int {
	pids := []int{1}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
		if strings.TrimSpace(string(comm)) == "agent" {
			pids = append(pids, pid)
		}
	}
	return pids
}

func tryOpen(name, path string) {
	f, err := os.Open(path)
	if err == nil {
		buf := make([]byte, 1)
		_, err = f.Read(buf)
		f.Close()
		if err != nil && err.Error() == "EOF" {
			err = nil
		}
	}
	report(name, err)
}

func tryWrite(name, path string) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.Write([]byte("forged"))
		f.Close()
	}
	report(name, err)
}

func hello() []byte {
	p := []byte(`{"version":1}`)
	b := binary.BigEndian.AppendUint32(nil, uint32(len(p)+5))
	b = append(b, 1, 0, 0, 0, 0)
	return append(b, p...)
}

// tryChannel connects to the agent's socket, says HELLO and counts the reply as success.
func tryChannel(name string, c net.Conn, err error) {
	if err != nil {
		report(name, err)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(hello()); err != nil {
		report(name, err)
		return
	}
	buf := make([]byte, 9)
	_, err = c.Read(buf)
	if err == nil && buf[4] == 0x81 {
		report(name, nil)
		return
	}
	if err == nil {
		err = fmt.Errorf("answered frame type 0x%02x", buf[4])
	}
	report(name, err)
}

// fakeAgent tries to take the agent's socket name with its own listener that answers HELLO, then waits.
func fakeAgent() {
	ln, err := net.Listen("unix", "@tai-agent")
	if err != nil {
		fmt.Println("LISTEN FAILED", err)
		os.Exit(1)
	}
	fmt.Println("LISTENING")
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p := []byte(`{"version":1,"pid":1}`)
		b := binary.BigEndian.AppendUint32(nil, uint32(len(p)+5))
		b = append(b, 0x81, 0, 0, 0, 0)
		_, _ = c.Write(append(b, p...))
		fmt.Println("ANSWERED")
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "fake-agent" {
		fakeAgent()
		return
	}
	for _, pid := range agentPids() {
		p := "/proc/" + strconv.Itoa(pid)
		tag := fmt.Sprintf("pid %d", pid)
		tryOpen(tag+" environ", p+"/environ")
		tryOpen(tag+" mem", p+"/mem")
		tryOpen(tag+" root", p+"/root/.tai/agent")
		_, err := os.Readlink(p + "/exe")
		report(tag+" exe", err)
		entries, err := os.ReadDir(p + "/fd")
		if err != nil {
			report(tag+" fd dir", err)
		}
		for _, e := range entries {
			tryOpen(tag+" fd "+e.Name(), p+"/fd/"+e.Name())
			tryWrite(tag+" fd "+e.Name()+" write", p+"/fd/"+e.Name())
		}
		err = syscall.PtraceAttach(pid)
		if err == nil {
			_ = syscall.PtraceDetach(pid)
		}
		report(tag+" ptrace attach", err)
		report(tag+" ptrace seize", ptraceSeize(pid))
	}
	// the control: ptrace itself works here on an ordinary (dumpable) process of the session, so the
	// refusals above come from the agent being non-dumpable, not from a seccomp profile
	child := exec.Command("/bin/sleep", "30")
	if err := child.Start(); err != nil {
		fmt.Println("CONTROL ptrace child:", err)
	} else {
		err := syscall.PtraceAttach(child.Process.Pid)
		if err == nil {
			_ = syscall.PtraceDetach(child.Process.Pid)
			fmt.Println("CONTROL ptrace child: ok")
		} else {
			fmt.Println("CONTROL ptrace child:", err)
		}
		_ = child.Process.Kill()
		_ = child.Wait()
	}
	c, err := net.Dial("unix", "@tai-agent")
	tryChannel("socket", c, err)
	// the agent binary's own relay, started from inside the session (its parent is not 0)
	cmd := exec.Command("/.tai/agent", "connect")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		report("relay", err)
	} else {
		_, _ = stdin.Write(hello())
		buf := make([]byte, 9)
		done := make(chan error, 1)
		go func() { _, err := stdout.Read(buf); done <- err }()
		select {
		case err = <-done:
			if err == nil && buf[4] == 0x81 {
				report("relay", nil)
			} else {
				report("relay", fmt.Errorf("no HELLO (%v)", err))
			}
		case <-time.After(3 * time.Second):
			report("relay", fmt.Errorf("no answer"))
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	fmt.Println("DONE")
}

func ptraceSeize(pid int) error {
	const ptraceSeize = 0x4206
	_, _, e := syscall.Syscall6(syscall.SYS_PTRACE, ptraceSeize, uintptr(pid), 0, 0, 0, 0)
	if e != 0 {
		return e
	}
	_, _, _ = syscall.Syscall6(syscall.SYS_PTRACE, syscall.PTRACE_DETACH, uintptr(pid), 0, 0, 0, 0)
	return nil
}
