"""The tunnel's relay: the program :mod:`~jupyter_tai_sandbox.kernels.tunnel` runs inside a session.

Run as ``python3 -u -c <this file's source> WINDOW MAX_FRAME``: the session needs python3 and
nothing else (this file imports only the standard library, and nothing of the package). It
multiplexes TCP connections to ``127.0.0.1:<port>`` inside the session over its stdin and stdout,
in the frames the tunnel's docstring describes. Threads, blocking sockets and os.read/os.write on
fds 0/1, so it works whatever kind of fd the provider gives it (pipe, fifo, socket).
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
PROTOCOL_VERSION = 1
#: bytes of one connection's data in flight before its sender waits for CREDIT (argv[1])
window = 0
#: the largest DATA payload one frame carries (argv[2])
max_frame = 0
out_lock = threading.Lock()
conns = {}  # type: dict[int, Conn]  # a type comment: the session's python3 may predate dict[...]


def send(cid, kind, data=b""):
    buf = memoryview(HEADER.pack(cid, kind, len(data)) + data)
    with out_lock:
        while buf:
            buf = buf[os.write(1, buf) :]


class Conn:
    """One connection: a writer thread (the host's DATA to the socket) and a reader thread (back)."""

    def __init__(self, cid, port, wait):
        self.cid, self.port, self.wait = cid, port, wait
        self.sock = None
        self.cv = threading.Condition()
        self.q = deque()
        self.credit = window
        self.dead = False
        self.sent_eof = self.got_eof = False
        threading.Thread(target=self.writer, daemon=True).start()

    def reset(self, why, tell=True):
        with self.cv:
            if self.dead:
                return
            self.dead = True
            self.cv.notify_all()
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
        owed = 0
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
            owed += len(item)
            if owed >= window // 4:
                send(self.cid, CREDIT, struct.pack(">I", owed))
                owed = 0

    def reader(self):
        while True:
            with self.cv:
                while self.credit <= 0 and not self.dead:
                    self.cv.wait()
                if self.dead:
                    return
                n = min(self.credit, max_frame)
            try:
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


def main():
    global window, max_frame
    window, max_frame = int(sys.argv[1]), int(sys.argv[2])
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
        at = 0
        while len(buf) - at >= HEADER.size:
            cid, kind, n = HEADER.unpack_from(buf, at)
            if len(buf) - at - HEADER.size < n:
                break
            payload = bytes(buf[at + HEADER.size : at + HEADER.size + n])
            at += HEADER.size + n
            c = conns.get(cid)
            if kind == OPEN:
                port, wait = struct.unpack(">HI", payload)
                conns[cid] = Conn(cid, port, wait / 1000.0)
            elif c is None:
                continue
            elif kind in (DATA, EOF):
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
