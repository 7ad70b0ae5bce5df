"""An expected error is logged in one line (a 503 at warning, a 4xx at info), never as an uncaught exception
with a traceback and the request's headers; an unexpected one still is."""

from __future__ import annotations

import logging

import pytest

from tests.support.server import call, sandbox_app, server_config


@pytest.fixture
def jp_server_config(tmp_path):
    return server_config("off", tmp_path / "sandboxes")


@pytest.fixture
def records(jp_serverapp):
    """Every record the server's loggers emit while the test runs."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep(level=logging.DEBUG)
    loggers = {logging.getLogger(), logging.getLogger("tornado.application"), jp_serverapp.log,
               sandbox_app(jp_serverapp).log}  # fmt: skip
    for logger in loggers:
        logger.addHandler(keep)
    levels = {logger: logger.level for logger in loggers}
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
    try:
        yield seen
    finally:
        for logger in loggers:
            logger.removeHandler(keep)
            logger.setLevel(levels[logger])


async def test_an_expected_503_is_one_warning_line_without_traceback_or_headers(jp_fetch, records):
    status, reply = await call(jp_fetch, "sessions", headers={"User-Agent": "probe-agent"})
    assert status == 503 and reply["error"] == "SandboxUnavailableError"
    loud = [r for r in records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, [(r.levelname, r.getMessage()) for r in loud]
    (line,) = loud
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert "503 SandboxUnavailableError" in line.getMessage() and "/api/sandbox/sessions" in line.getMessage()
    assert not any("Uncaught exception" in r.getMessage() or "probe-agent" in r.getMessage() for r in records)
