// The gateway's audit: one JSON line per decision, appended to audit/current.part and sealed at most every
// second into audit/<20-digit unix nanoseconds>.jsonl, which the server lists, reads and deletes.

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

const gwAuditBound = 64 << 20 // sealed (and current) bytes waiting for the server; beyond, lines are dropped

type gwAuditRecord struct {
	Time       string `json:"time"`
	Deployment string `json:"deployment"`
	Owner      string `json:"owner"`
	Session    string `json:"session"`
	Client     string `json:"client"`
	Kind       string `json:"kind"`
	Host       string `json:"host"`
	Port       int    `json:"port"`
	Decision   string `json:"decision"`
	Reason     string `json:"reason"`
	Secret     string `json:"secret,omitempty"`
}

type gwAudit struct {
	dir     string
	bound   int64
	mu      sync.Mutex
	f       *os.File
	partLen int64
	sealed  int64 // bytes of sealed files at the last seal
	dropped int64
	last    int64 // the last sealed file's nanoseconds (names stay unique and ordered)
}

func openAudit(dir string) (*gwAudit, error) {
	a := &gwAudit{dir: dir, bound: gwAuditBound}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.openPart(); err != nil {
		return nil, err
	}
	a.sealLocked() // a part left by an earlier gateway is sealed at once
	return a, nil
}

func (a *gwAudit) openPart() error {
	f, err := os.OpenFile(filepath.Join(a.dir, "current.part"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	a.f, a.partLen = f, st.Size()
	return nil
}

func (a *gwAudit) write(rec gwAuditRecord) {
	line, err := json.Marshal(rec)
	if err != nil {
		return
	}
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	a.appendLocked(line)
}

func (a *gwAudit) appendLocked(line []byte) {
	if a.f == nil {
		return
	}
	if a.sealed+a.partLen+int64(len(line)) > a.bound {
		a.dropped++
		return
	}
	n, err := a.f.Write(line)
	a.partLen += int64(n)
	if err != nil {
		a.dropped++ // a full disk: counted like a line over the bound
	}
}

// seal renames a non-empty current.part to a sealed file and counts what waits.
func (a *gwAudit) seal() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sealLocked()
}

func (a *gwAudit) sealLocked() {
	a.sealed = a.sealedBytes()
	if a.dropped > 0 && a.sealed+a.partLen+256 <= a.bound {
		line := []byte(fmt.Sprintf(`{"kind":"audit-dropped","count":%d,"time":%q}`+"\n", a.dropped,
			time.Now().UTC().Format(time.RFC3339Nano)))
		a.dropped = 0
		a.appendLocked(line)
	}
	if a.f == nil || a.partLen == 0 {
		return
	}
	now := time.Now().UnixNano()
	if now <= a.last {
		now = a.last + 1
	}
	a.last = now
	a.f.Close()
	a.f = nil
	if err := os.Rename(filepath.Join(a.dir, "current.part"), filepath.Join(a.dir, fmt.Sprintf("%020d.jsonl", now))); err == nil {
		a.sealed += a.partLen
	}
	if err := a.openPart(); err != nil {
		fmt.Fprintln(os.Stderr, "tai-agent gateway: audit:", err)
	}
}

func (a *gwAudit) sealedBytes() int64 {
	entries, err := os.ReadDir(a.dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		// sealed files, and those a server claimed by renaming them (<name>.jsonl.<...>) and reads now
		if !strings.Contains(e.Name(), ".jsonl") {
			continue
		}
		if info, err := e.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}

func (a *gwAudit) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sealLocked()
	if a.f != nil {
		a.f.Close()
		a.f = nil
	}
}
