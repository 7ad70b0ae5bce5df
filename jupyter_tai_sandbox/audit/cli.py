"""``jupyter tai-sandbox audit verify|show``: the audit log from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: verify's exit status when a line was edited, removed, reordered or inserted
TAMPERED = 1


def _path(args: argparse.Namespace) -> str:
    """PATH as given, else AuditSettings.path from the server's Jupyter config."""
    if args.path:
        return str(args.path)
    from ..server_config import load_server_config
    from .settings import AuditSettings

    return AuditSettings(config=load_server_config(args.config)).path


def _verify(args: argparse.Namespace) -> int:
    from .verify import summary, verify

    path = _path(args)
    report = verify(path)
    for finding in report.findings:
        print(finding)
    print(summary(report, path), file=sys.stderr if report.findings and not report.intact else sys.stdout)
    if not report.files:
        return 2
    return 0 if report.intact else TAMPERED


def _show(args: argparse.Namespace) -> int:
    from .log import iter_records
    from .show import Filter, parse_time, select

    try:
        which = Filter(
            user=args.user,
            session=args.session,
            kinds=tuple(args.kind or ()),
            since=parse_time(args.since, "--since"),
            until=parse_time(args.until, "--until"),
        )
    except ValueError as e:
        print(f"audit show: {e}", file=sys.stderr)
        return 2
    for shown, record in enumerate(select(iter_records(_path(args)), which), 1):
        sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
        if args.limit and shown >= args.limit:
            break
    return 0


def add_audit_commands(commands: Any) -> None:
    audit = commands.add_parser(
        "audit",
        help="verify the audit log's hash chain, or show its lines by user, session, kind and time",
        description="""The server's audit log (AuditSettings.path, with its rotated files PATH.1, PATH.2...): one
        hash-chained JSON line per session event. PATH defaults to AuditSettings.path from the server's Jupyter
        config.""",
    )
    audit.add_argument(
        "--config",
        default=None,
        help="a Jupyter config file (.py or .json) read after the server's own jupyter_server_config files",
    )
    sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = sub.add_parser(
        "verify",
        help="""check the chain across the rotated files: each edited, removed, reordered or inserted line is
        named (file:line); exit status 1 when there is one, 2 when there is no log""",
    )
    verify.add_argument("path", nargs="?", default=None, help="the log (default: AuditSettings.path)")
    verify.set_defaults(run=_verify)
    show = sub.add_parser(
        "show", help="print the lines (JSON, one a line, oldest first) that match every filter"
    )
    show.add_argument("path", nargs="?", default=None, help="the log (default: AuditSettings.path)")
    show.add_argument("--user", default=None, help="lines whose owner or actor is this user")
    show.add_argument("--session", default=None, help="lines of this session id")
    show.add_argument(
        "--kind",
        action="append",
        default=None,
        help="lines of this kind (exec.end, refusal...; 'exec.' for every exec kind); repeat for several",
    )
    show.add_argument("--since", default=None, help="lines at or after this time (epoch seconds or RFC 3339)")
    show.add_argument(
        "--until", default=None, help="lines at or before this time (epoch seconds or RFC 3339)"
    )
    show.add_argument("--limit", type=int, default=0, help="at most this many lines (default: all)")
    show.set_defaults(run=_show)
