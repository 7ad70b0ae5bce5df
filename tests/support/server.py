"""Helpers for the server tests (pytest-jupyter fixtures come from its plugin, see conftest)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_tai_sandbox.providers.local import LocalSandbox


def server_config(provider: str, root: Any, **extra: Any) -> dict[str, Any]:
    """jp_server_config for a server running the extension with ``provider``."""
    config: dict[str, Any] = {
        "ServerApp": {"jpserver_extensions": {"jupyter_tai_sandbox": True}},
        "SandboxApp": {"provider": provider},
        "SandboxPolicy": {"isolation": "none"},
        "LocalSandbox": {"root": str(root)},
    }
    if provider == "docker":
        from tests.support.docker import RUN_LABEL, TEST_IMAGE, docker_client

        docker_client()  # skips (fails in CI) without an engine
        config["DockerSandbox"] = {"image": TEST_IMAGE, "extra_labels": RUN_LABEL}
    for section, values in extra.items():
        config.setdefault(section, {}).update(values)
    return config


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def provider(request) -> str:
    return request.param


def sandbox_app(jp_serverapp):
    """The running SandboxApp of a test server."""
    return (
        jp_serverapp.extension_manager.extensions["jupyter_tai_sandbox"]
        .extension_points["jupyter_tai_sandbox"]
        .app
    )


async def call(
    jp_fetch,
    *parts: str,
    method: str = "GET",
    body: Any = None,
    params=None,
    raw: bytes | None = None,
    headers=None,
    **kwargs: Any,
):
    """A request to /api/sandbox/...; returns (status, parsed JSON or bytes), never raising on 4xx/5xx."""
    kwargs.update(method=method, params=params or {}, headers=headers or {})
    if raw is not None:
        kwargs["body"] = raw
    elif body is not None:
        kwargs["body"] = json.dumps(body)
    elif method in ("POST", "PUT") and "body_producer" not in kwargs:
        kwargs["body"] = b""
    try:
        response = await jp_fetch("api", "sandbox", *parts, **kwargs)
    except HTTPClientError as e:
        response = e.response
        assert response is not None, e
    return response.code, decode(response)


async def exec_call(
    jp_fetch,
    session_id: str,
    argv: list[str],
    timeout_seconds: float = 30,
    *,
    headers=None,
    request_timeout: float | None = None,
    **body: Any,
):
    """A one-shot command over REST (POST sessions/<id>/exec, ``body`` adds stdin, encoding...): (status,
    parsed JSON), never raising on 4xx/5xx."""
    extra = {} if request_timeout is None else {"request_timeout": request_timeout}
    request = {"argv": argv, "timeout_seconds": timeout_seconds, **body}
    return await call(
        jp_fetch, "sessions", session_id, "exec", method="POST", body=request, headers=headers, **extra
    )


def decode(response) -> Any:
    if response.body and response.headers.get("Content-Type", "").startswith("application/json"):
        return json.loads(response.body)
    return response.body


async def fetch_raw_path(port: int, base_url: str, path: str, token: str, method: str = "GET", body=None):
    """A request whose path is sent exactly as given (no client-side escaping)."""
    url = f"http://localhost:{port}{base_url.rstrip('/')}/{path.lstrip('/')}"
    try:
        response = await AsyncHTTPClient().fetch(
            url,
            method=method,
            body=body,
            headers={"Authorization": f"token {token}"},
            allow_nonstandard_methods=True,
        )
    except HTTPClientError as e:
        response = e.response
    return response.code, decode(response)


def make_provider(kind: str, root, **traits):
    if kind == "local":
        return LocalSandbox(root=str(root))
    from tests.support import docker

    docker.docker_client()  # skips (fails in CI) without an engine
    return docker.provider(**traits)


async def read_all(ws, seconds: float = 30):
    """(stdout, stderr, the final message, other text messages) once the server closes."""
    out, err, notes = bytearray(), bytearray(), []
    deadline = time.monotonic() + seconds
    while True:
        message = await asyncio.wait_for(ws.read_message(), max(0.1, deadline - time.monotonic()))
        if message is None:
            raise AssertionError("closed without a final message")
        if isinstance(message, bytes):
            (out if message[0] == 1 else err).extend(message[1:])
            continue
        data = json.loads(message)
        if data["type"] in ("exit", "error"):
            assert await ws.read_message() is None, "the server did not close after the final message"
            return bytes(out), bytes(err), data, notes
        notes.append(data)
