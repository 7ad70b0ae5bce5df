"""The MCP door's own tools, as data: each one's name, description, input schema and the action it needs
(:class:`ToolSpec`); the session tools and the preset authoring tools. :mod:`.catalog` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..tools import NAME_PATTERN

#: the longest a session_exec_poll may wait for output
MAX_POLL_WAIT = 30.0


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    action: str = "read"
    read_only: bool = False
    destructive: bool = False


# ------------------------------------------------------------------ schemas

_SESSION_ID = {"type": "string", "minLength": 1, "description": "a session id from session_create"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_ENV = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "description": "extra environment variables",
}
_COMMAND_PROPERTIES: dict[str, Any] = {
    "session_id": _SESSION_ID,
    "argv": {
        **_STRINGS,
        "minItems": 1,
        "description": 'the program and its arguments, e.g. ["python3", "x.py"]',
    },
    "script": {"type": "string", "description": "shell text, run as sh -c SCRIPT (give argv or script)"},
    "timeout_seconds": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "the command's deadline; it is killed past it (default 60 s, at most the "
        "operator's SandboxPolicy.max_timeout_seconds)",
    },
    "env": _ENV,
    "cwd": {"type": "string", "minLength": 1, "description": "working directory inside the workspace"},
    "stdin": {"type": "string", "description": "text fed to the command's stdin (then closed)"},
}


def _command_schema(description_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["session_id"],
        "oneOf": [{"required": ["argv"]}, {"required": ["script"]}],
        "properties": {**_COMMAND_PROPERTIES, **(description_extra or {})},
    }


_SPEC_PROPERTIES: dict[str, Any] = {
    "image": {"type": ["string", "null"], "description": "container image (docker); default: the operator's"},
    "isolation": {"enum": ["none", "container", "vm", None]},
    "network": {"enum": ["egress", "internal", "none"], "default": "egress"},
    "durability": {"enum": ["ephemeral", "persistent"], "description": "persistent needs workspace_key"},
    "workspace_key": {
        "type": ["string", "null"],
        "description": "a durable workspace that outlives the session",
    },
    "ttl_seconds": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "the session is reaped after this",
    },
    "cpu": {"type": ["number", "null"], "exclusiveMinimum": 0},
    "memory_mb": {"type": ["integer", "null"], "exclusiveMinimum": 0},
    "env": _ENV,
    "consumer": {
        "type": "string",
        "description": "credential label; naming another than your own is an admin act",
    },
    "owner": {"type": "string", "description": "naming another owner than yourself is an admin act"},
    "egress": {
        "type": "object",
        "additionalProperties": False,
        "description": "with network egress: the host names the session may reach through its egress gateway "
        "(docker), within the operator's rule (SandboxPolicy.egress_rules)",
        "properties": {
            "allow": {"type": ["array", "null"], "items": {"type": "string"}},
            "deny": {"type": "array", "items": {"type": "string"}},
        },
    },
}
_HOSTS_DESCRIPTION = (
    "host names: 'example.com' (that name, ports 80 and 443), '*.example.com' (any name under it), '*' "
    "(any name; allow only), 'NAME:PORT' (raw TCP to that port)"
)

SESSION_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "session_create",
        "Create a sandbox session (a workspace where commands run). Answers the session's info; its id is "
        "what the other session_* tools take. Sessions are yours alone and are reaped after ttl_seconds.",
        {"type": "object", "additionalProperties": False, "properties": _SPEC_PROPERTIES},
        action="write",
    ),
    ToolSpec(
        "session_exec",
        "Run a command in a session to its end; answers exit_code, stdout and stderr with their byte "
        "counts (long output is cut in the middle, marked, and flagged truncated), and a reason when the "
        'status alone does not say why it ended ("killed: out of memory ..."). For commands that run '
        "longer than a minute use session_exec_start.",
        _command_schema(),
        action="execute",
    ),
    ToolSpec(
        "session_exec_start",
        "Start a long command in a session and answer a handle at once; read its output with "
        "session_exec_poll until running is false. The command is killed at its deadline, when its session "
        "is destroyed, or when nobody polls it for a while.",
        _command_schema(),
        action="execute",
    ),
    ToolSpec(
        "session_exec_poll",
        "Output of a started command since an offset (0 at first, then the answer's next_offset), waiting up "
        "to wait_seconds for news; when running is false, exit_code (or error) is its end.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["handle"],
            "properties": {
                "handle": {"type": "string", "minLength": 1, "description": "from session_exec_start"},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "wait_seconds": {"type": "number", "minimum": 0, "maximum": MAX_POLL_WAIT, "default": 10},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1 << 20, "default": 65536},
            },
        },
        action="execute",
    ),
    ToolSpec(
        "session_exec_kill",
        "Kill a started command.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["handle"],
            "properties": {"handle": {"type": "string", "minLength": 1}},
        },
        action="execute",
        destructive=True,
    ),
    ToolSpec(
        "session_read_file",
        "Read a workspace file (utf-8 text, or base64 for exact bytes); at most max_bytes are answered.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id", "path"],
            "properties": {
                "session_id": _SESSION_ID,
                "path": {"type": "string", "minLength": 1, "description": "relative to the workspace"},
                "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": 16 << 20, "default": 1 << 20},
            },
        },
        read_only=True,
    ),
    ToolSpec(
        "session_write_file",
        "Write a workspace file (parent folders are created; an existing file is replaced).",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id", "path", "content"],
            "properties": {
                "session_id": _SESSION_ID,
                "path": {"type": "string", "minLength": 1, "description": "relative to the workspace"},
                "content": {"type": "string"},
                "encoding": {"enum": ["utf-8", "base64"], "default": "utf-8"},
            },
        },
        action="write",
    ),
    ToolSpec(
        "session_list_files",
        "List a workspace folder: name, type and size of each entry.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {"session_id": _SESSION_ID, "path": {"type": "string", "default": "."}},
        },
        read_only=True,
    ),
    ToolSpec(
        "session_destroy",
        "Destroy a session (its running commands are killed); a persistent workspace is kept unless "
        "remove_workspace.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {
                "session_id": _SESSION_ID,
                "remove_workspace": {"type": "boolean", "default": False},
            },
        },
        action="write",
        destructive=True,
    ),
    ToolSpec(
        "session_pause",
        "Freeze every process of a session where it is (its TTL still runs; commands and file calls are "
        "refused until session_resume). Not every provider can: the error then names the operation.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {"session_id": _SESSION_ID},
        },
        action="write",
    ),
    ToolSpec(
        "session_resume",
        "Let a paused session run on from where it was.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {"session_id": _SESSION_ID},
        },
        action="write",
    ),
    ToolSpec(
        "session_fork",
        "Start a new session of yours from a session's state now (vm: its memory and every process); the two "
        "then run on apart. Counts against your session quota. Not every provider can: the error then names "
        "the operation.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {"session_id": _SESSION_ID},
        },
        action="write",
    ),
    ToolSpec(
        "session_set_egress",
        "Change a running session's egress policy: the host names its new connections may reach (within a "
        "second), within the operator's rule; its secrets are kept. allow null (or absent): the operator's "
        "rule's allow-list, or any name on ports 80 and 443. A provider without an egress gateway refuses.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {
                "session_id": _SESSION_ID,
                "allow": {
                    "type": ["array", "null"],
                    "items": {"type": "string"},
                    "description": "the " + _HOSTS_DESCRIPTION + " it may reach",
                },
                "deny": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "host names it may not reach (entries as in allow, '*' aside); "
                    "they win over allow",
                },
            },
        },
        action="write",
    ),
    ToolSpec(
        "session_port_url",
        "The web preview URL of a TCP port inside a session (a web app, a dev server), and whether something "
        "listens on it now. The url is a path on this Jupyter server (with its base URL): it carries no token, "
        "a browser opens it with its Jupyter login; another program sends the token as the Authorization "
        "header. Refused for a session that runs on the server's own host (local provider).",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id", "port"],
            "properties": {
                "session_id": _SESSION_ID,
                "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                "path": {"type": "string", "default": "", "description": "the app's own path, e.g. /docs"},
                "absolute": {
                    "type": "boolean",
                    "default": False,
                    "description": "the route whose app sees the full request path (for an app that knows its "
                    "root); default: the app sees only PATH",
                },
            },
        },
        read_only=True,
    ),
    ToolSpec(
        "session_transcript",
        "The session's commands and their output as a Jupyter notebook (nbformat 4, as JSON in `notebook`): one "
        "code cell per command that ran through this server (its stdout and stderr as stream outputs, its exit "
        "as a note), scrubbed like every transcript, unsigned. Bounded by the server's TranscriptSettings (the "
        "oldest output dropped first, said in `truncated`); a session just destroyed is still answered a while.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["session_id"],
            "properties": {"session_id": _SESSION_ID},
        },
        read_only=True,
    ),
    ToolSpec(
        "session_status",
        "One session's info (with session_id), or all your live sessions and the sandbox provider's status.",
        {"type": "object", "additionalProperties": False, "properties": {"session_id": _SESSION_ID}},
        read_only=True,
    ),
)

AUTHORING_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "preset_put",
        "Author a code tool (a preset over sandbox_exec: its own input schema and a binding of the fields "
        "into a fixed command). An admin act. The new tool appears in tools/list.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "definition"],
            "properties": {
                "name": {"type": "string", "pattern": NAME_PATTERN.pattern},
                "definition": {
                    "type": "object",
                    "description": '{"description", "input_schema", "binding": {"argv" | "script", "args", '
                    '"stdin", "env", "timeout_seconds"}, "session": {...}} as REST PUT tools/{name}',
                },
                "replace": {"type": "boolean", "default": False},
            },
        },
        action="write",
    ),
    ToolSpec(
        "preset_remove",
        "Remove a code tool authored at run time. An admin act for tools over sandbox_exec.",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
        action="write",
        destructive=True,
    ),
)

DOOR_TOOLS: dict[str, ToolSpec] = {t.name: t for t in (*SESSION_TOOLS, *AUTHORING_TOOLS)}
