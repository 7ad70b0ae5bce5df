package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// Files are confined to a root directory by the kernel: every path is resolved with openat2(2) and
// RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS from the root's fd, so "..", absolute paths and symlinks that
// leave the root fail in the kernel (EXDEV), whatever happens to the tree meanwhile. No string checks.

const (
	sysOpenat2           = 437
	resolveNoMagiclinks  = 0x02
	resolveBeneath       = 0x08
	maxUploads           = 16
	maxListEntries       = 10000
	listPageBytes        = maxPayload - 64<<10 // a FILE_LIST page's entries, with room for the reply's own keys
	maxDeleteDepth       = 256
	fileDataHeader       = 8 // u64 file size before the bytes of a FILE_DATA reply
	maxReadChunk         = maxPayload - fileDataHeader
	uploadPrefix         = ".tai-upload-"
	oPath                = 0x200000 // O_PATH (not in package syscall)
	fileOpsPerConnection = 8
)

// Frame types for files, client to agent (every answer is FILE_REPLY, FILE_DATA or ERROR with op "file").
const (
	tFileStat     byte = 0x30
	tFileList     byte = 0x31
	tFileRead     byte = 0x32
	tUploadOpen   byte = 0x33
	tUploadData   byte = 0x34
	tUploadCommit byte = 0x35
	tUploadAbort  byte = 0x36
	tFileDelete   byte = 0x37
	tFileRename   byte = 0x38
	tFileMkdir    byte = 0x39

	tFileReply byte = 0xA0
	tFileData  byte = 0xA1
)

type openHow struct {
	flags   uint64
	mode    uint64
	resolve uint64
}

// openBeneath opens path under dirfd, never resolving outside it.
func openBeneath(dirfd int, path string, flags int, mode uint32) (int, error) {
	if path == "" {
		path = "."
	}
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return -1, syscall.EINVAL
	}
	how := openHow{flags: uint64(flags | syscall.O_CLOEXEC), mode: uint64(mode), resolve: resolveBeneath | resolveNoMagiclinks}
	for {
		fd, _, e := syscall.Syscall6(sysOpenat2, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
			uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
		if e == syscall.EINTR || e == syscall.EAGAIN {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(fd), nil
	}
}

type fileRequest struct {
	Root      string `json:"root"`
	Path      string `json:"path"`
	To        string `json:"to"`
	Offset    int64  `json:"offset"`
	Length    int64  `json:"length"`
	Mode      uint32 `json:"mode"`
	Parents   bool   `json:"parents"`
	Recursive bool   `json:"recursive"`
	After     string `json:"after"` // FILE_LIST: the page after this name (the names come sorted)
	Uid       *int   `json:"uid"`   // with gid: the user whose rights the operation runs with (what it creates is theirs)
	Gid       *int   `json:"gid"`
}

// owner is the user a file operation runs as; nil: the agent's own rights (root).
type owner struct{ uid, gid int }

func (r fileRequest) owner() (*owner, error) {
	if r.Uid == nil && r.Gid == nil {
		return nil, nil
	}
	if r.Uid == nil || r.Gid == nil || *r.Uid < 0 || *r.Gid < 0 {
		return nil, syscall.EINVAL
	}
	return &owner{*r.Uid, *r.Gid}, nil
}

// asUser runs f with the filesystem rights of own (nil: the agent's own) on an OS thread of its own. The
// thread's fsuid and fsgid become the user's and its supplementary groups none, which also clears its
// file capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN...: capabilities(7)), so the kernel checks
// every access, and owns every file and folder made, as for that user. The thread is never unlocked, so
// it ends with the goroutine and no other work runs with those credentials.
func asUser(own *owner, f func()) error {
	if own == nil {
		f()
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := setThreadFsCreds(own.uid, own.gid); err != nil {
			errc <- err
			return
		}
		f()
		errc <- nil
	}()
	return <-errc
}

// setThreadFsCreds changes the calling thread's credentials only (raw syscalls: Go's syscall.Setgroups
// would change every thread's).
func setThreadFsCreds(uid, gid int) error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return e
	}
	syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(gid), 0, 0)
	syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(uid), 0, 0)
	// setfsuid and setfsgid answer the previous id, never an error: an invalid id (-1) asks for the current
	gotGid, _, _ := syscall.RawSyscall(syscall.SYS_SETFSGID, ^uintptr(0), 0, 0)
	gotUid, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0)
	if int(uint32(gotUid)) != uid || int(uint32(gotGid)) != gid {
		return syscall.EPERM
	}
	return nil
}

type upload struct {
	parent int
	fd     int
	tmp    string
	base   string
	size   int64
	own    *owner // the commit's rename runs as the user too
}

type fileState struct {
	mu      sync.Mutex
	uploads map[uint32]*upload
	failed  map[uint32]error // an upload whose write failed: its commit reports this
	sem     chan struct{}
}

func newFileState() *fileState {
	return &fileState{uploads: map[uint32]*upload{}, failed: map[uint32]error{},
		sem: make(chan struct{}, fileOpsPerConnection)}
}

func (fs *fileState) abortAll() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for id, u := range fs.uploads {
		u.abort()
		delete(fs.uploads, id)
	}
}

func (u *upload) abort() {
	syscall.Close(u.fd)
	_ = unlinkat(u.parent, u.tmp, 0)
	syscall.Close(u.parent)
}

func openRoot(root string) (int, error) {
	if !strings.HasPrefix(root, "/") {
		return -1, syscall.EINVAL
	}
	return syscall.Open(root, oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
}

// splitParent splits a path into the folder to resolve and a last component that must be a plain name.
func splitParent(path string) (string, string, error) {
	path = strings.TrimRight(path, "/")
	dir, base := ".", path
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		dir, base = path[:i], path[i+1:]
		if dir == "" {
			return "", "", syscall.EXDEV // an absolute path: never beneath the root
		}
	}
	if base == "" || base == "." || base == ".." {
		return "", "", syscall.EINVAL
	}
	return dir, base, nil
}

// openParent opens the folder that holds path (creating it, with parents, when asked).
func openParent(rootfd int, path string, create bool) (int, string, error) {
	dir, base, err := splitParent(path)
	if err != nil {
		return -1, "", err
	}
	if create {
		if err := mkdirAll(rootfd, dir); err != nil {
			return -1, "", err
		}
	}
	fd, err := openBeneath(rootfd, dir, oPath|syscall.O_DIRECTORY, 0)
	return fd, base, err
}

func mkdirAll(rootfd int, dir string) error {
	if dir == "." || dir == "" {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		if parts[i] == "" || parts[i] == "." {
			continue
		}
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := openBeneath(rootfd, prefix, oPath|syscall.O_DIRECTORY, 0)
		if err == nil {
			syscall.Close(fd)
			continue
		}
		if err != syscall.ENOENT {
			return err
		}
		parent, err := openBeneath(rootfd, strings.Join(parts[:i], "/"), oPath|syscall.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = mkdirat(parent, parts[i], 0o755)
		syscall.Close(parent)
		if err != nil && err != syscall.EEXIST {
			return err
		}
	}
	return nil
}

func mkdirat(dirfd int, name string, mode uint32) error {
	return syscall.Mkdirat(dirfd, name, mode)
}

func unlinkat(dirfd int, name string, flags int) error {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	if _, _, e := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(flags)); e != 0 {
		return e
	}
	return nil
}

func statJSON(st *syscall.Stat_t) map[string]any {
	kind := "other"
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		kind = "file"
	case syscall.S_IFDIR:
		kind = "dir"
	case syscall.S_IFLNK:
		kind = "symlink"
	}
	return map[string]any{"type": kind, "size": st.Size, "mode": st.Mode & 0o7777,
		"mtime": float64(st.Mtim.Sec) + float64(st.Mtim.Nsec)/1e9, "uid": st.Uid, "gid": st.Gid}
}

// handleFile runs one file frame. Uploads run in order on the reader (a write's back-pressure is the
// connection's); the other operations run beside it, a few at a time per connection.
func (cn *conn) handleFile(f frame) error {
	switch f.typ {
	case tUploadData:
		if len(f.payload) < 8 {
			return errors.New("UPLOAD_DATA needs its offset")
		}
		cn.uploadData(f.id, int64(binary.BigEndian.Uint64(f.payload)), f.payload[8:])
		return nil
	case tUploadCommit, tUploadAbort:
		if len(f.payload) != 0 {
			return fmt.Errorf("frame 0x%02x takes no payload", f.typ)
		}
		cn.uploadEnd(f.id, f.typ == tUploadCommit)
		return nil
	}
	var req fileRequest
	if err := decodeControl(f.payload, &req); err != nil {
		return err
	}
	if f.typ == tUploadOpen {
		cn.uploadOpen(f.id, req)
		return nil
	}
	cn.files.sem <- struct{}{}
	go func() {
		defer func() { <-cn.files.sem }()
		var reply map[string]any
		var data []byte
		own, err := req.owner()
		if err == nil {
			if e := asUser(own, func() { reply, data, err = runFileOp(f.typ, req) }); e != nil {
				err = e
			}
		}
		switch {
		case err != nil:
			cn.fail(f.id, "file", errnoName(err), err.Error())
		case data != nil:
			_ = cn.write(tFileData, f.id, data)
		default:
			_ = cn.writeJSON(tFileReply, f.id, reply)
		}
	}()
	return nil
}

func runFileOp(typ byte, req fileRequest) (map[string]any, []byte, error) {
	rootfd, err := openRoot(req.Root)
	if err != nil {
		return nil, nil, err
	}
	defer syscall.Close(rootfd)
	switch typ {
	case tFileStat:
		fd, err := openBeneath(rootfd, req.Path, oPath, 0)
		if err != nil {
			return nil, nil, err
		}
		defer syscall.Close(fd)
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			return nil, nil, err
		}
		return statJSON(&st), nil, nil
	case tFileList:
		return listDir(rootfd, req.Path, req.After)
	case tFileRead:
		// O_NONBLOCK: opening a FIFO planted by session code must not wait for a writer (a regular
		// file's reads ignore the flag); anything but a regular file is refused at once
		fd, err := openBeneath(rootfd, req.Path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != nil {
			return nil, nil, err
		}
		defer syscall.Close(fd)
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			return nil, nil, err
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
		case syscall.S_IFDIR:
			return nil, nil, syscall.EISDIR
		default: // a FIFO, socket or device: never read (a device may not end, a FIFO may never answer)
			return nil, nil, syscall.ENODEV
		}
		n := min(max(req.Length, 0), maxReadChunk)
		buf := make([]byte, fileDataHeader+n)
		binary.BigEndian.PutUint64(buf, uint64(st.Size))
		got := 0
		for got < int(n) {
			m, err := syscall.Pread(fd, buf[fileDataHeader+got:], req.Offset+int64(got))
			if err == syscall.EINTR {
				continue
			}
			if err != nil {
				return nil, nil, err
			}
			if m == 0 {
				break
			}
			got += m
		}
		return nil, buf[:fileDataHeader+got], nil
	case tFileMkdir:
		if req.Parents {
			return map[string]any{}, nil, mkdirAll(rootfd, strings.TrimRight(req.Path, "/"))
		}
		parent, base, err := openParent(rootfd, req.Path, false)
		if err != nil {
			return nil, nil, err
		}
		defer syscall.Close(parent)
		return map[string]any{}, nil, mkdirat(parent, base, 0o755)
	case tFileDelete:
		parent, base, err := openParent(rootfd, req.Path, false)
		if err != nil {
			return nil, nil, err
		}
		defer syscall.Close(parent)
		return map[string]any{}, nil, removeAt(parent, base, req.Recursive, 0)
	case tFileRename:
		from, fbase, err := openParent(rootfd, req.Path, false)
		if err != nil {
			return nil, nil, err
		}
		defer syscall.Close(from)
		to, tbase, err := openParent(rootfd, req.To, req.Parents)
		if err != nil {
			return nil, nil, err
		}
		defer syscall.Close(to)
		return map[string]any{}, nil, syscall.Renameat(from, fbase, to, tbase)
	}
	return nil, nil, syscall.ENOSYS
}

// listDir lists a folder a page at a time, its names sorted: the entries after the name “after“, as many as
// fit one reply frame (with room to spare) and at most maxListEntries; "next" names the last one when more
// follow (the client asks again with it as “after“), and "truncated" says so too.
func listDir(rootfd int, path, after string) (map[string]any, []byte, error) {
	fd, err := openBeneath(rootfd, path, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, nil, err
	}
	defer syscall.Close(fd)
	names, err := readNames(fd)
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(names)
	if after != "" {
		names = names[sort.Search(len(names), func(i int) bool { return names[i] > after }):]
	}
	entries := []map[string]any{}
	size, last := 0, ""
	for _, name := range names {
		var st syscall.Stat_t
		if fstatat(fd, name, &st) != nil {
			continue // gone meanwhile
		}
		e := statJSON(&st)
		e["name"] = name
		encoded, err := json.Marshal(e)
		if err != nil {
			return nil, nil, err
		}
		if len(entries) == maxListEntries || size+len(encoded)+1 > listPageBytes {
			return map[string]any{"entries": entries, "truncated": true, "next": last}, nil, nil
		}
		size += len(encoded) + 1
		entries = append(entries, e)
		last = name
	}
	return map[string]any{"entries": entries, "truncated": false}, nil, nil
}

func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := syscall.ReadDirent(fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
}

// fstatat stats name in dirfd without following a symlink (an O_PATH|O_NOFOLLOW fd, then fstat).
func fstatat(dirfd int, name string, st *syscall.Stat_t) error {
	fd, err := syscall.Openat(dirfd, name, oPath|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return syscall.Fstat(fd, st)
}

// removeAt deletes name in dirfd: a file or symlink, an empty folder, or with recursive a whole tree,
// walking by fds (never following a symlink out).
func removeAt(dirfd int, name string, recursive bool, depth int) error {
	const atRemovedir = 0x200
	err := unlinkat(dirfd, name, 0)
	if err != syscall.EISDIR && err != syscall.EPERM {
		return err
	}
	if recursive {
		if depth > maxDeleteDepth {
			return syscall.ELOOP
		}
		sub, err := syscall.Openat(dirfd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		names, err := readNames(sub)
		for _, n := range names {
			if err == nil {
				err = removeAt(sub, n, true, depth+1)
			}
		}
		syscall.Close(sub)
		if err != nil {
			return err
		}
	}
	return unlinkat(dirfd, name, atRemovedir)
}

// ----- uploads: a temp file beside the target, renamed over it at commit -----

func (cn *conn) uploadOpen(id uint32, req fileRequest) {
	fs := cn.files
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, dup := fs.uploads[id]; dup {
		cn.fail(id, "file", "EEXIST", "an upload with this id is open")
		return
	}
	if len(fs.uploads) >= maxUploads {
		cn.fail(id, "file", "EAGAIN", fmt.Sprintf("%d uploads open", maxUploads))
		return
	}
	own, err := req.owner()
	if err != nil {
		cn.fail(id, "file", errnoName(err), "uid and gid go together")
		return
	}
	var u *upload
	if e := asUser(own, func() { u, err = openUpload(req) }); e != nil {
		err = e
	}
	if err != nil {
		cn.fail(id, "file", errnoName(err), err.Error())
		return
	}
	u.own = own
	fs.uploads[id] = u
	_ = cn.writeJSON(tFileReply, id, map[string]any{"op": "upload_open"})
}

// openUpload makes the upload's temporary file beside its target (with the target's folders, when asked).
func openUpload(req fileRequest) (*upload, error) {
	rootfd, err := openRoot(req.Root)
	if err != nil {
		return nil, err
	}
	parent, base, err := openParent(rootfd, req.Path, req.Parents)
	syscall.Close(rootfd)
	if err != nil {
		return nil, err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := uploadPrefix + hex.EncodeToString(rnd[:])
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	fd, err := syscall.Openat(parent, tmp, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, mode&0o7777)
	if err != nil {
		syscall.Close(parent)
		return nil, err
	}
	_ = syscall.Fchmod(fd, mode&0o7777) // the umask does not decide an upload's mode
	return &upload{parent: parent, fd: fd, tmp: tmp, base: base}, nil
}

func (cn *conn) uploadData(id uint32, offset int64, data []byte) {
	fs := cn.files
	fs.mu.Lock()
	defer fs.mu.Unlock()
	u := fs.uploads[id]
	if u == nil {
		if _, failed := fs.failed[id]; !failed {
			cn.fail(id, "file", "EBADF", "no such upload")
		}
		return
	}
	for len(data) > 0 {
		n, err := syscall.Pwrite(u.fd, data, offset)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			u.abort()
			delete(fs.uploads, id)
			if len(fs.failed) < maxUploads {
				fs.failed[id] = err
			}
			return
		}
		data, offset = data[n:], offset+int64(n)
	}
	u.size = max(u.size, offset)
}

func (cn *conn) uploadEnd(id uint32, commit bool) {
	fs := cn.files
	fs.mu.Lock()
	defer fs.mu.Unlock()
	u := fs.uploads[id]
	if u == nil {
		if err, failed := fs.failed[id]; failed {
			delete(fs.failed, id)
			cn.fail(id, "file", errnoName(err), "upload failed: "+err.Error())
		} else {
			cn.fail(id, "file", "EBADF", "no such upload")
		}
		return
	}
	delete(fs.uploads, id)
	if !commit {
		u.abort()
		_ = cn.writeJSON(tFileReply, id, map[string]any{"op": "upload_abort"})
		return
	}
	syscall.Close(u.fd)
	var err error
	if e := asUser(u.own, func() { err = syscall.Renameat(u.parent, u.tmp, u.parent, u.base) }); e != nil {
		err = e
	}
	if err != nil {
		_ = unlinkat(u.parent, u.tmp, 0)
	}
	syscall.Close(u.parent)
	if err != nil {
		cn.fail(id, "file", errnoName(err), err.Error())
		return
	}
	_ = cn.writeJSON(tFileReply, id, map[string]any{"op": "upload_commit", "size": u.size})
}
