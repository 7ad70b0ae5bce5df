"""Sandboxed kernels started by a Jupyter server (REST /api/kernels), as JupyterLab's launcher does.

The server's own provider and policy apply; the kernel's session shows in /api/sandbox/sessions
with the consumer label ``kernel:<kernel id>``; deleting the kernel destroys it; a refused spec
answers the kernel start with the policy's message.
"""

from __future__ import annotations

import json
import os

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_tai_sandbox.kernels import kernelspecs
from tests.support.server import call, server_config

pytestmark = pytest.mark.timeout(240)
KERNEL = "sbx-server-test"


@pytest.fixture
def floor() -> str:
    """The server's isolation floor (a test parametrizes it to change it)."""
    return "none"


@pytest.fixture
def server_provider() -> str:
    """The server's provider (a test parametrizes it to change it)."""
    return "local"


@pytest.fixture
def jp_server_config(tmp_path, floor, server_provider):
    if server_provider == "docker":
        from tests.support.docker import python_image

        python_image()
        floor = "container"
    return server_config(server_provider, tmp_path / "sandboxes", SandboxPolicy={"isolation": floor})


@pytest.fixture
def sandboxed_kernelspec(jp_environ, jp_data_dir):
    kernelspecs.install(KERNEL, user=True)  # JUPYTER_DATA_DIR is the test's own data dir
    return KERNEL


async def start_kernel(jp_fetch) -> tuple[int, dict]:
    try:
        response = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": KERNEL}))
    except HTTPClientError as e:
        assert e.response is not None
        return e.response.code, json.loads(e.response.body or b"{}")
    return response.code, json.loads(response.body)


async def test_the_server_starts_a_sandboxed_kernel(jp_fetch, jp_serverapp, sandboxed_kernelspec):
    specs = json.loads((await jp_fetch("api", "kernelspecs")).body)["kernelspecs"]
    assert specs[KERNEL]["spec"]["display_name"] == kernelspecs.DEFAULT_DISPLAY_NAME  # the launcher lists it
    code, model = await start_kernel(jp_fetch)
    assert code == 201, model
    kernel_id = model["id"]
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive("import os; print(1 + 1, os.getcwd())", timeout=30)
        assert reply["content"]["status"] == "ok"
        _, sessions = await call(jp_fetch, "sessions")
        mine = [s for s in sessions["sessions"] if s["consumer"] == f"kernel:{kernel_id}"]
        assert len(mine) == 1, sessions
        assert mine[0]["owner"]
        session_id = mine[0]["id"]
    finally:
        client.stop_channels()
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert (await call(jp_fetch, "sessions", session_id))[0] == 404  # shutdown destroyed the session


@pytest.mark.parametrize("floor", ["vm"])
async def test_a_refused_spec_answers_the_start_with_the_policy_message(jp_fetch, sandboxed_kernelspec):
    code, body = await start_kernel(jp_fetch)
    assert code == 400
    # the message JupyterLab shows in its "Error Starting Kernel" dialog, in lines of at most 72 characters
    lines = body["message"].splitlines()
    assert max(map(len, lines)) <= 72, body
    words = " ".join(lines)
    assert "isolation 'vm' was requested" in words, body
    assert "SandboxPolicy.isolation" in words


@pytest.mark.parametrize("server_provider", ["local", "docker"])
async def test_the_servers_stop_destroys_kernel_sessions_though_extensions_stop_first(
    jp_fetch, jp_serverapp, sandboxed_kernelspec, server_provider
):
    """ServerApp._cleanup stops extensions before kernels: the extension's stop takes the kernel's session."""
    from tests.support.server import sandbox_app

    code, model = await start_kernel(jp_fetch)
    assert code == 201, model
    _, sessions = await call(jp_fetch, "sessions")
    (session,) = [s for s in sessions["sessions"] if s["consumer"] == f"kernel:{model['id']}"]
    await sandbox_app(jp_serverapp).stop_extension()  # as _cleanup: extensions first...
    await jp_serverapp.kernel_manager.shutdown_all()  # ...then kernels
    if server_provider == "local":
        assert not os.path.exists(session["workspace"])
    else:
        from tests.support.docker import docker_client, leftovers

        engine = docker_client()
        try:
            assert leftovers(engine) == []
        finally:
            engine.close()
