"""A user's server whose remote sandbox service is down (JupyterHub's proxy answers its HTML error page) says
so as a typed, plain-text 503 on every route, the status route included (issue 50, point 4): never the
page, never a 500, never a 200 that every create then fails."""

import http.server
import threading

import pytest

from tests.support.server import call, server_config

PAGE = b"<!DOCTYPE html><html><body><h1>503 : Service Unavailable</h1><p>the service is not running</p></body></html>"


class HubProxyDown(http.server.BaseHTTPRequestHandler):
    def _answer(self):
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
