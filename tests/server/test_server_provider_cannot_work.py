"""A docker provider that cannot start a session (the session agent's binary missing, the configured image not on
the engine) says so: the status route answers the typed 503 with the fix, the server logs it at its start, and a
create answers the same 503, never a 500 "Internal Server Error" with the cause only in the log.

The agent's binaries are other tests' too: the missing one is a server whose agent directory is an empty folder
(``binary.BIN_DIR`` in this process), never a removed file.
"""

from __future__ import annotations

import logging
import secrets

import pytest

from jupyter_tai_sandbox.agent import binary
from tests.support.server import call, sandbox_app, server_config

pytestmark = pytest.mark.docker

MISSING_IMAGE = f"tai-sbx-test/no-such-image:{secrets.token_hex(4)}"


@pytest.fixture
def no_agent(tmp_path, monkeypatch):
    empty = tmp_path / "no-agent-bin"
    empty.mkdir()
    monkeypatch.setattr(binary, "BIN_DIR", empty)
    return empty


def _logged(app, seen):
    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep(level=logging.DEBUG)
    app.log.addHandler(keep)
    return keep


class TestAgentBinaryMissing:
    @pytest.fixture
    def jp_server_config(self, tmp_path, no_agent):
        return server_config("docker", tmp_path / "sandboxes")

    async def test_status_create_and_start_log_say_the_agent_binary_is_missing_with_the_fix(
        self, jp_fetch, jp_serverapp, no_agent
    ):
        status, body = await call(jp_fetch, "status")
        assert status == 503, body
        assert body["error"] == "SandboxUnavailableError", body
        assert str(no_agent / "tai-agent-linux-") in body["message"], body
        assert "python -m jupyter_tai_sandbox.agent" in body["message"], body

        status, created = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
        assert status == 503, created
        assert created["error"] == "SandboxUnavailableError", created
        assert (
            "session agent" in created["message"]
            and "python -m jupyter_tai_sandbox.agent" in created["message"]
        )
        assert created["message"] != "Internal Server Error"

        app = sandbox_app(jp_serverapp)
        seen: list[logging.LogRecord] = []
        keep = _logged(app, seen)
        try:
            problem = await app.report_provider_problem()
        finally:
            app.log.removeHandler(keep)
        assert problem is not None and "python -m jupyter_tai_sandbox.agent" in problem
        errors = [r.getMessage() for r in seen if r.levelno >= logging.ERROR]
        assert any("docker provider cannot create sessions" in m and "session agent" in m for m in errors), (
            errors
        )


class TestConfiguredImageMissing:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("docker", tmp_path / "sandboxes", DockerSandbox={"image": MISSING_IMAGE})

    async def test_status_and_create_say_the_configured_image_is_missing_with_the_fix(
        self, jp_fetch, jp_serverapp
    ):
        status, body = await call(jp_fetch, "status")
        assert status == 503, body
        assert body["error"] == "SandboxUnavailableError"
        assert MISSING_IMAGE in body["message"] and "DockerSandbox.image" in body["message"], body
        assert "docker load" in body["message"] or "build-image" in body["message"], body

        status, created = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
        assert status == 503, created
        assert created["error"] == "SandboxUnavailableError"
        assert MISSING_IMAGE in created["message"] and "DockerSandbox.image" in created["message"], created

        problem = await sandbox_app(jp_serverapp).report_provider_problem()
        assert problem is not None and MISSING_IMAGE in problem


class TestWorkingProvider:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config("docker", tmp_path / "sandboxes")

    async def test_a_provider_that_can_work_reports_no_problem(self, jp_fetch, jp_serverapp):
        status, body = await call(jp_fetch, "status")
        assert status == 200 and body["kind"] == "docker", body
        assert await sandbox_app(jp_serverapp).report_provider_problem() is None


class TestEngineUnreachable:
    @pytest.fixture
    def jp_server_config(self, tmp_path):
        return server_config(
            "docker",
            tmp_path / "sandboxes",
            DockerSandbox={"base_url": "unix:///tmp/no-engine-here.sock", "engine_timeout_seconds": 2.0},
        )

    async def test_a_create_and_the_start_log_say_the_engine_cannot_be_reached(self, jp_fetch, jp_serverapp):
        status, created = await call(jp_fetch, "sessions", method="POST", body={"ttl_seconds": 60})
        assert status == 503 and created["error"] == "SandboxUnavailableError", created
        assert "no-engine-here.sock" in created["message"], created
        problem = await sandbox_app(jp_serverapp).report_provider_problem()
        assert problem is not None and "no-engine-here.sock" in problem


def test_the_status_check_does_not_keep_the_warm_pool_from_filling():
    """The start's and the status route's check connect the engine first: the pool still fills, so the first
    create takes a warm container."""
    import asyncio

    from jupyter_tai_sandbox.contract import SessionSpec
    from tests.support.server import make_provider

    async def main():
        sandbox = make_provider("docker", None, pool_size=1)
        try:
            await sandbox.check_available()  # connects the engine (a ping), as the server's start does
            await sandbox.list()
            for _ in range(300):
                if sandbox._pool._ready:
                    break
                await asyncio.sleep(0.05)
            assert sandbox._pool._ready, "the warm pool never filled"
            session = await sandbox.create(SessionSpec())
            try:
                assert session.record is not None, "the first session was not taken from the pool"
            finally:
                await session.destroy()
        finally:
            await sandbox.close()

    asyncio.run(main())
