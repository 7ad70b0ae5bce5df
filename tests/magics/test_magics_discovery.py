"""With several Jupyter servers running, the magics use the one started first, and say so.

A real server and kernel; the second "server" is an info file in the kernel's
runtime folder for a live process (the kernel itself) at a port nobody answers,
so using it would fail visibly.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.support.live_server import LiveServer, free_port, local_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from local_server(tmp_path_factory, "discovery-server")


def kernel_with_two_servers(server: LiveServer, runtime, real_first: bool):
    """A kernel that must discover the server itself, its runtime folder listing two running servers."""
    runtime.mkdir()
    [info_file] = server.runtime.glob("jpserver-*.json")
    info = json.loads(info_file.read_text())
    k = server.start_kernel()
    kernel_pid = int(k.ok("import os; print(os.getpid())").stdout)
    fake_url = f"http://127.0.0.1:{free_port()}/"
    fake = {**info, "url": fake_url, "port": 1, "pid": kernel_pid, "token": "fake"}
    now = time.time()
    for data, started in ((info, now - 60 if real_first else now), (fake, now if real_first else now - 60)):
        path = runtime / f"jpserver-{data['pid']}.json"
        path.write_text(json.dumps(data))
        os.utime(path, (started, started))
    k.ok(
        "import os\nos.environ.pop('TAI_SANDBOX_URL')\nos.environ.pop('TAI_SANDBOX_TOKEN', None)\n"
        f"os.environ['JUPYTER_RUNTIME_DIR'] = {str(runtime)!r}"
    )
    k.ok("%load_ext jupyter_tai_sandbox")
    return k, info, fake_url


def test_the_server_started_first_is_used_and_named(server, tmp_path):
    k, info, fake_url = kernel_with_two_servers(server, tmp_path / "runtime", real_first=True)
    try:
        run = k.ok("%sandbox status")
        assert f"server    {server.url}" in run.stdout
        assert "(found via the first started of several running Jupyter servers)" in run.stdout
        assert run.stderr == (
            f"sandbox: 2 Jupyter servers are running; using the one started first, {server.url} "
            f"(pid {info['pid']}), not {fake_url}: set TAI_SANDBOX_URL (and TAI_SANDBOX_TOKEN) or pass url= to choose\n"
        )
        run = k.ok("%%sandbox\necho hi")  # said once: later cells use the same server quietly
        assert (run.stdout, run.stderr) == ("hi\n", "")
    finally:
        k.shutdown()


def test_the_choice_follows_start_order_not_listing_order(server, tmp_path):
    k, _, fake_url = kernel_with_two_servers(server, tmp_path / "runtime", real_first=False)
    try:
        run = k.run("%sandbox status")
        assert f"using the one started first, {fake_url}" in run.stderr
        assert run.error_line().startswith(f"sandbox: cannot reach the sandbox API at {fake_url}")
    finally:
        k.shutdown()
