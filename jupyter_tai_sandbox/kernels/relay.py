"""The tunnel's relay: the program :mod:`~jupyter_tai_sandbox.kernels.tunnel` runs inside a session.

Run as ``python3 -u -c <this file's source> WINDOW MAX_FRAME FLOOR BUDGET``: the session needs python3 and
nothing else (this file imports only the standard library, and nothing of the package). It
multiplexes TCP connections to ``127.0.0.1:<port>`` inside the session over its stdin and stdout,
in the frames the tunnel's docstring describes. Threads, blocking sockets and os.read/os.write on
fds 0/1, so it works whatever kind of fd the provider gives it (pipe, fifo, socket).

It holds the host's DATA as the host holds its own: each connection is granted FLOOR bytes, more only
from BUDGET (over every connection; its last quarter only for the server's own connections, as OPEN
says) up to WINDOW, as its bytes are written out to its socket; so a socket in the session that does
not read holds at most what its connection was granted.
"""

import contextlib
import os
import socket
import struct
import sys
import threading
import time
from collections import deque

HEADER = struct.Struct(">IBI")
HELLO, OPEN, DATA, CREDIT, EOF, RESET = range(1, 7)
PROTOCOL_VERSION = 2
#: the most credit one connection holds (argv[1])
window = 0
#: the largest DATA payload one frame carries (argv[2])
max_frame = 0
#: every connection's credit whatever the budget, each way (argv[3])
floor = 0
#: the most bytes of the host's DATA held or allowed in, over every connection (argv[4])
budget = 0
#: chunks read from the host so far (the trim thread's clock)
moved = 0
#: the sum over connections of max(credit granted and unused + bytes queued, floor), under budget_lock
committed = 0
budget_lock = threading.Lock()
out_lock = threading.Lock()
conns = {}  # type: dict[int, Conn]  # a type comment: the session's python3 may predate dict[...]


def send(cid, kind, data=b""):
    """One frame to the host; its payload is not copied (a thread waiting for the lock holds only its own)."""
    head = HEADER.pack(cid, kind, len(data))
    with out_lock:
        if data:
            done = os.writev(1, [head, data])
            if done >= len(head) + len(data):
                return
            parts = [memoryview(head)[done:], memoryview(data)[max(done - len(head), 0) :]]
        else:
            parts = [memoryview(head)]
        for buf in parts:
            while buf:
                buf = buf[os.write(1, buf) :]


class Conn:
    """One connection: a writer thread (the host's DATA to the socket) and a reader thread (back)."""

    def __init__(self, cid, port, wait, own):
        self.cid, self.port, self.wait = cid, port, wait
        # past its floor, a connection of another process than the server's gets credit from 3/4 of the budget
        self.limit = budget if own else budget - budget // 4
        self.sock = None
        self.cv = threading.Condition()
        self.q = deque()
        self.credit = floor  # bytes the host lets us send
        self.allowed = floor  # bytes the host may still send us (under budget_lock, as queued)
        self.queued = 0  # the host's bytes received, not yet written to the socket
        self.released = False
        self.dead = False
        with budget_lock:
            charge(0, floor)
        self.sent_eof = self.got_eof = False
        threading.Thread(target=self.writer, daemon=True).start()

    def release(self):
        with budget_lock:
            if not self.released:
                self.released = True
                charge(max(self.allowed + self.queued, floor), 0)

    def wrote(self, n):
        """n queued bytes went out: grant the host more, from the floor and the budget."""
        with budget_lock:
            if self.released:
                return
            held = self.allowed + self.queued
            self.queued -= n
            charge(max(held, floor), max(held - n, floor))
            held -= n
            grant = min(window - held, max(floor, held) + max(self.limit - committed, 0) - held)
            if grant <= 0 or (grant < window // 4 and held > floor // 2):
                return
            self.allowed += grant
            charge(max(held, floor), max(held + grant, floor))
        send(self.cid, CREDIT, struct.pack(">I", grant))

    def reset(self, why, tell=True):
        with self.cv:
            if self.dead:
                return
            self.dead = True
            self.cv.notify_all()
        self.release()
        conns.pop(self.cid, None)
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        if tell:
            send(self.cid, RESET, why.encode("utf-8", "replace")[:1000])

    def done_one_way(self):
        with self.cv:
            finished = self.sent_eof and self.got_eof and not self.dead
            if finished:
                self.dead = True
        if finished:
            self.release()
            conns.pop(self.cid, None)
            self.sock.close()

    def writer(self):
        until = time.monotonic() + self.wait
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", self.port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                break
            except OSError as e:
                if time.monotonic() >= until or self.dead:
                    self.reset(f"connect to port {self.port} failed: {e}")
                    return
                time.sleep(0.02)
        with self.cv:
            if self.dead:
                sock.close()
                return
            self.sock = sock
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            with self.cv:
                while not self.q and not self.dead:
                    self.cv.wait()
                if self.dead:
                    return
                item = self.q.popleft()
            if item is None:
                try:
                    self.sock.shutdown(socket.SHUT_WR)
                except OSError as e:
                    self.reset(f"half-close failed: {e}")
                    return
                with self.cv:
                    self.got_eof = True
                self.done_one_way()
                return
            try:
                self.sock.sendall(item)
            except OSError as e:
                self.reset(f"write failed: {e}")
                return
            self.wrote(len(item))
            item = None  # not held while the queue is awaited

    def reader(self):
        while True:
            with self.cv:
                while self.credit <= 0 and not self.dead:
                    self.cv.wait()
                if self.dead:
                    return
                n = min(self.credit, max_frame)
            try:
                # wait for bytes before the read: a blocked recv(n) would hold an n-byte buffer meanwhile
                self.sock.recv(1, socket.MSG_PEEK)
                data = self.sock.recv(n)
            except OSError as e:
                self.reset(f"read failed: {e}")
                return
            if not data:
                with self.cv:
                    if self.dead:
                        return
                    self.sent_eof = True
                send(self.cid, EOF)
                self.done_one_way()
                return
            with self.cv:
                if self.dead:
                    return
                self.credit -= len(data)
            send(self.cid, DATA, data)
            data = None  # not held while the credit is awaited


def charge(before, after):
    """A connection's share of the budget went from ``before`` to ``after`` (under budget_lock)."""
    global committed
    committed += after - before


def trim(malloc_trim):
    done = 0
    while True:
        time.sleep(1.0)
        if moved != done:
            done = moved
            malloc_trim(0)


def main():
    global window, max_frame, floor, budget, moved
    window, max_frame = int(sys.argv[1]), int(sys.argv[2])
    floor, budget = int(sys.argv[3]), int(sys.argv[4])
    threading.stack_size(256 << 10)  # two threads a connection: shallow ones
    try:  # glibc: one arena for every thread, its free pages given back each second something moved, so
        # the relay's size is about what it holds (its budget), not the most it ever held, fragmented
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-8, 1)  # M_ARENA_MAX
        threading.Thread(target=trim, args=(libc.malloc_trim,), daemon=True).start()
    except (ImportError, OSError, AttributeError):
        pass
    sys.setswitchinterval(
        0.0005
    )  # a thread woken by its socket gets the GIL sooner (latency of small messages)
    try:  # bigger pipes, fewer switches between this relay and the provider's side (when they are pipes)
        import fcntl

        for fd in (0, 1):
            fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass
    send(0, HELLO, struct.pack(">I", PROTOCOL_VERSION))
    buf = bytearray()
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            os._exit(0)
        buf += chunk
        moved += 1
        at = 0
        while len(buf) - at >= HEADER.size:
            cid, kind, n = HEADER.unpack_from(buf, at)
            if len(buf) - at - HEADER.size < n:
                break
            with memoryview(buf) as view:  # one copy, not two (a slice of a bytearray is one)
                payload = bytes(view[at + HEADER.size : at + HEADER.size + n])
            at += HEADER.size + n
            c = conns.get(cid)
            if kind == OPEN:
                port, wait, own = struct.unpack(">HIB", payload)
                conns[cid] = Conn(cid, port, wait / 1000.0, own)
            elif c is None:
                continue
            elif kind in (DATA, EOF):
                if kind == DATA:
                    with budget_lock:
                        c.allowed -= n
                        c.queued += n
                with c.cv:
                    c.q.append(payload if kind == DATA else None)
                    c.cv.notify_all()
            elif kind == CREDIT:
                with c.cv:
                    c.credit += struct.unpack(">I", payload)[0]
                    c.cv.notify_all()
            elif kind == RESET:
                c.reset("", tell=False)
        del buf[:at]


if __name__ == "__main__":
    main()
