"""A user's server whose remote sandbox service is down (JupyterHub's proxy answers its HTML error page) says
so as a typed, plain-text 503 on every route, the status route included (issue 50, point 4): never the
page, never a 500, never a 200 that every create then fails."""

import http.server
import threading

import pytest

from tests.support.server import call, server_config

PAGE = b"<!DOCTYPE html><html><body><h1>503 : Service Unavailable</h1><p>the service is not running</p></body></html>"


class HubProxyDown(http.server.BaseHTTPRequestHandler):
    """The hub proxy's page for a stopped service; while ``up``, the status a running service answers."""

    up = False
    STATUS = (
        b'{"kind": "docker", "max_isolation": "container", "networks": ["none"], "supports_limits": true}'
    )

    def _answer(self):
        if HubProxyDown.up and self.command == "GET" and self.path.endswith("/api/sandbox/status"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.STATUS)))
            self.end_headers()
            self.wfile.write(self.STATUS)
            return
        self.send_response(503)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def proxy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubProxyDown)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/services/sandbox/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def jp_server_config(tmp_path, proxy):
    return server_config("remote", tmp_path / "sandboxes", RemoteSandbox={"url": proxy, "token": "hub-token"})


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", ("status",), None), ("POST", ("sessions",), {}), ("GET", ("sessions",), None)],
    ids=["status", "create", "list"],
)
async def test_a_down_service_is_a_plain_typed_503(jp_fetch, method, path, body):
    status, answer = await call(jp_fetch, *path, method=method, body=body)
    assert (status, answer["error"]) == (503, "SandboxUnavailableError"), answer
    assert "<" not in answer["message"] and "HTTP 503" in answer["message"], answer


async def test_the_status_route_says_a_service_stopped_since_its_last_answer_is_down(jp_fetch):
    """No call has failed since the service last answered (no cached answer hides it): the next status is 503."""
    HubProxyDown.up = True
    try:
        status, answer = await call(jp_fetch, "status")
        assert (status, answer["kind"]) == (200, "remote"), answer
    finally:
        HubProxyDown.up = False
    status, answer = await call(jp_fetch, "status")
    assert (status, answer["error"]) == (503, "SandboxUnavailableError"), answer
