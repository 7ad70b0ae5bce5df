"""A restarted server lists (and runs) the presets authored before: two real `jupyter server` processes."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TOKEN = "tools-restart-test"
WORD_COUNT = {
    "description": "Count the words in a text.",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    "binding": {"argv": ["wc", "-w"], "stdin": {"field": "text"}, "timeout_seconds": 30},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/sandbox/{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Server:
    def __init__(self, tmp_path, store):
        self.port = free_port()
        args = [
            sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", f"--port={self.port}", "--ip=127.0.0.1",
            f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={tmp_path}",
            "--ServerApp.jpserver_extensions={'jupyter_tai_sandbox': True}",
            "--SandboxApp.provider=local", "--SandboxPolicy.isolation=none",
            f"--LocalSandbox.root={tmp_path / 'sandboxes'}", f"--SandboxApp.presets_path={store}",
        ]
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
        self.log = open(tmp_path / f"server-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (tmp_path / f"server-{self.port}.log").read_text()
            try:
                if request(self.port, "GET", "status")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server did not start")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def test_a_restarted_server_lists_the_presets_authored_before(tmp_path):
    store = tmp_path / "data" / "presets.json"
    first = Server(tmp_path, store)
    try:
        status, tool = request(first.port, "PUT", "tools/word_count", WORD_COUNT)
        assert status == 201, tool
    finally:
        first.stop()
    second = Server(tmp_path, store)
    try:
        status, listing = request(second.port, "GET", "tools")
        assert "word_count" in [t["name"] for t in listing["tools"]]
        status, result = request(second.port, "POST", "tools/word_count/run", {"text": "survives a restart"})
        assert (status, result["stdout"].strip()) == (200, "3")
    finally:
        second.stop()
