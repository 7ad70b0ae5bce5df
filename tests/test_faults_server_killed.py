"""A server killed with SIGKILL, then started again: orphans are reaped, persistent workspaces keep
their data byte for byte, and no process or container is left behind.

Each test runs a real ``jupyter server`` subprocess (the extension, one provider), kills it with
``kill -9`` while a session holds a running command, and starts a second server on the same state.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)
PAYLOAD = secrets.token_bytes(1 << 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``jupyter server`` subprocess over a state folder that outlives it."""

    def __init__(self, home: Path, provider: str, extra: list[str]) -> None:
        self.home, self.provider, self.extra = home, provider, extra
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/sandbox/"
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
        }
        command = [
            sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={home}",
            "--ServerApp.jpserver_extensions={'jupyter_tai_sandbox': True}",
            f"--SandboxApp.provider={provider}", "--SandboxPolicy.isolation=none",
            f"--LocalSandbox.root={home / 'sandboxes'}", "--SandboxApp.reap_interval=0.5",
            *extra,
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append("--allow-root")
        self.log = open(home / f"server-{self.port}.log", "wb")  # noqa: SIM115 - closed in stop()
        # no terminal, as under JupyterHub or a process manager
        # and with SIGINT as a process manager leaves it: a suite run from a background job would hand its
        # ignored SIGINT down, and a server that ignores SIGINT never stops on it
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=_default_sigint,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.call("GET", "status")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError((home / f"server-{self.port}.log").read_text()[-3000:]) from None
                time.sleep(0.2)

    def call(self, method: str, path: str, body=None, raw: bytes | None = None, timeout: float = 30):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Authorization": f"token {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload, status, kind = response.read(), response.status, response.headers.get_content_type()
        except urllib.error.HTTPError as e:
            payload, status, kind = e.read(), e.code, e.headers.get_content_type()
        # by the answer's type, never its first byte: a random payload starts with "{" once in 256 runs
        if kind == "application/json":
            return status, json.loads(payload)
        return status, payload

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def processes_marked(session_id: str) -> list[int]:
    marker = f"TAI_SANDBOX_SESSION={session_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                environ = Path(f"/proc/{entry.name}/environ").read_bytes()
                state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in environ.split(b"\0") and state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def run_in_background(server: Server, session_id: str, argv: list[str]) -> threading.Thread:
    """A one-shot exec whose request the SIGKILL will cut off."""

    def call() -> None:
        with contextlib.suppress(OSError):
            server.call("POST", f"sessions/{session_id}/exec", {"argv": argv, "timeout_seconds": 600}, timeout=120)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_local_sessions_of_a_killed_server(tmp_path):
    first = Server(tmp_path, "local", [])
    try:
        _, durable = first.call("POST", "sessions", {"durability": "persistent", "workspace_key": "keep-me",
                                                   "ttl_seconds": 3})
        assert first.call("PUT", f"sessions/{durable['id']}/files/data.bin", raw=PAYLOAD)[0] == 201
        _, ephemeral = first.call("POST", "sessions", {"ttl_seconds": 3})
        run_in_background(first, ephemeral["id"], ["sh", "-c", "sleep 300 & sleep 300"])
        wait_for(lambda: len(processes_marked(ephemeral["id"])) >= 2, 20, "the commands never started")
    finally:
        first.kill9()
    assert processes_marked(ephemeral["id"]), "the commands should outlive a SIGKILLed server"
    time.sleep(3)  # past both sessions' TTL
    second = Server(tmp_path, "local", [])
    try:
        wait_for(lambda: not processes_marked(ephemeral["id"]), 30, "the dead server's commands still run")
        wait_for(lambda: second.call("GET", "sessions")[1]["sessions"] == [], 30, "the orphans were not reaped")
        # the persistent workspace kept its data, byte for byte
        _, again = second.call("POST", "sessions", {"durability": "persistent", "workspace_key": "keep-me"})
        assert second.call("GET", f"sessions/{again['id']}/files/data.bin") == (200, PAYLOAD)
        assert second.call("DELETE", f"sessions/{again['id']}?remove_workspace=1")[0] == 204
    finally:
        second.stop()
    assert not list((tmp_path / "sandboxes" / ".ephemeral").glob("*"))


def test_docker_sessions_of_a_killed_server(tmp_path):
    docker_support = pytest.importorskip("docker_support")
    client = docker_support.docker_client()
    label = f"tai-faults-{secrets.token_hex(4)}"
    extra = [f"--DockerSandbox.image={docker_support.TEST_IMAGE}",
             f"--DockerSandbox.extra_labels={{'{label}': '1'}}"]  # fmt: skip
    first = Server(tmp_path, "docker", extra)
    try:
        _, durable = first.call("POST", "sessions", {"durability": "persistent", "workspace_key": f"keep-{label}",
                                                   "ttl_seconds": 4})
        assert first.call("PUT", f"sessions/{durable['id']}/files/data.bin", raw=PAYLOAD)[0] == 201
        _, ephemeral = first.call("POST", "sessions", {"ttl_seconds": 4})
        run_in_background(first, ephemeral["id"], ["sh", "-c", "sleep 300 & sleep 300"])
        time.sleep(1.5)
    finally:
        first.kill9()
    second = None
    try:
        time.sleep(3)
        second = Server(tmp_path, "docker", extra)
        ours = {"label": [label]}
        wait_for(lambda: not client.containers.list(all=True, filters=ours, sparse=True), 60,
                 "containers left behind")
        _, again = second.call("POST", "sessions", {"durability": "persistent", "workspace_key": f"keep-{label}"})
        assert second.call("GET", f"sessions/{again['id']}/files/data.bin") == (200, PAYLOAD)
        assert second.call("DELETE", f"sessions/{again['id']}?remove_workspace=1")[0] == 204
    finally:
        if second is not None:
            second.stop()
        for container in client.containers.list(all=True, filters={"label": [label]}, sparse=True):
            with contextlib.suppress(Exception):
                container.remove(force=True)
        for volume in client.volumes.list(filters={"label": [label]}):
            with contextlib.suppress(Exception):
                volume.remove(force=True)
