"""One launcher of a live ``jupyter server`` subprocess (the magics, notebooks, remote conformance, killed and
restarted servers all use it), and kernels that server starts, driven as JupyterLab drives them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import AsyncKernelManager, BlockingKernelClient

from tests.support import REPO, free_port

__all__ = [
    "ANSI",
    "LOCAL_ARGS",
    "REPO",
    "Kernel",
    "LiveServer",
    "Run",
    "ServerKernelManager",
    "docker_kernel",
    "free_port",
    "local_server",
    "magics_kernel",
    "proc_gone",
    "processes_marked",
    "run_in_background",
    "sandbox_server",
    "wait_for",
    "wait_for_connection_file",
]

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOCAL_ARGS = ("--SandboxApp.provider=local", "--SandboxPolicy.isolation=none")


def wait_for_connection_file(runtime: Path, kernel_id: str, wait: float = 30) -> Path:
    """The kernel's connection file in a server's runtime folder, once the server has written it."""
    path = runtime / f"kernel-{kernel_id}.json"
    deadline = time.monotonic() + wait
    while not path.exists():
        assert time.monotonic() < deadline, f"no connection file for kernel {kernel_id}"
        time.sleep(0.05)
    return path


def _default_sigint() -> None:
    # a suite run from a background job hands its ignored SIGINT down, and a server that ignores
    # SIGINT never stops on it: the server starts with SIGINT at its default, as a process manager leaves it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class LiveServer:
    """``jupyter server`` in a subprocess on localhost, with a token and its own runtime/config dirs.

    ``root`` is its root_dir (``tmp/root`` unless given); ``keep_sandbox_env`` keeps this process's
    TAI_SANDBOX_*/TAI_MCP_* variables (the run's deployment scope among them) instead of dropping them;
    ``log_name`` names its log in ``tmp``. No terminal (stdin is /dev/null), as under JupyterHub.
    """

    def __init__(
        self,
        tmp: Path,
        *,
        python: str = sys.executable,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        root: Path | None = None,
        keep_sandbox_env: bool = False,
        log_name: str = "server.log",
        token: str | None = None,
    ) -> None:
        self.tmp = tmp
        self.python = python
        self.port = free_port()
        self.token = token or secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.root = root or tmp / "root"
        self.runtime = tmp / "runtime"
        for folder in (self.root, self.runtime, tmp / "config"):
            folder.mkdir(parents=True, exist_ok=True)
        self.log_path = tmp / log_name.format(port=self.port)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if keep_sandbox_env or not k.startswith(("TAI_SANDBOX_", "TAI_MCP_"))
        }
        self.env.update(JUPYTER_RUNTIME_DIR=str(self.runtime), JUPYTER_CONFIG_DIR=str(tmp / "config"))
        self.env.setdefault("TAI_SANDBOX_AUDIT_PATH", str(tmp / "audit.jsonl"))  # not the machine user's
        self.env.update(env or {})
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self, wait: float = 90) -> LiveServer:
        command = [
            self.python,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            f"--port={self.port}",
            "--ip=127.0.0.1",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            *self.args,
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            preexec_fn=_default_sigint,
        )
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.close_log()
                raise AssertionError(f"jupyter server exited {self.process.returncode}:\n{self.log()}")
            try:
                self.request("GET", "api/status")
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"jupyter server did not answer within {wait} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then SIGKILL if it outlives 20 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.close_log()

    def kill9(self) -> None:
        """SIGKILL: the server gets no chance to clean up."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.close_log()

    def request(self, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
        """A JSON request to ``path`` (under the server's base URL); raises on 4xx/5xx."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=data,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None, timeout: float = 30):
        """A request to /api/sandbox/<path>: (status, parsed JSON or bytes), never raising on 4xx/5xx."""
        headers = {"Authorization": f"token {self.token}"}
        data = raw
        if raw is None and body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            f"{self.url}api/sandbox/{path}", data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload, status, kind = response.read(), response.status, response.headers.get_content_type()
        except urllib.error.HTTPError as e:
            payload, status, kind = e.read(), e.code, e.headers.get_content_type()
        # by the answer's type, never its first byte: a random payload starts with "{" once in 256 runs
        if kind == "application/json":
            return status, json.loads(payload) if payload else None
        return status, payload

    def session_ids(self) -> set[str]:
        return {s["id"] for s in self.request("GET", "api/sandbox/sessions")["sessions"]}

    def start_kernel(self) -> Kernel:
        kernel_id = self.request("POST", "api/kernels", {"name": "python3"})["id"]
        return Kernel(self, kernel_id)

    def connection_file(self, kernel_id: str, wait: float = 30) -> Path:
        return wait_for_connection_file(self.runtime, kernel_id, wait)


def sandbox_server(home: Path, provider: str, *extra: str, wait: float = 60) -> LiveServer:
    """A started server with the extension on ``provider`` over a state folder ``home`` that outlives it
    (restart one on the same ``home``): the run's deployment scope, a fast reaper, its log in
    ``home/server-<port>.log``."""
    return LiveServer(
        home,
        root=home,
        keep_sandbox_env=True,
        log_name="server-{port}.log",
        env={"JUPYTER_DATA_DIR": str(home / "data")},
        args=(
            "--ServerApp.jpserver_extensions={'jupyter_tai_sandbox': True}",
            f"--SandboxApp.provider={provider}",
            "--SandboxPolicy.isolation=none",
            f"--LocalSandbox.root={home / 'sandboxes'}",
            "--SandboxApp.reap_interval_seconds=0.5",
            *extra,
        ),
    ).start(wait)


@dataclass
class Run:
    """What one execute request produced, with arrival times (seconds after the request)."""

    streams: list[tuple[float, str, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    displays: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)
    finished: float = 0.0

    def text(self, name: str) -> str:
        return "".join(t for _, n, t in self.streams if n == name)

    @property
    def stdout(self) -> str:
        return self.text("stdout")

    @property
    def stderr(self) -> str:
        return self.text("stderr")

    def error_line(self) -> str:
        """The one-line error the cell showed (its traceback must be a single line)."""
        assert len(self.errors) == 1, self.errors
        traceback = self.errors[0]["traceback"]
        assert len(traceback) == 1 and "\n" not in traceback[0].strip(), traceback
        return ANSI.sub("", traceback[0])


class Kernel:
    """A kernel the live server started, driven through its connection file."""

    def __init__(self, server: LiveServer, kernel_id: str) -> None:
        self.server = server
        self.id = kernel_id
        self.client = BlockingKernelClient()
        self.client.load_connection_file(str(server.connection_file(kernel_id)))
        # a heartbeat late by a second on a loaded machine is not a dead kernel
        self.client.hb_channel.time_to_dead = 10.0
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60, interrupt_when: str | None = None) -> Run:
        """Execute ``code``; with ``interrupt_when``, interrupt the kernel (as the stop button does)
        once that text has been printed."""
        run = Run()
        start = time.monotonic()
        msg_id = self.client.execute(code, allow_stdin=False)
        interrupted = False
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            now = time.monotonic() - start
            if kind == "stream":
                run.streams.append((now, content["name"], content["text"]))
                if interrupt_when and not interrupted and interrupt_when in run.stdout:
                    interrupted = True
                    run.interrupted_at = now  # type: ignore[attr-defined]
                    self.interrupt()
            elif kind == "error":
                run.errors.append(content)
            elif kind in ("display_data", "execute_result"):
                run.displays.append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                run.finished = now
                break
        while True:  # the reply to this request (a reply to an earlier one may still be queued)
            reply = self.client.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                run.reply = reply["content"]
                break
        return run

    def ok(self, code: str, **kwargs: Any) -> Run:
        run = self.run(code, **kwargs)
        assert not run.errors, (code, run.errors, run.stderr)
        return run

    def interrupt(self) -> None:
        self.server.request("POST", f"api/kernels/{self.id}/interrupt")

    def shutdown(self) -> None:
        self.client.stop_channels()
        with contextlib.suppress(urllib.error.HTTPError):
            self.server.request("DELETE", f"api/kernels/{self.id}")


class ServerKernelManager(AsyncKernelManager):
    """nbclient's kernel manager for a kernel the live server started (interrupts go through REST)."""

    has_kernel = True  # type: ignore[assignment]

    def __init__(self, server: LiveServer, kernel_id: str, **kwargs: Any) -> None:
        super().__init__(kernel_name="python3", **kwargs)
        self.server = server
        self.kernel_id = kernel_id
        self.load_connection_file(str(server.connection_file(kernel_id)))

    async def is_alive(self) -> bool:  # type: ignore[override]
        return True

    # what the kernel client itself calls while it waits for a slow kernel to answer
    _async_is_alive = is_alive

    async def interrupt_kernel(self) -> None:  # type: ignore[override]
        self.server.request("POST", f"api/kernels/{self.kernel_id}/interrupt")

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:  # type: ignore[override]
        self.server.request("DELETE", f"api/kernels/{self.kernel_id}")


def proc_gone(pid: int) -> bool:
    """True when ``pid`` has exited (gone, or a zombie nobody reaped: see DESIGN's traps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


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


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


# ------------------------------------------------------- fixture bodies (the magics modules' conftest)


def local_server(tmp_path_factory, name: str) -> Iterator[LiveServer]:
    """A started server on the local provider in a fresh folder ``name``, stopped after (a fixture's body)."""
    tmp = tmp_path_factory.mktemp(name)
    live = LiveServer(tmp, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp / 'sandboxes'}")).start()
    yield live
    live.stop()


def magics_kernel(server: LiveServer, setup: str = "") -> Iterator[Any]:
    """A kernel of ``server`` with the extension loaded and ``setup`` run, shut down after."""
    k = server.start_kernel()
    k.ok("%load_ext jupyter_tai_sandbox" + (f"\n{setup}" if setup else ""))
    yield k
    k.shutdown()


def run_in_background(server: LiveServer, session_id: str, argv: list[str]) -> threading.Thread:
    """A one-shot exec of ``argv`` in ``server``'s session, in a thread of its own: a request that a SIGKILL of
    the server cuts off."""

    def call() -> None:
        with contextlib.suppress(OSError):
            server.call(
                "POST", f"sessions/{session_id}/exec", {"argv": argv, "timeout_seconds": 600}, timeout=120
            )

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def docker_kernel(tmp_path) -> Iterator[Any]:
    """A kernel of a live server on the docker provider (the minimal image), with the magics loaded."""
    from tests.support.docker import docker_client, server_args

    docker_client()  # skips without an engine (fails in CI)
    live = LiveServer(tmp_path, args=server_args()).start()
    try:
        k = live.start_kernel()
        try:
            k.ok("%load_ext jupyter_tai_sandbox")
            yield k
        finally:
            k.shutdown()
    finally:
        live.stop()
