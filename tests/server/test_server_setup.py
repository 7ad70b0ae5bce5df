"""How the extension starts: a provider that cannot start, an empty provider, a plugin's provider,
and the activity the server's idle culling sees."""

from __future__ import annotations

import json

import pytest

from jupyter_tai_sandbox import sandboxes
from jupyter_tai_sandbox.providers.local import LocalSandbox
from tests.support.server import call, sandbox_app, server_config


class TestAMisspelledProvider:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("dokcer", tmp_path / "sandboxes")

    async def test_every_route_answers_503_in_json_saying_what_to_fix(self, jp_fetch):
        for method, parts, body in (
            ("GET", ("status",), None),
            ("GET", ("sessions",), None),
            ("POST", ("sessions",), {}),
            ("POST", ("sessions", "sbx-1", "exec"), {"argv": ["true"], "timeout_seconds": 1}),
        ):
            status, reply = await call(jp_fetch, *parts, method=method, body=body)
            assert (status, reply["error"]) == (503, "SandboxUnavailableError"), reply
            assert "dokcer" in reply["message"] and "SandboxApp.provider" in reply["message"]
            assert "docker" in reply["message"]  # the fix: the names that work


class TestAnEmptyProvider:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("", tmp_path / "sandboxes")

    async def test_empty_means_off(self, jp_fetch):
        status, body = await call(jp_fetch, "status")
        assert (status, body["kind"]) == (200, "off")


class TestAPluginsProvider:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        # a plugin registered its provider before the server started, without a policy
        self.plugin = LocalSandbox(root=str(tmp_path / "plugin"))
        sandboxes.register_sandbox(self.plugin)
        return server_config(
            "off", tmp_path / "sandboxes", SandboxPolicy={"isolation": "none", "egress": "none"}
        )

    async def test_it_stays_and_the_servers_policy_is_in_force(self, jp_fetch, jp_serverapp):
        gate = sandboxes.require_sandbox()
        assert gate.provider is self.plugin and gate.policy is sandbox_app(jp_serverapp).policy
        status, body = await call(jp_fetch, "sessions", method="POST", body={"network": "egress"})
        assert status == 400 and "egress ceiling" in body["message"]


class TestIdleCulling:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("local", tmp_path / "sandboxes")

    async def test_a_terminals_output_moves_the_servers_last_activity(self, jp_fetch, jp_ws_fetch):
        """REST calls count as activity already (jupyter_server's own); a terminal streaming with no
        REST call must count too, or idle culling stops a server whose only use is a sandbox terminal."""

        async def last_activity() -> str:
            response = await jp_fetch("api", "status")  # not itself counted as activity
            return json.loads(response.body)["last_activity"]  # what idle culling (and JupyterHub) read

        _, info = await call(jp_fetch, "sessions", method="POST", body={})
        ws = await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws")
        await ws.write_message(
            json.dumps(
                {"type": "start", "argv": ["sh", "-c", "sleep 1; echo tick; sleep 30"], "timeout_seconds": 30}
            )
        )
        assert json.loads(await ws.read_message())["type"] == "started"
        before = await last_activity()
        assert await ws.read_message() == b"\x01tick\n"  # a second later, with no REST call meanwhile
        assert await last_activity() > before  # ISO timestamps of one format compare in time order
        await ws.write_message(json.dumps({"type": "kill"}))
        while await ws.read_message() is not None:
            pass
        await call(jp_fetch, "sessions", info["id"], method="DELETE")

    async def test_an_open_terminal_counts_as_activity(self, jp_fetch, jp_ws_fetch, jp_serverapp):
        app = sandbox_app(jp_serverapp)
        _, info = await call(jp_fetch, "sessions", method="POST", body={})
        assert not app.current_activity()
        ws = await jp_ws_fetch("api", "sandbox", "sessions", info["id"], "exec", "ws")
        await ws.write_message(json.dumps({"type": "start", "argv": ["cat"], "timeout_seconds": 30}))
        assert json.loads(await ws.read_message())["type"] == "started"
        assert app.current_activity()
        await ws.write_message(json.dumps({"type": "close_stdin"}))
        while await ws.read_message() is not None:
            pass
        assert not app.current_activity()
        await call(jp_fetch, "sessions", info["id"], method="DELETE")
