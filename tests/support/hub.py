"""A real JupyterHub with the sandbox service, for the hub tests (tests/hub/): the hub, its users' servers,
their sandboxed kernels, and what a deployment left on the engine.

The hub runs examples/jupyterhub_config.py (README's config) with only ports, paths and the deployment
name changed, and a test-only driver service holding an admin token. Everything runs on 127.0.0.1 free
ports with its state in a tmp dir; a hub may be started again in the same dir (its database, tokens and
users' homes are kept, its processes are not)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO, free_port
from tests.support.docker import in_ci
from tests.support.live_server import Kernel, wait_for_connection_file
from tests.support.processes import running

EXAMPLE = REPO / "examples" / "jupyterhub_config.py"
SERVICE = "tai-sandbox"
DEADLINE = 60.0  # seconds for the hub, the service or a user's server to come up


def missing(what: str) -> None:
    message = f"the JupyterHub test needs {what}"
    if in_ci():
        pytest.fail(message)
    pytest.skip(message)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def processes_mentioning(needle: bytes) -> list[int]:
    """Every process whose environment holds ``needle``: what a hub run started, even once orphaned."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def require_hub() -> None:
    """Skip (fail under CI=true) without jupyterhub, configurable-http-proxy or a docker engine."""
    import shutil

    from tests.support.docker import docker_client

    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        missing("jupyterhub (pip install -e '.[test]')")
    if shutil.which("configurable-http-proxy") is None:
        missing("configurable-http-proxy on PATH (bash .ci/hub-up)")
    docker_client().close()


def require_python_image() -> None:
    """Skip (fail under CI=true) without the Python image sandboxed kernels run."""
    from jupyter_tai_sandbox.images import PYTHON_IMAGE
    from tests.support.docker import docker_client

    client = docker_client()
    try:
        client.images.get(PYTHON_IMAGE)
    except Exception:
        missing(f"the Python image {PYTHON_IMAGE} (jupyter tai-sandbox build-image --python)")
    finally:
        client.close()


def remove_hub(hub: Hub) -> None:
    """Whatever a hub run left, failures included: its processes, then its deployment's things (ours only)."""
    from tests.support.docker import docker_client, remove_deployment

    hub.stop()
    client = docker_client()
    try:
        remove_deployment(client, hub.deployment)
    finally:
        client.close()


class Hub:
    """A running hub: its public URL, the driver's admin token, requests as anyone."""

    def __init__(self, tmp: Path) -> None:
        import requests

        self.requests = requests
        self.tmp = tmp
        self.port, self.hub_port, self.api_port, self.service_port = (free_port() for _ in range(4))
        self.url = f"http://127.0.0.1:{self.port}"
        self.service_url = f"{self.url}/services/{SERVICE}/"
        self.driver_token = secrets.token_hex(24)
        self.deployment = f"test-hub-{secrets.token_hex(6)}"
        self.tokens: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self.known_pids: set[int] = set()
        #: what was still alive of the run's processes when the last stop() returned (then killed)
        self.outlived: list[int] = []

    # ------------------------------------------------------------------ start and stop

    def config(self) -> Path:
        """examples/jupyterhub_config.py, then only ports, paths, the deployment and the test's driver."""
        homes = self.tmp / "homes"
        runtime = self.tmp / "service-runtime"
        text = f"""
c = get_config()  # noqa: F821
load_subconfig({str(EXAMPLE)!r})  # noqa: F821
public = {self.url!r}
c.JupyterHub.bind_url = public
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.api_port}"
c.ConfigurableHTTPProxy.pid_file = {str(self.tmp / "proxy.pid")!r}
c.JupyterHub.db_url = "sqlite:///{self.tmp / "hub.sqlite"}"
c.JupyterHub.cookie_secret_file = {str(self.tmp / "cookie_secret")!r}
c.JupyterHub.pid_file = {str(self.tmp / "hub.pid")!r}
c.SimpleLocalProcessSpawner.home_dir_template = {str(homes) + "/{username}"!r}
service = c.JupyterHub.services[0]
service["url"] = "http://127.0.0.1:{self.service_port}"
service["environment"]["TAI_SANDBOX_DEPLOYMENT"] = {self.deployment!r}
service["environment"]["JUPYTER_RUNTIME_DIR"] = {str(runtime)!r}
service["environment"]["JUPYTER_CONFIG_DIR"] = {str(self.tmp / "service-config")!r}
service["environment"]["JUPYTER_DATA_DIR"] = {str(self.tmp / "service-data")!r}
c.Spawner.args = [a.replace("http://127.0.0.1:8000", public) for a in c.Spawner.args]
# the browser test reaches the lab as window.jupyterapp (the Sandbox drive's own contents calls)
c.Spawner.args.append("--LabApp.expose_app_in_browser=True")
# the test's driver: starts and stops servers, mints alice's and bob's tokens
c.JupyterHub.services.append({{"name": "test-driver", "api_token": {self.driver_token!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "test-driver", "scopes": ["admin:users", "admin:servers", "tokens"], "services": ["test-driver"]}}
)
# carol: an operator the config's own admin role names (no server: she calls the service directly)
c.Authenticator.allowed_users = {{*c.Authenticator.allowed_users, "carol"}}
next(r for r in c.JupyterHub.load_roles if r["name"] == "tai-sandbox-admin")["users"] = ["carol"]
"""
        path = self.tmp / "jupyterhub_config.py"
        path.write_text(text)
        return path

    def start(self) -> None:
        # a hub started again in the same dir appends to the same log
        self.log = open(self.tmp / "hub.log", "ab")  # noqa: SIM115 - closed in stop()
        # the marker is inherited by the proxy; the service's and servers' environments name self.tmp
        env = {**os.environ, "TAI_TEST_HUB_RUN": str(self.tmp)}
        env.pop("TAI_MCP_SANDBOX", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config()), "--no-ssl"],
            cwd=self.tmp,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_for(lambda: self.api("GET", "")[0] == 200, "the hub's API")
        self.wait_for(
            lambda: self.service("GET", "status", token=self.driver_token)[0] in (403, 401),
            "the sandbox service",
        )

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> int | None:
        """Stop the hub by ``sig`` (it stops the service, the servers and the proxy), then kill what is
        left of the run's processes. The hub's exit code, None when it had to be killed."""
        if self.proc is None:
            return None
        self.known_pids.update(descendants(self.proc.pid))
        code: int | None = None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                code = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        else:
            code = self.proc.returncode
        self.outlived = self.live_processes()
        for pid in self.outlived:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()
        self.proc = None
        self.known_pids = set()  # gone now: their pids may be anyone's next
        return code

    def live_processes(self) -> list[int]:
        """The run's processes (the hub's, the proxy, the service, users' servers and kernels) still alive."""
        pids = self.known_pids | set(processes_mentioning(str(self.tmp).encode()))
        return sorted(pid for pid in pids if running(pid))

    def service_pid(self) -> int:
        """The pid of the sandbox service the hub runs now (a child of the hub's)."""
        assert self.proc is not None
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                if b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") and running(pid):
                    return pid
        raise AssertionError(f"no sandbox service under the hub:\n{self.log_tail()}")

    def remember_processes(self) -> None:
        if self.proc is not None:
            self.known_pids.update(descendants(self.proc.pid))

    def wait_for(self, check, what: str, timeout: float = DEADLINE) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"the hub exited ({self.proc.returncode}) waiting for {what}:\n{self.log_tail()}"
                )
            with contextlib.suppress(self.requests.RequestException):
                if check():
                    self.remember_processes()
                    return
            time.sleep(0.25)
        raise AssertionError(f"{what} not ready in {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def log_text(self) -> str:
        """The hub's log so far (its proxy's, service's and users' servers' included), every run in its dir."""
        if not self.log.closed:
            self.log.flush()
        return (self.tmp / "hub.log").read_text(errors="replace")

    # ------------------------------------------------------------------ requests

    def _call(self, method: str, url: str, token: str | None, body=None, raw: bytes | None = None, **kw):
        headers = {"Authorization": f"token {token}"} if token else {}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        r = self.requests.request(
            method, url, headers=headers, data=data, timeout=30, allow_redirects=False, **kw
        )
        try:
            answer = r.json()
        except ValueError:
            answer = r.content
        return r.status_code, answer

    def api(self, method: str, path: str, body=None):
        """The hub's REST API, as the test driver."""
        return self._call(method, f"{self.url}/hub/api/{path}".rstrip("/"), self.driver_token, body)

    def sandbox(self, user: str, method: str, path: str, as_user: str | None = None, **kw):
        """/user/USER/api/sandbox/PATH with AS_USER's token (USER's by default)."""
        token = self.tokens[as_user or user]
        return self._call(method, f"{self.url}/user/{user}/api/sandbox/{path}", token, **kw)

    def service(self, method: str, path: str, token: str | None = None, **kw):
        """The sandbox service itself, at /services/tai-sandbox/api/sandbox/PATH."""
        return self._call(method, f"{self.service_url}api/sandbox/{path}", token, **kw)

    # ------------------------------------------------------------------ users

    def token_for(self, user: str, *extra_scopes: str, key: str | None = None) -> str:
        """A hub API token of ``user``'s: reaches their server and the sandbox service."""
        scopes = [f"access:servers!user={user}", f"access:services!service={SERVICE}", *extra_scopes]
        status, body = self.api("POST", f"users/{user}/tokens", {"note": "test_hub", "scopes": scopes})
        assert status == 201, body
        self.tokens[key or user] = body["token"]
        return body["token"]

    def start_server(self, user: str) -> None:
        status, body = self.api("POST", f"users/{user}/server")
        assert status in (201, 202), body
        self.wait_for(lambda: self.server_state(user) == "ready", f"{user}'s server")
        self.wait_for(lambda: self.sandbox(user, "GET", "status")[0] == 200, f"{user}'s sandbox API")

    def stop_server(self, user: str) -> None:
        status, body = self.api("DELETE", f"users/{user}/server")
        assert status in (202, 204), body
        self.wait_for(lambda: self.server_state(user) == "stopped", f"{user}'s server to stop")

    def server_state(self, user: str) -> str:
        _, model = self.api("GET", f"users/{user}")
        server = model.get("servers", {}).get("")
        if not server:
            return "stopped"
        return "ready" if server.get("ready") else "pending"


def engine_sessions(deployment: str) -> list:
    """The sessions on the engine in the test's deployment (what the service sees)."""
    from jupyter_tai_sandbox.providers.docker import DockerSandbox

    async def listing():
        sandbox = DockerSandbox(deployment=deployment)
        try:
            return await sandbox.list()
        finally:
            await sandbox.close()

    return asyncio.run(listing())


def deployment_leftovers(deployment: str) -> list[str]:
    """What the deployment has on the engine: containers, volumes other than persistent workspaces (which
    outlive their sessions by design), networks, forks' images, and its host firewall rules. Empty once its
    service has stopped."""
    from jupyter_tai_sandbox.providers.docker import LABEL
    from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_WORKSPACE, Deployment
    from tests.support.docker import docker_client, firewall_rules

    client = docker_client()
    try:
        ours = {"label": f"{LABEL}.deployment={deployment}"}
        found = [
            f"container {c['Names'][0]} ({c['State']})" for c in client.api.containers(all=True, filters=ours)
        ]
        found += [
            f"volume {v.name}"
            for v in client.volumes.list(filters=ours)
            if LABEL_WORKSPACE not in (v.attrs.get("Labels") or {})
        ]
        found += [f"network {n.name}" for n in client.networks.list(filters=ours)]
        found += [f"image {', '.join(i.tags) or i.id}" for i in client.images.list(filters=ours)]
        comment = f"tai-sbx:{Deployment(deployment).tag}"
        return found + sorted(rule for rule in firewall_rules() if comment in rule)
    finally:
        client.close()


def deployment_workspaces(deployment: str) -> set[str]:
    """The keys of the deployment's persistent workspaces on the engine."""
    from jupyter_tai_sandbox.providers.docker import LABEL
    from jupyter_tai_sandbox.providers.docker_engine.names import LABEL_WORKSPACE
    from tests.support.docker import docker_client

    client = docker_client()
    try:
        volumes = client.volumes.list(
            filters={"label": [f"{LABEL}.deployment={deployment}", LABEL_WORKSPACE]}
        )
        return {(v.attrs.get("Labels") or {})[LABEL_WORKSPACE] for v in volumes}
    finally:
        client.close()


class UserServer:
    """A user's server as test_magics.Kernel drives it: REST through the proxy, the kernel's connection file."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.hub, self.user = hub, user
        self.runtime = hub.tmp / "homes" / user / ".local" / "share" / "jupyter" / "runtime"

    def request(self, method: str, path: str, body=None, timeout: float = 30):
        status, answer = self.hub._call(
            method, f"{self.hub.url}/user/{self.user}/{path}", self.hub.tokens[self.user], body
        )
        assert 200 <= status < 300, (method, path, status, answer)
        return answer or None

    def connection_file(self, kernel_id: str, wait: float = 30) -> Path:
        return wait_for_connection_file(self.runtime, kernel_id, wait)

    def start_kernel(self, name: str = "python3"):
        return Kernel(self, self.request("POST", "api/kernels", {"name": name})["id"])


def new_sessions(hub: Hub, user: str, before: set[str]) -> list[dict]:
    return [s for s in hub.sandbox(user, "GET", "sessions")[1]["sessions"] if s["id"] not in before]


def install_sandboxed_kernelspec(hub: Hub, user: str) -> str:
    """A sandboxed kernelspec in the user's own Jupyter data dir (their server finds it on the next request)."""
    from jupyter_tai_sandbox.images import PYTHON_IMAGE

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "TAI_"))}
    env["HOME"] = str(hub.tmp / "homes" / user)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_tai_sandbox.cli",
            "kernelspec",
            "install",
            "--user",
            "--name",
            "tai-hub-kernel",
            "--image",
            PYTHON_IMAGE,
            "--ttl",
            "600",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    return "tai-hub-kernel"
