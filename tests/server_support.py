"""Helpers for the server tests (pytest-jupyter fixtures come from its plugin, see conftest)."""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import HTTPClientError


def server_config(provider: str, root: Any, **extra: Any) -> dict[str, Any]:
    """jp_server_config for a server running the extension with ``provider``."""
    config: dict[str, Any] = {
        "ServerApp": {"jpserver_extensions": {"jupyter_tai_sandbox": True}},
        "SandboxApp": {"provider": provider},
        "SandboxPolicy": {"isolation": "none"},
        "LocalSandbox": {"root": str(root)},
    }
    for section, values in extra.items():
        config.setdefault(section, {}).update(values)
    return config


def sandbox_app(jp_serverapp):
    """The running SandboxApp of a test server."""
    return jp_serverapp.extension_manager.extensions["jupyter_tai_sandbox"].extension_points[
        "jupyter_tai_sandbox"
    ].app


async def call(jp_fetch, *parts: str, method: str = "GET", body: Any = None, params=None, raw: bytes | None = None,
               headers=None, **kwargs: Any):
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
    content_type = response.headers.get("Content-Type", "")
    if response.body and content_type.startswith("application/json"):
        return response.code, json.loads(response.body)
    return response.code, response.body
