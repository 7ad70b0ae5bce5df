# JupyterHub with the sandbox service: one process holds the Docker engine, users' servers hold none.
#
#   jupyterhub -f examples/jupyterhub_config.py
#
# tests/hub/test_hub.py runs this file as written, changing only ports, paths and the deployment name
# (and adding its own driver service and carol, a user in the tai-sandbox-admin role).
# The dummy authenticator and SimpleLocalProcessSpawner are for trying it out: swap them for your
# real authenticator and spawner; the sandbox parts (the service, the roles, the server token scopes
# and the users' server options) stay the same.
import os
import sys

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it

#: the hub's public address (the proxy), and where the sandbox service listens (the hub routes to it)
c.JupyterHub.bind_url = "http://127.0.0.1:8000"
SERVICE = "tai-sandbox"
SERVICE_URL = "http://127.0.0.1:10101"
#: where users' servers reach the service: through the proxy, at /services/tai-sandbox/
SANDBOX_URL = f"{c.JupyterHub.bind_url}/services/{SERVICE}/"

# --- try-out authentication and spawning (replace in production) ---------------------------------
c.JupyterHub.authenticator_class = "dummy"  # any password logs in: never outside a test box
c.Authenticator.allowed_users = {"alice", "bob"}
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = "/tmp/tai-hub-home/{username}"
#: a test box run as root; a real spawner runs each server as its user
AS_ROOT = ["--allow-root"] if os.getuid() == 0 else []

# --- the sandbox service: the only process with the engine socket --------------------------------
c.JupyterHub.services = [
    {
        "name": SERVICE,
        "url": SERVICE_URL,
        # `jupyter tai-sandbox serve` with the hub's own Python: binds to SERVICE_URL, takes hub tokens
        "command": [
            *(sys.executable, "-m", "jupyter_tai_sandbox.cli", "serve", "--SandboxApp.provider=docker"),
            # users may ask for the Python image too (%%sandbox python3, sandboxed kernels)
            "--DockerSandbox.allowed_images=jupyter-tai-sandbox/python:latest",
            *AS_ROOT,
        ],
        "environment": {
            # the service's scope on the engine: it sees and reaps only what it made
            "TAI_SANDBOX_DEPLOYMENT": "jupyterhub-tai-sandbox",
            # the hub passes services almost none of its own environment
            **{
                k: os.environ[k]
                for k in ("PATH", "DOCKER_HOST", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
                if k in os.environ
            },
        },
    }
]

# --- who may use it -------------------------------------------------------------------------------
c.JupyterHub.custom_scopes = {
    "custom:tai-sandbox:admin": {
        "description": "Admin of the sandbox service: every user's sandbox sessions, other consumers, code tools.",
    },
}
c.JupyterHub.load_roles = [
    # every user may reach the service (its access scope); their sessions are their own
    {"name": "user", "scopes": ["self", f"access:services!service={SERVICE}"]},
    # the operator names the service's admins (none here)
    {
        "name": "tai-sandbox-admin",
        "scopes": ["custom:tai-sandbox:admin", f"access:services!service={SERVICE}"],
        "users": [],
    },
]
# each user's server token (JUPYTERHUB_API_TOKEN) may call the service as that user; it carries the
# admin scope only for users who hold it (the hub gives a server token the subset its user holds)
c.Spawner.server_token_scopes = [
    "users:activity!user",
    "access:servers!server",
    f"access:services!service={SERVICE}",
    "custom:tai-sandbox:admin",
]

# --- users' servers: the extension on the remote provider, with their own hub token --------------
c.Spawner.args = [*AS_ROOT, "--SandboxApp.provider=remote", f"--RemoteSandbox.url={SANDBOX_URL}"]
c.Spawner.environment = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
