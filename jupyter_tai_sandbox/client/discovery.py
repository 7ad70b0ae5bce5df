"""Finding the server a :class:`~.sandbox_client.SandboxClient` talks to when it is given no ``url``.

Explicit ``url``/``token``, else ``TAI_SANDBOX_URL`` / ``TAI_SANDBOX_TOKEN``
(set for kernels started by a server running the extension), else the first
running Jupyter server that jupyter_server lists: the one started first (see
``running_servers``), with a ``SeveralServersWarning`` naming it when more than
one runs.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from ..contract import SandboxUnavailableError


class SeveralServersWarning(UserWarning):
    """More than one Jupyter server runs and none was named: the message says which is used."""


def running_servers() -> list[dict[str, Any]]:
    """The running Jupyter servers jupyter_server lists, the one started first first.

    Started first means the oldest server info file (``jpserver-<pid>.json`` in the
    runtime folder, written once when a server starts); ties go to the smaller pid.
    """
    try:
        from jupyter_core.paths import jupyter_runtime_dir
        from jupyter_server.serverapp import list_running_servers
    except ImportError:  # pragma: no cover - jupyter_server is a dependency
        return []
    runtime = jupyter_runtime_dir()

    def started(server: dict[str, Any]) -> tuple[float, int]:
        pid = int(server.get("pid") or 0)
        try:
            when = os.stat(os.path.join(runtime, f"jpserver-{pid}.json")).st_mtime
        except OSError:
            when = float("inf")
        return when, pid

    return sorted(list_running_servers(runtime), key=started)


def discover_server() -> tuple[str, str]:
    """(base url, token) of the server to talk to; SandboxUnavailableError when none is found.

    ``TAI_SANDBOX_URL`` (and ``TAI_SANDBOX_TOKEN``) when set, else the running Jupyter
    server started first (``running_servers``), deterministically: with several running,
    a ``SeveralServersWarning`` names the one chosen and how to pick another.
    """
    url = os.environ.get("TAI_SANDBOX_URL")
    if url:
        return url, os.environ.get("TAI_SANDBOX_TOKEN", "")
    servers = running_servers()
    if servers:
        chosen = servers[0]
        if len(servers) > 1:
            others = ", ".join(s["url"] for s in servers[1:])
            warnings.warn(
                f"{len(servers)} Jupyter servers are running; using the one started first, {chosen['url']} "
                f"(pid {chosen.get('pid')}), not {others}: set TAI_SANDBOX_URL (and TAI_SANDBOX_TOKEN) "
                "or pass url= to choose",
                SeveralServersWarning,
                stacklevel=2,
            )
        return chosen["url"], chosen.get("token", "")
    raise SandboxUnavailableError(
        "no Jupyter server found: set TAI_SANDBOX_URL (and TAI_SANDBOX_TOKEN), or start "
        "`jupyter server` with the jupyter_tai_sandbox extension (TAI_MCP_SANDBOX names the provider)"
    )
