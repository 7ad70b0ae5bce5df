"""The floor of a socket path for the websocket stream row (issue 56.5): a raw localhost TCP relay.

A process of its own, as the Jupyter server is: it listens on 127.0.0.1, and for each connection reads one line
(a JSON argv), runs that command, and copies its stdout to the connection with ``os.read``/``sendall`` in
256 KiB pieces, nothing else (no framing, no event loop, no scrub, no ring). A client that reads the
connection to its end has moved the command's bytes through a pipe and a localhost socket, which is what the
websocket door does with its protocol on top.

``python benchmarks/_tcp_relay.py`` prints the port it listens on, then serves until stdin closes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

PIECE = 256 << 10


def serve_one(conn: socket.socket) -> None:
    with conn:
        line = b""
        while not line.endswith(b"\n"):
            data = conn.recv(4096)
            if not data:
                return
            line += data
        argv = json.loads(line)
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL) as proc:
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            while data := os.read(fd, PIECE):
                conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)


def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()  # until the benchmark closes it


if __name__ == "__main__":
    main()
