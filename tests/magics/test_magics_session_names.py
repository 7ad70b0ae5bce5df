"""Issue 48: a session the magics start carries its name (and its notebook, when the kernel serves one) in its
consumer label, under the caller's own, so the panel shows it by name; unless the operator grants the caller's
own label credentials, which go by exact label: then the session keeps that label and its credentials.

A real ``jupyter server`` on the local provider and real kernels it starts (tests/support/live_server.py).
"""

from __future__ import annotations

import getpass
import json
import urllib.parse

import pytest

from jupyter_tai_sandbox.contract.values import MAX_CONSUMER_CHARS
from jupyter_tai_sandbox.magics.named_sessions import magics_label
from tests.support.live_server import LOCAL_ARGS, LiveServer, magics_kernel

pytestmark = [pytest.mark.slow(20)]


def _server(tmp_path, *extra: str, env: dict[str, str] | None = None) -> LiveServer:
    return LiveServer(
        tmp_path, env=env, args=(*LOCAL_ARGS, f"--LocalSandbox.root={tmp_path / 'sandboxes'}", *extra)
    ).start()


def _sessions(server: LiveServer) -> list[dict]:
    return server.request("GET", "api/sandbox/sessions")["sessions"]


def test_a_magics_session_lists_with_its_name_under_the_callers_label(tmp_path):
    server = _server(tmp_path)
    try:
        own = server.request("GET", "api/sandbox/status")["consumer"]
        kernel = next(magics_kernel(server))
        try:
            kernel.ok("%sandbox new train")
            kernel.ok("%%sandbox --session scratch\necho scratch")
            consumers = sorted(s["consumer"] for s in _sessions(server))
        finally:
            kernel.shutdown()
        # a kernel started without a notebook (POST /api/kernels) has none to name
        assert consumers == [f"{own}/magics:scratch", f"{own}/magics:train"], consumers
    finally:
        server.stop()


def test_a_magics_session_keeps_the_callers_own_label_when_it_holds_credentials(tmp_path):
    own = f"user:{urllib.parse.quote(getpass.getuser(), safe='-._~@+')}"
    server = _server(
        tmp_path,
        f"--SandboxPolicy.credentials={json.dumps({own: ['TAI_TEST_NAMES_TOKEN']})}",
        env={"TAI_TEST_NAMES_TOKEN": "s3cret"},
    )
    try:
        assert server.request("GET", "api/sandbox/status")["consumer"] == own
        kernel = next(magics_kernel(server))
        try:
            run = kernel.ok("%%sandbox --session train\necho ${#TAI_TEST_NAMES_TOKEN}")
            [session] = _sessions(server)
        finally:
            kernel.shutdown()
        assert run.stdout == "6\n", run.streams  # the credential reached the session
        assert session["consumer"] == own, session
    finally:
        server.stop()


def test_the_label_leaves_out_a_notebook_path_over_the_contracts_length():
    assert magics_label("user:me", "a b", "work/n.ipynb") == "user:me/magics:a%20b@work%2Fn.ipynb"
    assert magics_label("user:me", "x", "d/" * 600 + "n.ipynb") == "user:me/magics:x"
    assert magics_label("user:me", "x" * MAX_CONSUMER_CHARS, None) is None
