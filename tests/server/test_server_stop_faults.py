"""A stopping or restarted server loses no session and leaks none (issue 50, point 4): a stopping server makes
no new session and destroys one that was under way; a server that adopts its deployment's sessions (the
JupyterHub service does) stops what a crashed one before it made; a client whose server is down gets a typed,
plain-text unavailability, never a proxy's HTML page."""

import asyncio
import http.server
import threading

import pytest

from jupyter_tai_sandbox.client import SandboxClient, error_from_body
from jupyter_tai_sandbox.contract import SandboxUnavailableError, SessionSpec
from jupyter_tai_sandbox.errors import error_status
from jupyter_tai_sandbox.hub import server_argv
from tests.support.server import sandbox_app, server_config


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("local", tmp_path / "sandboxes")


async def test_a_stopping_server_makes_no_session_and_destroys_one_made_meanwhile(jp_serverapp):
    app = sandbox_app(jp_serverapp)
    registry, provider = app.registry, app.sandbox.provider

    async def made_while_stopping():
        session = await app.sandbox.create(SessionSpec(consumer="stop-race"))
        registry.stopping = True  # the stop began while the provider was making it
        return session

    with pytest.raises(SandboxUnavailableError, match="stopping"):
        await registry._made(SessionSpec(consumer="stop-race"), None, made_while_stopping)
    assert [s for s in await provider.list() if s.spec.consumer == "stop-race"] == []
    with pytest.raises(SandboxUnavailableError, match="stopping"):
        await registry.create(SessionSpec(consumer="stop-race"))
    assert [s for s in await provider.list() if s.spec.consumer == "stop-race"] == []
    registry.stopping = False


async def test_a_server_that_adopts_its_deployment_stops_what_a_crashed_one_made(jp_serverapp):
    app = sandbox_app(jp_serverapp)
    provider = app.sandbox.provider
    # made by "the crashed server": live in the deployment, in no registry
    survivor = await provider.create(SessionSpec(consumer="crash-survivor"))
    assert survivor.id not in app.registry.ids
    await app.adopt_deployment_sessions()
    assert survivor.id in app.registry.ids
    await app.stop_extension()
    assert [s for s in await provider.list() if s.id == survivor.id] == []


def test_the_hub_service_adopts_its_deployments_sessions():
    assert "--SandboxApp.adopt_sessions=True" in server_argv({})


def test_an_answer_that_is_not_the_apis_is_a_plain_unavailability():
    error = error_from_body(
        503, b"<!DOCTYPE html><html><body><h1>503 : Service Unavailable</h1></body></html>"
    )
    assert isinstance(error, SandboxUnavailableError) and error_status(error) == 503
    assert "<" not in str(error) and "HTTP 503 Service Unavailable" in str(error)


def test_a_client_of_a_server_behind_a_proxy_that_answers_html_gets_a_typed_503():
    class HubProxyDown(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html><body>the service is not running</body></html>"
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubProxyDown)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = SandboxClient(f"http://127.0.0.1:{server.server_address[1]}/", "token", request_timeout=10)

        async def ask():
            try:
                return await client.status()
            finally:
                await client.aclose()

        with pytest.raises(SandboxUnavailableError, match=r"HTTP 502 Bad Gateway") as raised:
            asyncio.run(ask())
        assert "<html>" not in str(raised.value)
    finally:
        server.shutdown()
        server.server_close()


async def test_a_stop_waits_for_a_create_under_way_and_destroys_what_it_made(jp_serverapp):
    """A create the stop found under way (a kernel restarter's, as JupyterHub stops the service) ends before
    the server does, and what it made is destroyed: the process never exits with a session no one holds."""
    app = sandbox_app(jp_serverapp)
    registry, provider = app.registry, app.sandbox.provider
    release = asyncio.Event()

    async def slow_make():
        await release.wait()  # the engine is still making it as the stop begins
        return await provider.create(SessionSpec(consumer="stop-under-way"))

    create = asyncio.ensure_future(registry._made(SessionSpec(consumer="stop-under-way"), None, slow_make))
    await asyncio.sleep(0)
    stop = asyncio.ensure_future(app.stop_extension())
    await asyncio.sleep(0.2)
    assert registry.stopping and not stop.done()  # the stop waits for the create
    release.set()
    with pytest.raises(SandboxUnavailableError, match="stopping"):
        await create
    await stop
    assert [s for s in await provider.list() if s.spec.consumer == "stop-under-way"] == []
