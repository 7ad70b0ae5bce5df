"""The MCP door: agents drive sandbox sessions and code tools over MCP, on the Jupyter port.

``/api/sandbox/mcp`` speaks MCP's Streamable HTTP transport through the
official ``mcp`` SDK (the optional extra ``jupyter-tai-sandbox[mcp]``), behind
jupyter_server's authentication and Authorizer. The app calls three functions:

* :func:`handlers` in ``initialize_handlers`` (creates the :class:`SandboxMCP`
  configurable as ``app.mcp_door``, or a route answering 503 without ``mcp``);
* :func:`start` when the extension starts (enters the SDK's session-manager lifespan);
* :func:`stop` when it stops (leaves the lifespan; the app's live-command registry,
  :mod:`jupyter_tai_sandbox.execs`, holds and kills the commands `session_exec_start` started).
"""

from __future__ import annotations

from typing import Any

MCP_PATH = r"/api/sandbox/mcp"
INSTALL_HINT = "the MCP door needs the `mcp` package (>= 2.3): pip install 'jupyter-tai-sandbox[mcp]'"


def available() -> str | None:
    """None when the SDK can be used, else why not."""
    try:
        import mcp.server.streamable_http_manager  # noqa: F401
        from mcp.server.lowlevel.server import Server  # noqa: F401
    except ImportError as e:
        return f"{INSTALL_HINT} ({e})"
    return None


def handlers(app: Any) -> list[tuple[Any, ...]]:
    """The door's route for ``app.handlers``; sets ``app.mcp_door``."""
    from .bridge import MCPHandler, MCPUnavailableHandler

    app.mcp_door = None
    missing = available()
    if missing is not None:
        app.log.info("jupyter_tai_sandbox: %s", missing)
        return [(MCP_PATH, MCPUnavailableHandler, {"reason": missing})]
    from .door import SandboxMCP

    app.mcp_door = SandboxMCP(app)
    return [(MCP_PATH, MCPHandler)]


async def start(app: Any) -> None:
    door = getattr(app, "mcp_door", None)
    if door is not None and door.enabled:
        await door.start()


async def stop(app: Any) -> None:
    door = getattr(app, "mcp_door", None)
    if door is not None:
        await door.stop()


def __getattr__(name: str) -> Any:
    if name == "SandboxMCP":
        from .door import SandboxMCP

        return SandboxMCP
    raise AttributeError(name)
