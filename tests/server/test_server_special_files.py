"""A FIFO or socket that session code plants in its workspace is refused at once with a typed 400 on every
download path: the REST file route, the provider's get_file and iter_file (what the drive and MCP read_file
use). Issue 50, finding 6: a FIFO's download on docker waited for a writer and never answered."""

import asyncio
import time

import pytest

from tests.support.server import call, sandbox_app, server_config

#: session code plants both (busybox and coreutils have mkfifo; a unix socket needs a listener: nc -lU, or python)
PLANT = "mkfifo pipe && (nc -lU sock >/dev/null 2>&1 & python3 -c 'import socket as s; s.socket(s.AF_UNIX).bind(\"sock\")' 2>/dev/null; sleep 1; true)"


@pytest.fixture
def jp_server_config(provider, tmp_path):
    return server_config(provider, tmp_path / "sandboxes")


async def test_a_planted_fifo_or_socket_is_refused_at_once_on_every_download_path(jp_fetch, jp_serverapp):
    _, session = await call(jp_fetch, "sessions", method="POST", body={})
    sid = session["id"]
    try:
        status, ran = await call(
            jp_fetch,
            "sessions",
            sid,
            "exec",
            method="POST",
            body={"argv": ["sh", "-c", PLANT], "timeout_seconds": 20},
        )
        assert status == 200 and ran["exit_code"] == 0, ran
        _, listing = await call(jp_fetch, "sessions", sid, "files")
        planted = {entry["name"] for entry in listing["entries"]} & {"pipe", "sock"}
        assert "pipe" in planted, listing
        gated = await sandbox_app(jp_serverapp).sandbox.get(sid)
        for name in sorted(planted):
            started = time.monotonic()
            status, body = await call(jp_fetch, "sessions", sid, "files", name, request_timeout=20)
            assert (status, body["error"]) == (400, "SandboxPathError"), body
            assert "not a regular file" in body["message"], body
            for read in (gated.get_file(name), _drained(gated.iter_file(name))):
                with pytest.raises(Exception, match="not a regular file"):
                    await asyncio.wait_for(read, 10)
            assert time.monotonic() - started < 10, (
                f"{name}: refused after {time.monotonic() - started:.1f} s"
            )
    finally:
        await call(jp_fetch, "sessions", sid, method="DELETE")


async def _drained(chunks):
    async for _ in chunks:
        pass
