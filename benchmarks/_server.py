"""A real ``jupyter server`` with the extension, on 127.0.0.1 with a token, for the server benchmarks."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """``with JupyterServer(provider="local") as server:`` -- ``server.url``, ``server.token``, ``server.rss_mib()``."""

    def __init__(
        self,
        provider: str = "local",
        startup_seconds: float = 60.0,
        *,
        isolation: str = "none",
        args: tuple[str, ...] = (),
    ) -> None:
        self.provider = provider
        self.isolation = isolation
        self.args = args
        self.startup_seconds = startup_seconds
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self._process: subprocess.Popen[bytes] | None = None
        self._home = tempfile.mkdtemp(prefix="tai-bench-server-")

    def __enter__(self) -> JupyterServer:
        env = {
            **os.environ,
            "TAI_MCP_SANDBOX": self.provider,
            "TAI_MCP_SANDBOX_ISOLATION": self.isolation,
            "SANDBOX_LOCAL_ROOT": os.path.join(self._home, "sandboxes"),
            "JUPYTER_RUNTIME_DIR": os.path.join(self._home, "runtime"),
            "JUPYTER_CONFIG_DIR": os.path.join(self._home, "config"),
        }
        command = [
            sys.executable, "-m", "jupyter_server",
            "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self._home}",
            "--ServerApp.jpserver_extensions={'jupyter_tai_sandbox': True}",
            "--ServerApp.log_level=WARN",
            # the concurrency row holds 32 sessions of one user at once (the default cap is 20)
            "--SandboxPolicy.max_sessions_per_user=64",
            *self.args,
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append("--allow-root")
        self._log = open(os.path.join(self._home, "server.log"), "wb")
        self._process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            tail = open(self._log.name, "rb").read()[-2000:].decode(errors="replace")
            self.__exit__(None, None, None)
            raise RuntimeError(f"jupyter server did not start:\n{tail}") from None
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_seconds
        request = urllib.request.Request(
            self.url + "api/sandbox/status", headers={"Authorization": f"token {self.token}"}
        )
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError("jupyter server exited")
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"jupyter server did not answer within {self.startup_seconds:g} s")

    def rss_mib(self) -> float:
        """The server process's resident memory."""
        assert self._process is not None
        with open(f"/proc/{self._process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def __exit__(self, *exc: Any) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
        shutil.rmtree(self._home, ignore_errors=True)
