"""The tests' model endpoint: an Anthropic-compatible Messages API, scripted by the test (issue 53).

A real coding agent (``claude-code-acp``) is pointed at it with ``ANTHROPIC_BASE_URL``; what the "model"
answers is a **script**, a list of turns the test writes: each turn is a text reply or one or more
``tool_use`` calls (``mcp__acp__Read {"file_path": ...}``, ``mcp__acp__Bash {"command": ...}``, ...). The
turn a request gets is the number of assistant messages in its conversation, so the script advances as
the agent sends the tool results back (and a retried request gets the same turn again); past the script's
end the model says so and ends its turn. A request that offers no tools (the agent's side requests: a
title, a summary) gets a short text and does not advance the script.

Served:

* ``POST /v1/messages`` (any query, e.g. ``?beta=true``): ``stream: true`` as server-sent events
  (``message_start``, ``content_block_start`` / ``content_block_delta`` (``text_delta``,
  ``input_json_delta``) / ``content_block_stop`` per block, ``message_delta``, ``message_stop``), else one
  JSON message;
* ``POST /v1/messages/count_tokens``: a token count;
* anything else: 404, logged.

Every request is appended to a JSON-lines log: method, path, headers (``x-api-key`` included: the test
checks which key arrived), the whole body, and the ``tool_result`` blocks of its last user message (what
the agent saw of each tool call). The script and the log are files, so the server can run in another
process (a network namespace of the tests: ``tests/support/egress_hosts.py``, role ``model``) while the
test writes the one and reads the other. Standard library only (the namespace's server imports it).

Run alone for an experiment: ``python3 fake_model.py PORT SCRIPT.json LOG.jsonl`` (plain HTTP on
127.0.0.1).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: the model name the answers carry when a request names none
DEFAULT_MODEL = "fake-model"
#: said once the script has no turn left
SCRIPT_ENDED = "(the fake model's script has ended)"
#: said to a request that offers no tools (a side request of the agent's)
SIDE_ANSWER = "ok"

# ------------------------------------------------------------------------------------------- the script


def text(reply: str) -> dict[str, Any]:
    """A turn that answers ``reply`` and ends the model's turn."""
    return {"text": reply}


def tool(name: str, **input: Any) -> dict[str, Any]:
    """One tool call (``name``, ``input``), for :func:`tools`."""
    return {"name": name, "input": input}


def tools(*calls: dict[str, Any], say: str = "") -> dict[str, Any]:
    """A turn that calls ``calls`` (in one assistant message), optionally after a text ``say``."""
    if not calls:
        raise ValueError("a tool turn calls at least one tool")
    return {"text": say, "tool_uses": list(calls)} if say else {"tool_uses": list(calls)}


def tool_use_id(turn: int, index: int) -> str:
    """The id of the ``index``-th call of turn ``turn`` (stable: a retried request gets the same ids)."""
    return f"toolu_fake_{turn:03d}_{index:02d}"


def turn_index(messages: Iterable[dict[str, Any]]) -> int:
    """Which turn of the script a conversation is at: the number of its assistant messages."""
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def content_blocks(turn: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The assistant content blocks of ``turn`` (the ``index``-th of the script)."""
    blocks: list[dict[str, Any]] = []
    if turn.get("text"):
        blocks.append({"type": "text", "text": str(turn["text"])})
    for i, call in enumerate(turn.get("tool_uses") or ()):
        blocks.append(
            {"type": "tool_use", "id": tool_use_id(index, i), "name": call["name"], "input": call["input"]}
        )
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks of the last user message: id, whether an error, and their text."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        found = []
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                found.append(
                    {
                        "tool_use_id": block.get("tool_use_id"),
                        "is_error": bool(block.get("is_error")),
                        "text": block_text(block.get("content")),
                    }
                )
        return found
    return []


def block_text(content: Any) -> str:
    """A tool result's content as text (a string, or the text blocks of a list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


# --------------------------------------------------------------------------------------------- answers


def message(blocks: list[dict[str, Any]], model: str, ident: str) -> dict[str, Any]:
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }


def sse_events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``reply`` (a whole message) as the stream of events the Messages API sends."""
    start = {**reply, "content": [], "stop_reason": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(reply["content"]):
        if block["type"] == "tool_use":
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events += [
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            ),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 10},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


# ---------------------------------------------------------------------------------------------- server


class FakeModelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: FakeModelServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def send_json(self, status: int, value: Any) -> None:
        self.send(status, json.dumps(value).encode(), "application/json")

    def do_GET(self) -> None:
        self.server.record(self, b"", None, None)
        self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})

    def do_POST(self) -> None:
        body = self.read_body()
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = None
        path = self.path.split("?", 1)[0].rstrip("/")
        if not isinstance(request, dict):
            self.server.record(self, body, None, None)
            self.send_json(
                400, {"type": "error", "error": {"type": "invalid_request_error", "message": "json"}}
            )
            return
        if path == "/v1/messages/count_tokens":
            self.server.record(self, body, request, None)
            self.send_json(200, {"input_tokens": max(1, len(body) // 4)})
            return
        if path != "/v1/messages":
            self.server.record(self, body, request, None)
            self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        messages = request.get("messages") if isinstance(request.get("messages"), list) else []
        model = str(request.get("model") or DEFAULT_MODEL)
        if request.get("tools"):
            index = turn_index(messages)
            script = self.server.script()
            turn = script[index] if index < len(script) else text(SCRIPT_ENDED)
            blocks = content_blocks(turn, index)
        else:
            index = None
            blocks = [{"type": "text", "text": SIDE_ANSWER}]
        reply = message(blocks, model, f"msg_fake_{self.server.next_id()}")
        self.server.record(self, body, request, index)
        if request.get("stream"):
            payload = b"".join(
                f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in sse_events(reply)
            )
            self.send(200, payload, "text/event-stream")
        else:
            self.send_json(200, reply)


class FakeModelServer(ThreadingHTTPServer):
    """The endpoint: a script file it reads at every request, a log file it appends to."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self, address: tuple[str, int], script_path: str | Path, log_path: str | Path, tls: Any = None
    ) -> None:
        self.script_path, self.log_path, self.tls = Path(script_path), Path(log_path), tls
        self.lock = threading.Lock()
        self.count = 0
        super().__init__(address, FakeModelHandler)

    def script(self) -> list[dict[str, Any]]:
        try:
            turns = json.loads(self.script_path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        return turns if isinstance(turns, list) else []

    def next_id(self) -> int:
        with self.lock:
            self.count += 1
            return self.count

    def record(
        self, handler: FakeModelHandler, body: bytes, request: dict[str, Any] | None, turn: int | None
    ) -> None:
        messages = (request or {}).get("messages")
        messages = messages if isinstance(messages, list) else []
        entry = {
            "time": time.time(),
            "client": handler.client_address[0],
            "method": handler.command,
            "path": handler.path,
            "headers": [[k, v] for k, v in handler.headers.items()],
            "body": body.decode(errors="replace"),
            "model": (request or {}).get("model"),
            "stream": (request or {}).get("stream"),
            "tools": [t.get("name") for t in (request or {}).get("tools") or () if isinstance(t, dict)],
            "turn": turn,
            "tool_results": tool_results(messages),
        }
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(15)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except OSError:
                return
            request.settimeout(None)
        super().finish_request(request, client_address)


def serve(
    address: str, port: int, script_path: str | Path, log_path: str | Path, tls: Any = None
) -> FakeModelServer:
    """Start the endpoint on ``address:port`` (TLS with the server context ``tls``) in a daemon thread."""
    server = FakeModelServer((address, port), script_path, log_path, tls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ------------------------------------------------------------------------------------ the test's side


class FakeModel:
    """The test's handle on an endpoint served elsewhere: writes its script, reads its log."""

    def __init__(self, script_path: str | Path, log_path: str | Path, base_url: str = "") -> None:
        self.script_path, self.log_path, self.base_url = Path(script_path), Path(log_path), base_url

    def script(self, turns: list[dict[str, Any]]) -> None:
        """Replace the script (atomically: a request reads the old one or the new one)."""
        partial = self.script_path.with_name(self.script_path.name + f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(turns))
        partial.replace(self.script_path)

    def requests(self) -> list[dict[str, Any]]:
        """Every request that arrived, in order."""
        try:
            lines = self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def mark(self) -> int:
        """The number of requests so far (``requests()[mark:]``: those since)."""
        return len(self.requests())

    def tool_results(self, since: int = 0) -> dict[str, dict[str, Any]]:
        """Every tool result the agent sent back since request ``since``, by its call's id."""
        return self.tool_results_of(self.requests()[since:])

    @staticmethod
    def tool_results_of(requests: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The tool results of logged ``requests`` (the first of each call's id: a retry repeats it)."""
        seen: dict[str, dict[str, Any]] = {}
        for entry in requests:
            for result in entry["tool_results"]:
                seen.setdefault(result["tool_use_id"], result)
        return seen

    def api_keys(self, since: int = 0) -> set[str]:
        """The ``x-api-key`` values the requests carried."""
        return {
            value
            for entry in self.requests()[since:]
            for key, value in entry["headers"]
            if key.lower() == "x-api-key"
        }


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} PORT SCRIPT.json LOG.jsonl")
    running = serve("127.0.0.1", int(sys.argv[1]), sys.argv[2], sys.argv[3])
    print(f"listening on http://127.0.0.1:{running.server_address[1]}", flush=True)
    threading.Event().wait()
