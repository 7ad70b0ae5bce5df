"""The coding agents' image (`build-image --agents`): Node.js from Debian, the ACP agents from npm and the tests'
agent-client-protocol wheel, built offline; the agents answer over stdio with no network; a repeat build is kept,
a build from the caches needs no index, mirror or registry; the CLI's refusals."""

from __future__ import annotations

import contextlib
import json
import queue
import re
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from jupyter_tai_sandbox import cli
from jupyter_tai_sandbox.images import AGENTS_IMAGE, PYTHON_IMAGE, missing_program_hint
from jupyter_tai_sandbox.providers._docker_sandbox import how_to_get
from jupyter_tai_sandbox.providers.docker.images.agents import (
    AGENTS_PREFIX,
    DEBS_IN_IMAGE,
    DEFAULT_AGENT_PACKAGES,
    LABEL_NPM,
    agent_packages,
    agents_labels,
    build_agents_image,
    npm_commands,
    npm_name,
)
from jupyter_tai_sandbox.providers.docker.images.packages import LABEL_BASE, LABEL_PIP, WHEELS_IN_IMAGE
from tests.support.docker import RUN_LABEL, docker_client, in_ci

pytestmark = [pytest.mark.docker]

#: the pip requirement .ci/docker-up builds the agents image with (the tests' minimal ACP agent needs it)
TEST_PIP = "agent-client-protocol==0.11.1"
DOCKER_UP = f"jupyter tai-sandbox build-image --agents --pip {TEST_PIP}"
#: an address where nothing answers: an index, registry or mirror asked through it fails at once
NOWHERE = "http://127.0.0.1:9"


def _need_image(client) -> Any:
    try:
        return client.images.get(AGENTS_IMAGE)
    except docker.errors.ImageNotFound:
        if in_ci():
            pytest.fail(f"{AGENTS_IMAGE} is missing: {DOCKER_UP} (bash .ci/docker-up builds it)")
        pytest.skip(f"{AGENTS_IMAGE} is missing: {DOCKER_UP}")


def _run(client, script: str) -> str:
    out = client.containers.run(
        AGENTS_IMAGE, ["sh", "-c", script], network_disabled=True, remove=True, labels=RUN_LABEL
    )
    return out.decode()


# ------------------------------------------------------------ what is in the image


def test_the_image_has_node_the_agents_and_acp_with_no_build_leftovers():
    client = docker_client()
    image = _need_image(client)
    wanted = agents_labels(DEFAULT_AGENT_PACKAGES, [TEST_PIP], client.images.get(image.labels[LABEL_BASE]).id)
    assert {key: image.labels.get(key) for key in wanted} == wanted
    assert (
        image.labels[LABEL_NPM] == " ".join(sorted(DEFAULT_AGENT_PACKAGES))
        and image.labels[LABEL_PIP] == TEST_PIP
    )
    config = image.attrs["Config"]
    assert config["Cmd"] == ["sh"] and not config.get("Entrypoint") and config["WorkingDir"] == "/workspace"
    out = _run(
        client,
        "node --version; command -v claude-code-acp; command -v codex-acp; codex-acp --help >/tmp/h 2>&1; echo help=$?; "
        "grep -c '^Usage: codex-acp' /tmp/h; "
        'python3 -c \'import acp, importlib.metadata as m; print("acp", m.version("agent-client-protocol"))\'; '
        f"ls -A {DEBS_IN_IMAGE} {WHEELS_IN_IMAGE} /root/.npm 2>&1 | grep -c 'No such file'; "
        "ls -A /var/lib/apt/lists /var/cache/apt/archives | grep -c '\\.deb$\\|_Packages$' || true; "
        "test -f /etc/ssl/certs/ca-certificates.crt && echo ca; "
        f"ls {AGENTS_PREFIX}/node_modules/@anthropic-ai/claude-agent-sdk/vendor/ripgrep",
    )
    lines = out.splitlines()
    assert re.fullmatch(r"v18\.\d+\.\d+", lines[0]), out  # Debian bookworm's nodejs
    assert lines[1:3] == ["/usr/local/bin/claude-code-acp", "/usr/local/bin/codex-acp"], out
    assert lines[3:5] == ["help=0", "1"], out
    assert lines[5] == "acp 0.11.1", out
    assert lines[6] == "3", out  # no .deb files, wheels or npm cache left in the image
    assert lines[7] == "0", out  # no apt lists or archives either
    assert lines[8] == "ca", out  # the CA roots Debian's node and the gateway's bundle.pem use
    assert set(lines[9:]) == {"COPYING", "x64-linux"} or set(lines[9:]) == {"COPYING", "arm64-linux"}, out


class _Agent:
    """An agent command in a container with no network, spoken to with ACP's JSON-RPC lines over stdio."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.name = f"tai-test-agents-{secrets.token_hex(4)}"
        command = ["docker", "run", "--rm", "-i", "--network", "none", "--name", self.name]
        for key, value in {**RUN_LABEL}.items():
            command += ["--label", f"{key}={value}"]
        for key, value in env.items():
            command += ["-e", f"{key}={value}"]
        self.proc = subprocess.Popen(
            [*command, AGENTS_IMAGE, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.stderr: list[bytes] = []
        self.pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True),
        ]
        for pump in self.pumps:
            pump.start()
        self.updates: list[dict[str, Any]] = []

    @staticmethod
    def _pump(stream: Any, put: Any) -> None:
        for line in iter(stream.readline, b""):
            put(line)

    def call(self, id_: int, method: str, params: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
        """Send a request; answer the agent's own requests with an error; keep notifications; the response."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()
        )
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no answer to {method} in {timeout} s; stderr: {b''.join(self.stderr)[-2000:]!r}"
                ) from None
            message = json.loads(line)
            if message.get("id") == id_ and "method" not in message:
                return message
            if "method" in message and "id" in message:  # a request of the agent's: not served here
                reply = {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "no"}}
                self.proc.stdin.write(json.dumps(reply).encode() + b"\n")
                self.proc.stdin.flush()
            elif message.get("method") == "session/update":
                self.updates.append(message["params"]["update"])

    def close(self) -> None:
        self.proc.kill()
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True, check=False)
        self.proc.wait(timeout=30)
        for pump in self.pumps:
            pump.join(timeout=10)  # the output ended with the command
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


INITIALIZE = {
    "protocolVersion": 1,
    "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True},
}

#: an Anthropic-compatible endpoint on the container's loopback: every message is answered with one text
FAKE_MODEL = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
TEXT = "hello from the image's fake model"
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, kind, data):
        self.send_response(200); self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self.send_response(404); self.send_header("content-length", "0"); self.end_headers()
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        print(f"FAKE-MODEL {self.path} key={self.headers.get('x-api-key')}", file=sys.stderr, flush=True)
        if "count_tokens" in self.path:
            return self.reply("application/json", b'{"input_tokens": 10}')
        model = req.get("model", "x")
        usage = {"input_tokens": 5, "output_tokens": 5}
        if not req.get("stream"):
            msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "stop_reason": "end_turn",
                   "content": [{"type": "text", "text": TEXT}], "stop_sequence": None, "usage": usage}
            return self.reply("application/json", json.dumps(msg).encode())
        events = [
            ("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message",
             "role": "assistant", "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": usage}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": TEXT}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
             "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        self.reply("text/event-stream", b"".join(f"event: {e}\ndata: {json.dumps(d)}\n\n".encode() for e, d in events))
ThreadingHTTPServer(("127.0.0.1", 8080), H).serve_forever()
"""


def test_claude_code_acp_answers_a_prompt_over_stdio_with_no_network():
    """Debian's node 18 runs claude-code-acp 0.16.2 all the way: initialize, session/new and a prompt answered
    by a model endpoint on the container's own loopback (the container has no other network)."""
    client = docker_client()
    _need_image(client)
    env = {
        "IS_SANDBOX": "1",  # claude-code refuses to run as root without it
        "ANTHROPIC_API_KEY": "sk-ant-test-image",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "HOME": "/workspace/.agent-home",
        "FAKE_MODEL": FAKE_MODEL,
    }
    agent = _Agent(["sh", "-c", 'python3 -c "$FAKE_MODEL" & exec claude-code-acp'], env)
    try:
        init = agent.call(0, "initialize", INITIALIZE)["result"]
        assert init["protocolVersion"] == 1 and init["agentCapabilities"]["loadSession"] is True
        assert (
            init["agentInfo"]["name"] == "@zed-industries/claude-code-acp"
            and init["agentInfo"]["version"] == "0.16.2"
        )
        session = agent.call(1, "session/new", {"cwd": "/workspace", "mcpServers": []})["result"]["sessionId"]
        done = agent.call(
            2, "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]}
        )
        assert done.get("result", {}).get("stopReason") == "end_turn", (done, b"".join(agent.stderr)[-2000:])
        said = "".join(
            u["content"].get("text", "")
            for u in agent.updates
            if u.get("sessionUpdate") == "agent_message_chunk"
        )
        assert "hello from the image's fake model" in said, agent.updates
        assert b"FAKE-MODEL /v1/messages?beta=true key=sk-ant-test-image" in b"".join(agent.stderr)
    finally:
        agent.close()


def test_codex_acp_initializes_over_stdio_with_no_network():
    client = docker_client()
    _need_image(client)
    agent = _Agent(["codex-acp"], {"HOME": "/workspace/.agent-home"})
    try:
        init = agent.call(0, "initialize", INITIALIZE)["result"]
        assert init["protocolVersion"] == 1 and init["agentCapabilities"]["loadSession"] is True
    finally:
        agent.close()


# ------------------------------------------------------------ building it


def _identity(client, name: str) -> tuple[str, str]:
    image = client.api.inspect_image(name)
    return image["Id"], image["Created"]


def test_the_docker_up_build_again_is_kept(capsys):
    client = docker_client()
    _need_image(client)
    before = _identity(client, AGENTS_IMAGE)
    assert cli.main(["build-image", "--agents", "--pip", TEST_PIP]) == 0
    out = capsys.readouterr().out
    assert f"{AGENTS_IMAGE} has {' '.join(sorted(DEFAULT_AGENT_PACKAGES))} {TEST_PIP} on " in out, out
    assert "already: kept (--force rebuilds it)" in out
    assert _identity(client, AGENTS_IMAGE) == before


def test_a_build_from_the_caches_asks_no_index_registry_or_mirror(monkeypatch):
    """Another image of the same inputs: npm packages, .deb files and wheels all come from the caches the
    docker-up build filled (npm, pip and apt pointed at an address where nothing answers); then kept; then
    --force makes a new image and drops the one it replaced."""
    client = docker_client()
    image = _need_image(client)
    for variable in (
        "npm_config_registry",
        "PIP_INDEX_URL",
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
    ):
        monkeypatch.setenv(variable, NOWHERE)
    name = f"tai-sandbox-test/agents:{secrets.token_hex(4)}"
    said: list[str] = []
    try:
        first = build_agents_image(name, pip=[TEST_PIP], progress=said.append)
        assert first is not None
        cached = [line for line in said if "in the cache" in line or "all in the cache" in line]
        assert len(cached) == 3, said  # npm, Debian, pip
        built = client.images.get(name)
        assert built.labels == image.labels
        assert built.history()[1]["Id"] == image.history()[1]["Id"]  # one layer on the shared Python base

        said.clear()
        assert build_agents_image(name, pip=[TEST_PIP], progress=said.append) is None
        assert any("already: kept" in line for line in said), said

        forced = build_agents_image(name, pip=[TEST_PIP], force=True, progress=said.append)
        assert forced is not None and forced != first
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(first)  # the replaced build lost its name and was dropped
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(name, force=True)


# ------------------------------------------------------------ the recipe's rules and the CLI's refusals


def test_npm_packages_add_to_the_default_agents_or_re_pin_one():
    assert npm_name("@zed-industries/claude-code-acp@0.16.2") == "@zed-industries/claude-code-acp"
    assert npm_name("left-pad@^1") == "left-pad" and npm_name("left-pad") == "left-pad"
    assert npm_name("@scope/pkg") == "@scope/pkg"
    assert agent_packages() == sorted(DEFAULT_AGENT_PACKAGES)
    assert agent_packages(["@zed-industries/claude-code-acp@0.17.0", "@google/gemini-cli@0.1.0"]) == [
        "@google/gemini-cli@0.1.0",
        "@zed-industries/claude-code-acp@0.17.0",
        "@zed-industries/codex-acp@0.16.0",
    ]


def test_the_commands_linked_are_the_installed_packages_bins(tmp_path: Path):
    (tmp_path / "package.json").write_text(json.dumps({"dependencies": {"@s/a": "1", "b": "2"}}))
    for package, meta in {
        "@s/a": {"bin": {"a-acp": "./dist/index.js", "bad name;rm": "x.js"}},
        "b": {"bin": "bin/b.js"},
    }.items():
        folder = tmp_path / "node_modules" / package
        folder.mkdir(parents=True)
        (folder / "package.json").write_text(json.dumps(meta))
    assert npm_commands(tmp_path) == {
        "a-acp": f"{AGENTS_PREFIX}/node_modules/@s/a/dist/index.js",
        "b": f"{AGENTS_PREFIX}/node_modules/b/bin/b.js",
    }


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--npm", "x"], "--npm adds packages to the agents image: add --agents"),
        (["--python", "--agents"], "--agents builds on the Python image's Debian base already"),
        (["--pip", "six"], "--pip adds packages to the Python image: add --python (or --agents"),
    ],
)
def test_the_cli_refuses_options_that_do_not_go_together(argv, said, capsys):
    assert cli.main(["build-image", *argv]) == 2
    assert said in capsys.readouterr().err


def test_without_npm_the_build_says_what_to_install(tmp_path, monkeypatch, capsys):
    client = docker_client()
    _need_image(client)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no npm tree cached
    monkeypatch.setenv("PATH", "/nonexistent")  # this machine's npm cannot be found
    name = f"tai-sandbox-test/agents-nonpm:{secrets.token_hex(4)}"
    status = cli.main(["build-image", "--agents", "--name", name])
    err = capsys.readouterr().err
    assert status == 1
    assert "build-image --agents: npm is missing" in err and "apt-get install npm" in err, err
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(name)


def test_a_missing_agents_image_or_program_names_the_build_command():
    assert "`jupyter tai-sandbox build-image --agents`" in how_to_get(AGENTS_IMAGE)
    hint = missing_program_hint(
        "sh: 1: claude-code-acp: not found", ["claude-code-acp"], PYTHON_IMAGE, "docker"
    )
    assert hint is not None and f"{AGENTS_IMAGE} has it" in hint and "build-image --agents" in hint
    assert missing_program_hint("sh: 1: node: not found", ["node"], AGENTS_IMAGE, "docker") == (
        f"node is not in the session's image {AGENTS_IMAGE}: start the session with an --image that has it"
    )


def test_a_session_user_who_is_not_root_can_run_the_agents():
    client = docker_client()
    _need_image(client)
    out = client.containers.run(
        AGENTS_IMAGE,
        ["sh", "-c", "codex-acp --help | grep -c '^Usage: codex-acp'; node -p \"require('" + AGENTS_PREFIX
         + "/node_modules/@zed-industries/claude-code-acp/package.json').version\""],
        user="65534", network_disabled=True, remove=True, labels=RUN_LABEL,
    )  # fmt: skip
    assert out.decode().split() == ["1", "0.16.2"]
