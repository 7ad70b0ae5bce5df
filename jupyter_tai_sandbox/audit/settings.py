"""The audit log's settings (``AuditSettings``): where it is written, how it rotates, what names each line."""

from __future__ import annotations

import os
import socket
from typing import Any

from traitlets import Bool, Integer, Unicode, default, validate
from traitlets.config import LoggingConfigurable

#: the environment variable that sets AuditSettings.path (explicit config wins over it)
PATH_ENV = "TAI_SANDBOX_AUDIT_PATH"


class AuditSettings(LoggingConfigurable):
    """The tamper-evident audit log: one hash-chained JSON line per event of the server's sessions
    (docs/operators/audit-log.md)."""

    enabled = Bool(
        True,
        help="""Keep the audit log: one JSON line per session event (create, destroy, reap, fork, pause, resume,
        exec start and end, file transfers, terminals, refusals, egress decisions, admin actions), scrubbed of
        every secret value and hash-chained (`jupyter tai-sandbox audit verify`). On by default; off, nothing is
        written and GET /api/sandbox/audit answers 404.""",
    ).tag(config=True)

    path = Unicode(
        help=f"""The audit log's file (${PATH_ENV}); rotated files are PATH.1 (newest) to PATH.N. Default:
        <jupyter data dir>/tai_sandbox/audit.jsonl (the data dir, not the runtime dir, which may be a tmpfs).
        Several servers may share one file: each appends under a lock and chains to the last line on disk.""",
    ).tag(config=True)

    max_bytes = Integer(
        64 << 20,
        help="""Size at which the audit log is rotated, in bytes: the file becomes PATH.1 (PATH.1 becomes PATH.2...)
        and a new PATH starts, its first line chained to the last line of the one before. 0: never rotated.""",
    ).tag(config=True)

    backups = Integer(
        10,
        help="""How many rotated files are kept (PATH.1 to PATH.N, the retention); an older one is deleted at a
        rotation (verify then reports where the kept lines start). 0 keeps none.""",
    ).tag(config=True)

    fsync = Bool(
        False,
        help="""fsync the audit log after each batch of lines: a line survives a crash of the machine, not only of
        the server, at the cost of a disk flush per batch (lines are written by a thread of their own, never on
        the event loop).""",
    ).tag(config=True)

    deployment = Unicode(
        help="""The deployment named in every line. Default: the provider's (DockerSandbox.deployment and the
        like, $TAI_SANDBOX_DEPLOYMENT), else user@host:config dir.""",
    ).tag(config=True)

    server_name = Unicode(
        help="""This server's name in every line (several servers may share a deployment, or a file). Default:
        host:port.""",
    ).tag(config=True)

    @default("path")
    def _path_default(self) -> str:
        raw = os.environ.get(PATH_ENV, "").strip()
        if raw:
            return raw
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "tai_sandbox", "audit.jsonl")

    @default("server_name")
    def _server_name_default(self) -> str:
        port = getattr(getattr(self.parent, "serverapp", None), "port", None)
        host = socket.gethostname()
        return f"{host}:{port}" if port else host

    @validate("max_bytes", "backups")
    def _not_negative(self, proposal: Any) -> int:
        value = proposal["value"]
        if value < 0:
            raise ValueError(f"AuditSettings.{proposal['trait'].name} must be 0 or more, not {value}")
        return int(value)
