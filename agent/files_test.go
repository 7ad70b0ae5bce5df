package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fileTree is a root with a file, a folder, symlinks that stay inside and ones that lead out, beside a
// secret outside the root.
func fileTree(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, filepath.Join(root, "dir"), outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must(t, os.WriteFile(filepath.Join(root, "dir", "f.txt"), []byte("inside"), 0o644))
	must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644))
	must(t, os.Symlink("dir/f.txt", filepath.Join(root, "in-link")))
	must(t, os.Symlink("../outside/secret", filepath.Join(root, "rel-out")))
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "abs-out")))
	must(t, os.Symlink("../../outside", filepath.Join(root, "dir", "up-out")))
	must(t, os.Symlink("/", filepath.Join(root, "slash")))
	return root, outside
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// openat2 is the only resolver the agent has: a kernel without it (before 5.6) or a seccomp profile that
// refuses it cannot run these tests, and the agent answers ENOSYS/EPERM there (never a fallback).
func needOpenat2(t *testing.T) {
	t.Helper()
	fd, err := openBeneath(unixRoot(t), ".", oPath|syscall.O_DIRECTORY, 0)
	if errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EPERM) {
		t.Skipf("openat2 is not available here (%v): the agent refuses every file frame on such a kernel", err)
	}
	must(t, err)
	syscall.Close(fd)
}

func unixRoot(t *testing.T) int {
	fd, err := openRoot("/")
	must(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	return fd
}

func op(typ byte, req fileRequest) (map[string]any, []byte, error) { return runFileOp(typ, req) }

func TestFilesPathsThatLeaveTheRootAreRefusedByTheKernel(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	for path, want := range map[string]syscall.Errno{
		"..": syscall.EXDEV, "../outside/secret": syscall.EXDEV, "dir/../../outside/secret": syscall.EXDEV,
		"/etc/passwd": syscall.EXDEV, "rel-out": syscall.EXDEV, "abs-out": syscall.EXDEV,
		"dir/up-out/secret": syscall.EXDEV, "slash/etc/passwd": syscall.EXDEV,
	} {
		for _, typ := range []byte{tFileStat, tFileRead, tFileList} {
			_, data, err := op(typ, fileRequest{Root: root, Path: path, Length: 100})
			if !errors.Is(err, want) {
				t.Errorf("0x%02x %q: %v, want %v", typ, path, err, want)
			}
			if strings.Contains(string(data), "secret") {
				t.Fatalf("0x%02x %q read the secret", typ, path)
			}
		}
	}
	// writes out are refused as well, and nothing is made outside
	for _, c := range []struct {
		typ byte
		req fileRequest
	}{
		{tFileMkdir, fileRequest{Root: root, Path: "../outside/made"}},
		{tFileMkdir, fileRequest{Root: root, Path: "dir/up-out/made", Parents: true}},
		{tFileRename, fileRequest{Root: root, Path: "dir/f.txt", To: "../outside/moved"}},
		{tFileRename, fileRequest{Root: root, Path: "abs-out/x", To: "stolen"}},
		{tFileDelete, fileRequest{Root: root, Path: "rel-out/secret"}},
		{tFileDelete, fileRequest{Root: root, Path: "/etc/hostname"}},
	} {
		if _, _, err := op(c.typ, c.req); err == nil {
			t.Errorf("0x%02x %+v succeeded", c.typ, c.req)
		}
	}
	if names, _ := os.ReadDir(filepath.Join(filepath.Dir(root), "outside")); len(names) != 1 {
		t.Fatalf("the outside folder changed: %v", names)
	}
}

// A magic link (/proc/<pid>/root, /proc/<pid>/fd/N) is refused even beneath the root.
func TestFilesMagicLinksAreRefused(t *testing.T) {
	needOpenat2(t)
	for _, path := range []string{"root/etc/passwd", "cwd", "exe"} {
		if _, _, err := op(tFileStat, fileRequest{Root: "/proc/self", Path: path}); !errors.Is(err, syscall.ELOOP) {
			t.Errorf("/proc/self %s: %v, want ELOOP", path, err)
		}
	}
}

func TestFilesSymlinksInsideAreFollowed(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	_, data, err := op(tFileRead, fileRequest{Root: root, Path: "in-link", Length: 100})
	if err != nil || string(data[fileDataHeader:]) != "inside" || binary.BigEndian.Uint64(data) != 6 {
		t.Fatalf("%v %q", err, data)
	}
	st, _, err := op(tFileStat, fileRequest{Root: root, Path: "dir/f.txt"})
	if err != nil || st["type"] != "file" || st["size"] != int64(6) {
		t.Fatalf("%v %v", err, st)
	}
}

func TestFilesRootMustBeAbsolute(t *testing.T) {
	if _, _, err := op(tFileStat, fileRequest{Root: "relative", Path: "."}); !errors.Is(err, syscall.EINVAL) {
		t.Fatal(err)
	}
}

func TestFilesListDoesNotFollowSymlinksAndIsBounded(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	reply, _, err := op(tFileList, fileRequest{Root: root, Path: "."})
	must(t, err)
	types := map[string]any{}
	for _, e := range reply["entries"].([]map[string]any) {
		types[e["name"].(string)] = e["type"]
	}
	if types["abs-out"] != "symlink" || types["dir"] != "dir" || types["rel-out"] != "symlink" || reply["truncated"] != false {
		t.Fatalf("%v", types)
	}
	big := filepath.Join(root, "big")
	must(t, os.Mkdir(big, 0o755))
	for i := 0; i <= maxListEntries; i++ {
		f, err := os.Create(filepath.Join(big, "f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strconv.Itoa(i)))
		must(t, err)
		f.Close()
	}
	// a folder past one reply frame comes in pages, in name order, each within a frame
	var names []string
	pages, after := 0, ""
	for {
		reply, _, err = op(tFileList, fileRequest{Root: root, Path: "big", After: after})
		must(t, err)
		pages++
		encoded, err := json.Marshal(reply)
		must(t, err)
		if len(encoded) > maxPayload {
			t.Fatalf("page %d is %d bytes, over a frame", pages, len(encoded))
		}
		for _, e := range reply["entries"].([]map[string]any) {
			names = append(names, e["name"].(string))
		}
		next, more := reply["next"].(string)
		if more != (reply["truncated"] == true) {
			t.Fatalf("next %q with truncated %v", next, reply["truncated"])
		}
		if !more {
			break
		}
		after = next
	}
	if len(names) != maxListEntries+1 || pages < 2 || !sort.StringsAreSorted(names) {
		t.Fatalf("%d names in %d pages (sorted: %v)", len(names), pages, sort.StringsAreSorted(names))
	}
}

func TestFilesReadOffsetsAndBounds(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	for _, c := range []struct {
		offset, length int64
		want           string
	}{{0, 100, "inside"}, {2, 2, "si"}, {6, 10, ""}, {100, 10, ""}, {0, -5, ""}, {0, 0, ""}} {
		_, data, err := op(tFileRead, fileRequest{Root: root, Path: "dir/f.txt", Offset: c.offset, Length: c.length})
		if err != nil || string(data[fileDataHeader:]) != c.want || binary.BigEndian.Uint64(data) != 6 {
			t.Errorf("offset %d length %d: %v %q", c.offset, c.length, err, data)
		}
	}
	// a read is one frame at most, whatever length is asked
	must(t, os.WriteFile(filepath.Join(root, "large"), make([]byte, 2<<20), 0o644))
	_, data, err := op(tFileRead, fileRequest{Root: root, Path: "large", Length: 1 << 40})
	if err != nil || len(data) != fileDataHeader+maxReadChunk || len(data) > maxPayload {
		t.Fatalf("%v: %d bytes", err, len(data))
	}
	if _, _, err := op(tFileRead, fileRequest{Root: root, Path: "dir", Length: 1}); !errors.Is(err, syscall.EISDIR) {
		t.Fatalf("reading a folder: %v", err)
	}
}

func TestFilesSocketsAndDevicesAreNotRead(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	sock := filepath.Join(root, "sock")
	ln, err := net.Listen("unix", sock)
	must(t, err)
	defer ln.Close()
	if _, data, err := op(tFileRead, fileRequest{Root: root, Path: "sock", Length: 10}); err != syscall.ENXIO {
		t.Fatalf("a socket's read answered %q, %v (not ENXIO)", data, err)
	}
	if st, _, err := op(tFileStat, fileRequest{Root: root, Path: "sock"}); err != nil || st["type"] != "other" {
		t.Fatalf("%v %v", err, st)
	}
	if os.Geteuid() != 0 {
		t.Skip("making a device node needs root")
	}
	// /dev/zero's numbers (1, 5): a read would give zeros without end
	must(t, syscall.Mknod(filepath.Join(root, "zero"), syscall.S_IFCHR|0o644, 1<<8|5))
	if _, data, err := op(tFileRead, fileRequest{Root: root, Path: "zero", Length: 10}); err != syscall.ENODEV {
		t.Fatalf("a device's read answered %q, %v (not ENODEV)", data, err)
	}
}

func TestFilesFifoReadIsRefusedAtOnce(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	done := make(chan error, 1)
	go func() {
		_, _, err := op(tFileRead, fileRequest{Root: root, Path: "fifo", Length: 10})
		done <- err
	}()
	select {
	case err := <-done:
		if err != syscall.ENODEV {
			t.Fatalf("a FIFO's read answered %v, not ENODEV", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("FILE_READ of a FIFO hangs")
	}
}

func TestFilesDeleteRemovesASymlinkNeverItsTarget(t *testing.T) {
	needOpenat2(t)
	root, outside := fileTree(t)
	_, _, err := op(tFileDelete, fileRequest{Root: root, Path: "abs-out"})
	must(t, err)
	if _, err := os.Lstat(filepath.Join(root, "abs-out")); !os.IsNotExist(err) {
		t.Fatal("the link is still there")
	}
	if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
		t.Fatal("the link's target went with it")
	}
	// a recursive delete walks by fds and leaves a link's target folder alone
	_, _, err = op(tFileDelete, fileRequest{Root: root, Path: "dir"})
	if !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("a folder without recursive: %v", err)
	}
	_, _, err = op(tFileDelete, fileRequest{Root: root, Path: "dir", Recursive: true})
	must(t, err)
	if _, err := os.Stat(filepath.Join(outside, "secret")); err != nil {
		t.Fatal("a recursive delete followed dir/up-out")
	}
}

func TestFilesMkdirAndRenameStayBeneath(t *testing.T) {
	needOpenat2(t)
	root, _ := fileTree(t)
	_, _, err := op(tFileMkdir, fileRequest{Root: root, Path: "a/b/c", Parents: true})
	must(t, err)
	if _, _, err := op(tFileMkdir, fileRequest{Root: root, Path: "x/y"}); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("without parents: %v", err)
	}
	_, _, err = op(tFileRename, fileRequest{Root: root, Path: "dir/f.txt", To: "n/m/g.txt", Parents: true})
	must(t, err)
	if b, err := os.ReadFile(filepath.Join(root, "n/m/g.txt")); err != nil || string(b) != "inside" {
		t.Fatalf("%v %q", err, b)
	}
	for _, p := range []string{".", "..", "dir/..", ""} {
		if _, _, err := op(tFileMkdir, fileRequest{Root: root, Path: p}); err == nil {
			t.Errorf("mkdir %q succeeded", p)
		}
	}
}

func TestFilesOwnerNeedsBothIds(t *testing.T) {
	one := 1000
	for _, r := range []fileRequest{{Uid: &one}, {Gid: &one}} {
		if _, err := r.owner(); !errors.Is(err, syscall.EINVAL) {
			t.Fatal(err)
		}
	}
	neg := -1
	if _, err := (fileRequest{Uid: &neg, Gid: &neg}).owner(); !errors.Is(err, syscall.EINVAL) {
		t.Fatal(err)
	}
	if o, err := (fileRequest{}).owner(); o != nil || err != nil {
		t.Fatal(o, err)
	}
}

func TestFilesRunAsTheUserAreCheckedAsTheUser(t *testing.T) {
	needOpenat2(t)
	if os.Geteuid() != 0 {
		t.Skip("changing a thread's fsuid needs CAP_SETUID")
	}
	root, _ := fileTree(t)
	must(t, os.Mkdir(filepath.Join(root, "private"), 0o700))
	must(t, os.Chmod(root, 0o777))
	must(t, os.Chmod(filepath.Dir(root), 0o755))
	must(t, os.Chmod(filepath.Dir(filepath.Dir(root)), 0o755)) // t.TempDir's own parent is 0700
	nobody := 65534
	cl := hello(t)
	id := newID()
	cl.sendJSON(tFileList, id, map[string]any{"root": root, "path": "private", "uid": nobody, "gid": nobody})
	cl.expectError(id, "EACCES")
	id = newID()
	cl.sendJSON(tFileMkdir, id, map[string]any{"root": root, "path": "theirs", "uid": nobody, "gid": nobody})
	cl.expect(tFileReply, id)
	var st syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(root, "theirs"), &st))
	if st.Uid != uint32(nobody) || st.Gid != uint32(nobody) {
		t.Fatalf("made as %d:%d", st.Uid, st.Gid)
	}
	id = newID()
	cl.sendJSON(tFileStat, id, map[string]any{"root": root, "path": ".", "uid": nobody})
	cl.expectError(id, "EINVAL")
}

func TestUploadIsAtomicAndConfined(t *testing.T) {
	needOpenat2(t)
	root, outside := fileTree(t)
	cl := hello(t)
	id := newID()
	cl.sendJSON(tUploadOpen, id, map[string]any{"root": root, "path": "dir/f.txt", "mode": 0o600})
	cl.expect(tFileReply, id)
	cl.send(tUploadData, id, append(binary.BigEndian.AppendUint64(nil, 3), "def"...))
	cl.send(tUploadData, id, append(binary.BigEndian.AppendUint64(nil, 0), "abc"...))
	// until the commit, readers see the old file
	if b, _ := os.ReadFile(filepath.Join(root, "dir/f.txt")); string(b) != "inside" {
		t.Fatalf("%q before the commit", b)
	}
	cl.send(tUploadCommit, id, nil)
	if m := cl.expect(tFileReply, id); m["size"] != 6.0 {
		t.Fatal(m)
	}
	b, _ := os.ReadFile(filepath.Join(root, "dir/f.txt"))
	fi, _ := os.Stat(filepath.Join(root, "dir/f.txt"))
	if string(b) != "abcdef" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%q %v", b, fi.Mode())
	}
	// aborted: nothing left behind, the target untouched
	id = newID()
	cl.sendJSON(tUploadOpen, id, map[string]any{"root": root, "path": "dir/f.txt"})
	cl.expect(tFileReply, id)
	cl.send(tUploadData, id, append(binary.BigEndian.AppendUint64(nil, 0), "zzz"...))
	cl.send(tUploadAbort, id, nil)
	cl.expect(tFileReply, id)
	names, _ := os.ReadDir(filepath.Join(root, "dir"))
	for _, n := range names {
		if strings.HasPrefix(n.Name(), uploadPrefix) {
			t.Fatalf("%s left behind", n.Name())
		}
	}
	// out of the root: refused at open
	// (an upload to "rel-out" would replace the link itself, inside: not a way out)
	for _, p := range []string{"../outside/up", "abs-out/x", "dir/up-out/x", "/tmp/x"} {
		id = newID()
		cl.sendJSON(tUploadOpen, id, map[string]any{"root": root, "path": p, "parents": true})
		if m := cl.expect(tError, id); m["op"] != "file" {
			t.Fatal(m)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
		t.Fatal("the outside file changed")
	}
	// data and commit for no upload
	id = newID()
	cl.send(tUploadCommit, id, nil)
	cl.expectError(id, "EBADF")
	// a connection that closes with an upload open leaves nothing behind
	id = newID()
	cl.sendJSON(tUploadOpen, id, map[string]any{"root": root, "path": "left.txt"})
	cl.expect(tFileReply, id)
	cl.c.Close()
	cl.closedBy()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		names, _ := os.ReadDir(root)
		left := false
		for _, n := range names {
			left = left || strings.HasPrefix(n.Name(), uploadPrefix)
		}
		if !left {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("an upload's temp file outlived its connection")
}
