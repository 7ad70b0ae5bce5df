"""The JupyterHub service (``jupyter tai-sandbox serve``) is a jupyter_server: its /metrics on the service's
own port serves the sandbox series, guarded by ServerApp.authenticate_prometheus like the server's own.
Run here without a hub (no request carries a hub token, so the hub is never asked)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.support import free_port

pytestmark = [pytest.mark.slow(10)]


@contextlib.contextmanager
def service(tmp_path, *options: str):
    pytest.importorskip("jupyterhub")
    port = free_port()
    env = {
        **os.environ,
        "JUPYTERHUB_API_TOKEN": "not-a-real-token",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",  # never reached: nobody presents a token
        "JUPYTERHUB_SERVICE_NAME": "tai-sandbox",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_SERVICE_PREFIX": "/services/tai-sandbox/",
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    command = shutil.which("jupyter-tai-sandbox") or sys.exit("jupyter-tai-sandbox is not installed")
    argv = [
        command,
        "serve",
        "--SandboxApp.provider=local",
        "--SandboxPolicy.isolation=none",
        f"--LocalSandbox.root={tmp_path / 'sandboxes'}",
        f"--SandboxApp.presets_path={tmp_path / 'presets.json'}",
        *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),
        *options,
    ]
    log = tmp_path / "service.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    base = f"http://127.0.0.1:{port}/services/tai-sandbox/"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                urllib.request.urlopen(base + "api/status", timeout=5)
                break
            except urllib.error.HTTPError:
                break  # it answers (403 without a hub token)
            except OSError:
                assert time.monotonic() < deadline, "the service did not start"
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_the_hub_service_serves_the_series_on_its_own_port(tmp_path):
    with service(tmp_path, "--ServerApp.authenticate_prometheus=False") as base:
        status, text = get(base + "metrics")
        assert status == 200
        assert "# HELP jupyter_tai_sandbox_session_creates_total" in text
        assert 'jupyter_tai_sandbox_sessions{provider="local",state="running"} 0.0' in text
        assert get(base + "api/sandbox/sessions")[0] == 403  # the API itself still wants a hub token


def test_the_hub_services_metrics_want_a_hub_token_by_default(tmp_path):
    with service(tmp_path) as base:
        assert get(base + "metrics")[0] == 403
