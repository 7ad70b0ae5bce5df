"""%%sandbox / %sandbox against a real `jupyter server` subprocess and real kernels it starts.

The server and kernels come from tests/support/live_server.py. Kernels are started through the server's REST API,
exactly as JupyterLab starts them, so they find the sandbox API through the
environment the extension exports (no setup in the kernel).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import time
from pathlib import Path

import pytest

from tests.support.live_server import (
    LiveServer,
    docker_kernel,
    free_port,
    local_server,
    magics_kernel,
    proc_gone,
)

pytestmark = [pytest.mark.slow(55)]

# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from local_server(tmp_path_factory, "magics-server")


@pytest.fixture(scope="module")
def kernel(server):
    yield from magics_kernel(server)


@pytest.fixture
def fresh_kernel(server):
    yield from magics_kernel(server)


# ---------------------------------------------------------------- streaming, interrupt


def test_kernel_started_by_the_server_finds_it_without_setup(server, kernel):
    run = kernel.ok("import os; print(os.environ['TAI_SANDBOX_URL'], os.environ['TAI_SANDBOX_TOKEN'] != '')")
    assert run.stdout.split() == [server.url, "True"]
    status = kernel.ok("%sandbox status").stdout
    assert f"server    {server.url}" in status and "(found via TAI_SANDBOX_URL)" in status
    assert "provider  local" in status


def test_image_on_the_local_provider_warns_that_it_has_no_effect(kernel):
    run = kernel.ok("%%sandbox --session img-local --image python:3.12\necho ran")
    assert run.stdout == "ran\n"
    assert "--image python:3.12 has no effect on the local provider" in run.stderr, run.stderr
    assert "has no effect" not in kernel.ok("%%sandbox --session img-local\necho again").stderr  # said once
    kernel.ok("%sandbox rm img-local")


def test_output_arrives_live_one_line_a_second(kernel):
    run = kernel.ok("%%sandbox\nfor i in 1 2 3 4; do echo line $i; sleep 1; done\necho done >&2; exit 3")
    arrivals = {}
    for t, name, text in run.streams:
        for line in text.splitlines():
            arrivals.setdefault((name, line), t)
    firsts = [arrivals[("stdout", f"line {i}")] for i in range(1, 5)]
    # each line shows about a second after the previous one, and the first long before the end
    assert firsts[0] < 1.5, firsts
    assert firsts[0] < run.finished - 2.5, (firsts, run.finished)
    for earlier, later in itertools.pairwise(firsts):
        assert 0.5 < later - earlier < 2.0, firsts
    assert arrivals[("stderr", "done")] >= firsts[-1]
    assert "sandbox: exit status 3" in run.stderr
    assert "line" not in run.stderr and "done" not in run.stdout


def test_interrupt_kills_the_remote_command(fresh_kernel, server):
    cell = '%%sandbox\necho "shell $$"; sleep 300 & echo "child $!"; echo ready; wait; echo never'
    run = fresh_kernel.run(cell, timeout=30, interrupt_when="ready")
    assert run.finished - run.interrupted_at < 5  # type: ignore[attr-defined]
    assert run.errors and run.errors[0]["ename"] == "SandboxInterrupted"
    line = run.error_line()
    assert line.startswith("KeyboardInterrupt: the command was killed in session 'default'"), line
    assert "never" not in run.stdout
    pids = [int(m) for m in re.findall(r"(?:shell|child) (\d+)", run.stdout)]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(proc_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(proc_gone(p) for p in pids), [
        Path(f"/proc/{p}/cmdline").read_bytes() for p in pids if not proc_gone(p)
    ]
    assert fresh_kernel.ok("print(6 * 7)").stdout == "42\n"  # the kernel carries on
    assert fresh_kernel.ok("%%sandbox\necho again").stdout == "again\n"


# ---------------------------------------------------------------- options


def test_interpreter_env_and_python_unbuffered(kernel):
    run = kernel.ok(
        '%%sandbox python3 --env GREETING=hello --env "PAIR=a=b"\n'
        'import os, sys\nprint(sys.version_info[0], os.environ["GREETING"], os.environ["PAIR"])'
    )
    assert run.stdout == "3 hello a=b\n"
    run = kernel.ok("%%sandbox 'sh -e'\necho one\nfalse\necho two")
    assert run.stdout == "one\n" and "exit status 1" in run.stderr


def test_in_hands_values_over_and_out_err_capture(kernel):
    kernel.ok("data = {'xs': [1, 2, 3]}\nodd = {1, 2, frozenset({3})}")
    run = kernel.ok(
        "%%sandbox python3 --in data --in odd --out captured --err complaints\n"
        "import json, os, pickle\n"
        "assert os.environ['data'].endswith('.json') and os.environ['odd'].endswith('.pkl')\n"
        "print(sum(json.load(open(os.environ['data']))['xs']))\n"
        "print(sorted(map(str, pickle.load(open(os.environ['odd'], 'rb')))))\n"
        "print('warning', file=__import__('sys').stderr)"
    )
    assert run.stdout == "" and run.stderr == ""  # captured, not printed
    shown = kernel.ok("print(repr(captured)); print(repr(complaints))").stdout
    assert shown == "\"6\\n['1', '2', 'frozenset({3})']\\n\"\n'warning\\n'\n"
    run = kernel.ok('%%sandbox --in data\ncat "$data"')
    assert json.loads(run.stdout) == {"xs": [1, 2, 3]}


def test_raise_and_timeout(kernel):
    run = kernel.run("%%sandbox --raise\necho partial; exit 4")
    assert run.stdout == "partial\n"
    assert run.errors[0]["ename"] == "SandboxCommandError"
    assert "exited with status 4" in run.error_line()
    assert kernel.ok("1 + 1").displays  # the kernel survived

    start = time.monotonic()
    run = kernel.ok("%%sandbox --timeout 1\necho started; sleep 30; echo never")
    assert time.monotonic() - start < 6
    assert run.stdout == "started\n"
    assert "deadline" in run.stderr and "--timeout" in run.stderr
    run = kernel.run("%%sandbox --timeout 1 --raise\nsleep 30")
    assert "killed at its deadline" in run.error_line()


def test_outputs_folder_is_displayed_with_mime_types(kernel):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    run = kernel.ok(
        "%%sandbox python3\n"
        "import base64, os\n"
        "os.makedirs('outputs/sub', exist_ok=True)\n"
        f"open('outputs/dot.png', 'wb').write(base64.b64decode('{png}'))\n"
        "open('outputs/photo.jpg', 'wb').write(b'\\xff\\xd8\\xff\\xe0fakejpeg')\n"
        "open('outputs/chart.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"4\" height=\"4\"/>')\n"
        "open('outputs/table.html', 'w').write('<table><tr><td>1</td></tr></table>')\n"
        "open('outputs/sub/data.json', 'w').write('{\"k\": [1, 2]}')\n"
        "open('outputs/notes.md', 'w').write('# Title')\n"
        "open('outputs/ignored.txt', 'w').write('plain text is not displayed')\n"
    )
    shown = {d["metadata"]["sandbox_path"]: d["data"] for d in run.displays}
    assert set(shown) == {
        "outputs/dot.png",
        "outputs/photo.jpg",
        "outputs/chart.svg",
        "outputs/table.html",
        "outputs/sub/data.json",
        "outputs/notes.md",
    }
    assert shown["outputs/dot.png"]["image/png"] == png
    assert "image/jpeg" in shown["outputs/photo.jpg"]
    # sandbox-written SVG, HTML and Markdown are shown inert (tests/magics/test_magics_outputs.py has the details)
    svg = shown["outputs/chart.svg"]
    assert set(svg) == {"text/html", "text/plain"} and svg["text/html"].startswith(
        '<img src="data:image/svg+xml;base64,'
    )
    assert '<iframe sandbox="" ' in shown["outputs/table.html"]["text/html"]
    assert "&lt;table&gt;" in shown["outputs/table.html"]["text/html"]
    assert shown["outputs/sub/data.json"]["application/json"] == {"k": [1, 2]}
    assert shown["outputs/notes.md"] == {"text/plain": "# Title"}
    # only new or changed files show: an unchanged folder shows nothing the next time
    assert kernel.ok("%%sandbox\necho quiet").displays == []
    run = kernel.ok("%%sandbox\nsleep 1; echo '# Changed' > outputs/notes.md")
    assert [d["data"]["text/plain"] for d in run.displays] == ["# Changed\n"]
    run = kernel.ok("%%sandbox --trusted-outputs\nsleep 1; echo '# Trusted' > outputs/notes.md")
    assert [d["data"]["text/markdown"] for d in run.displays] == ["# Trusted\n"]


def test_named_sessions_persistent_workspaces_and_line_magics(kernel, server, tmp_path):
    key = f"magics-{secrets.token_hex(3)}"
    kernel.ok("%%sandbox --session alpha\necho kept > alpha.txt")
    assert kernel.ok("%%sandbox --session alpha\ncat alpha.txt").stdout == "kept\n"
    assert (
        "No such file" in kernel.ok("%%sandbox\ncat alpha.txt").stderr
    )  # the default session is another one

    run = kernel.ok(f"%sandbox new notes --persistent {key} --timeout 5")
    assert "session 'notes' started" in run.stdout
    kernel.ok("%%sandbox\necho first >> notes.txt")  # new made it current
    status = kernel.ok("%sandbox status").stdout
    assert "session   notes" in status and f"workspace '{key}'" in status
    listing = kernel.ok("%sandbox sessions").stdout
    assert re.search(r"^notes \*\s", listing, re.M) and re.search(r"^alpha\s", listing, re.M)
    assert key in listing
    assert "removed" in kernel.ok("%sandbox rm notes").stdout
    kernel.ok(f"%sandbox new notes2 --persistent {key}")
    assert kernel.ok("%%sandbox\ncat notes.txt").stdout == "first\n"  # the workspace outlived its session
    # the session default timeout set with `new ... --timeout` applies (5 s there, none here)
    kernel.ok("%sandbox use notes2")
    kernel.ok("%sandbox rm notes2 --workspace")
    assert "session   default" in kernel.ok("%sandbox status").stdout  # rm of the current falls back

    # cell options apply when a session starts: same options, same session
    kernel.ok(f"%%sandbox --persistent {key}-b\necho one > f")
    assert kernel.ok(f"%%sandbox --persistent {key}-b\ncat f").stdout == "one\n"
    listing = kernel.ok("%sandbox sessions").stdout
    assert f"default(persistent={key}-b)" in listing
    kernel.ok(f"%sandbox rm 'default(persistent={key}-b)' --workspace")

    # use adopts a server session by id
    sid = server.request("POST", "api/sandbox/sessions", {"ttl_seconds": 60})["id"]
    kernel.ok(f"%sandbox use {sid}")
    assert kernel.ok("%%sandbox\necho adopted").stdout == "adopted\n"
    kernel.ok(f"%sandbox rm {sid}")
    assert sid not in server.session_ids()
    kernel.ok("%sandbox use default")
    kernel.ok("%sandbox rm alpha")


def test_put_and_get(kernel, tmp_path):
    local = tmp_path / "in.csv"
    local.write_text("b,2\na,1\n")
    assert "(8 bytes)" in kernel.ok(f"%sandbox put {local} data/in.csv").stdout
    kernel.ok("%%sandbox\nsort data/in.csv > data/sorted.csv")
    back = tmp_path / "sorted.csv"
    kernel.ok(f"%sandbox get data/sorted.csv {back}")
    assert back.read_text() == "a,1\nb,2\n"
    kernel.ok(f"%sandbox put {local} data/")  # a folder target keeps the name
    kernel.ok(f"%sandbox get data/in.csv {tmp_path}")  # a folder target keeps the name
    assert (tmp_path / "in.csv").read_text() == "b,2\na,1\n"
    assert kernel.ok("%%sandbox\nls data").stdout.split() == ["in.csv", "sorted.csv"]


def test_usage(kernel):
    reply = kernel.ok("%sandbox?").reply
    page = reply["payload"][0]["data"]["text/plain"]
    for text in (
        "--session",
        "--persistent",
        "--in",
        "--out",
        "--raise",
        "put LOCAL [REMOTE]",
        "get REMOTE [LOCAL]",
        "connect URL",
        "rm NAME",
    ):
        assert text in page, text


# ---------------------------------------------------------------- bad input


BAD_INPUT = [
    ("%%sandbox --bogus\necho hi", "unrecognized arguments: --bogus"),
    ("%%sandbox --netwrok none\necho hi", "unrecognized arguments: --netwrok (did you mean --network?)"),
    (
        "%%sandbox --sesion x --timout 3\necho hi",
        "did you mean: --sesion -> --session, --timout -> --timeout?",
    ),
    ("%sandbox new x --persistant k", "unrecognized arguments: --persistant k (did you mean --persistent?)"),
    ("%sandbox rm x --workspcae", "(did you mean --workspace?)"),
    ("%sandbox stauts", "unknown subcommand 'stauts': did you mean status?"),
    ("%%sandbox --session\necho hi", "argument --session: expected one argument"),
    ("%sandbox use", "the following arguments are required: NAME"),
    ("%sandbox use no-such-session", "no session named 'no-such-session'"),
    ("%sandbox rm no-such-session", "no session named 'no-such-session'"),
    ("%sandbox new", "the following arguments are required: NAME"),
    ("%sandbox frobnicate", "unknown subcommand 'frobnicate'"),
    ("%sandbox put /no/such/file.csv", "no local file '/no/such/file.csv'"),
    ("%sandbox get ../../etc/passwd", "leads outside the workspace"),
    ("%sandbox get /etc/passwd", "is outside the workspace"),
    ("%sandbox put /etc/hostname /etc/hostname", "is outside the workspace"),
    ("%sandbox get no-such-file.txt", "no file 'no-such-file.txt'"),
    ("%%sandbox --memory lots\necho hi", "--memory takes MiB"),
    ("%%sandbox --timeout -1\necho hi", "argument --timeout: '-1' is not a duration of more than 0 seconds"),
    ("%%sandbox --in undefined_variable\necho hi", "no variable 'undefined_variable'"),
    ("%%sandbox --env NOEQUALS\necho hi", "--env takes NAME=VALUE"),
    ("%%sandbox --network none\necho hi", "cannot honour network='none'"),
    ("%%sandbox --memory 64\necho hi", "cannot enforce cpu/memory_mb caps"),
    ("%%sandbox --persistent 'bad key!'\necho hi", "invalid workspace_key"),
    ("%sandbox connect not-a-url", "connect takes the server's http(s) URL"),
]


def test_bad_input_gives_one_line_and_leaks_nothing(kernel, server):
    kernel.ok("%%sandbox\necho warm")  # the default session exists; nothing else may appear
    before = server.session_ids()
    for code, expected in BAD_INPUT:
        run = kernel.run(code)
        line = run.error_line()
        assert expected in line, (code, line)
        assert line.startswith("sandbox: "), line
        assert server.session_ids() == before, code
    assert kernel.ok("print('alive')").stdout == "alive\n"
    assert kernel.ok("%%sandbox\necho still working").stdout == "still working\n"


def test_dead_server_then_connect(fresh_kernel, server):
    dead = f"http://127.0.0.1:{free_port()}/"
    fresh_kernel.ok(f"import os; os.environ['TAI_SANDBOX_URL'] = {dead!r}")
    before = server.session_ids()
    line = fresh_kernel.run("%%sandbox\necho hi").error_line()
    assert line.startswith(f"sandbox: cannot reach the sandbox API at {dead}"), line
    line = fresh_kernel.run(f"%sandbox connect {dead}").error_line()
    assert "cannot reach the sandbox API" in line
    run = fresh_kernel.ok(f"%sandbox connect {server.url} --token {server.token}")
    assert "provider local" in run.stdout
    assert fresh_kernel.ok("%%sandbox\necho connected").stdout == "connected\n"
    assert "(found via %sandbox connect)" in fresh_kernel.ok("%sandbox status").stdout
    assert len(server.session_ids() - before) == 1


def test_provider_off_prints_the_setting_to_change(tmp_path):
    off = LiveServer(tmp_path, args=("--SandboxApp.provider=off",)).start()
    try:
        k = off.start_kernel()
        try:
            k.ok("%load_ext jupyter_tai_sandbox")
            line = k.run("%%sandbox\necho hi").error_line()
            assert (
                line.startswith("sandbox: no sandbox provider is installed") and "TAI_MCP_SANDBOX" in line
            ), line
            assert "provider  off" in k.ok("%sandbox status").stdout
            assert "TAI_MCP_SANDBOX" in k.run("%sandbox sessions").error_line()
            assert k.ok("print('alive')").stdout == "alive\n"
        finally:
            k.shutdown()
    finally:
        off.stop()


def test_kernel_exit_destroys_its_sessions(server):
    k = server.start_kernel()
    k.ok("%load_ext jupyter_tai_sandbox")
    before = server.session_ids()
    k.ok("%%sandbox\necho one")
    k.ok("%%sandbox --session other\necho two")
    mine = server.session_ids() - before
    assert len(mine) == 2
    k.shutdown()
    deadline = time.monotonic() + 15
    while mine & server.session_ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not mine & server.session_ids()


def test_export_env_reaches_the_servers_kernels_not_the_process_environment(monkeypatch):
    """The server's URL and token go to the kernels its kernel manager starts; os.environ (which
    another server in the process would share) is left alone, and the stop takes the hook back."""
    import asyncio

    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from jupyter_tai_sandbox.app import SandboxApp

    class Server:  # the two attributes export_server_env reads of a ServerApp, and a real kernel manager
        connection_url = "http://127.0.0.1:1234/base/"
        kernel_manager = AsyncMappingKernelManager()

        class identity_provider:
            token = "secret"

    monkeypatch.setenv("TAI_SANDBOX_URL", "http://before/")
    monkeypatch.delenv("TAI_SANDBOX_TOKEN", raising=False)
    app = SandboxApp()
    app.export_server_env(Server())
    assert os.environ["TAI_SANDBOX_URL"] == "http://before/" and "TAI_SANDBOX_TOKEN" not in os.environ

    async def kernel_environ() -> dict[str, str]:
        manager = Server.kernel_manager
        kernel_id = await manager.start_kernel(kernel_name="python3")
        try:
            pid = manager.get_kernel(kernel_id).provisioner.process.pid
            with open(f"/proc/{pid}/environ", "rb") as f:
                pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
            return {k.decode(): v.decode() for k, v in pairs}
        finally:
            await manager.shutdown_kernel(kernel_id, now=True)

    environ = asyncio.run(kernel_environ())
    assert (environ["TAI_SANDBOX_URL"], environ["TAI_SANDBOX_TOKEN"]) == (
        "http://127.0.0.1:1234/base/",
        "secret",
    )
    app._reaper = None
    app.sandbox = None
    asyncio.run(app.stop_extension())
    assert "start_kernel" not in vars(Server.kernel_manager)
    assert os.environ["TAI_SANDBOX_URL"] == "http://before/"
    assert "TAI_SANDBOX_TOKEN" not in os.environ


def test_interrupt_kills_the_command_in_a_docker_session(tmp_path):
    with docker_kernel(tmp_path) as k:
        run = k.run("%%sandbox\nsleep 300 & echo ready; wait", timeout=60, interrupt_when="ready")
        assert run.finished - run.interrupted_at < 5  # type: ignore[attr-defined]
        assert run.errors and run.errors[0]["ename"] == "SandboxInterrupted"
        left = k.ok("%%sandbox\nps -o pid,args | grep '[s]leep 300' || echo none left").stdout
        assert left == "none left\n"


def test_a_program_missing_from_the_image_names_the_image_that_has_it(tmp_path):
    from jupyter_tai_sandbox.images import PYTHON_IMAGE
    from tests.support.docker import TEST_IMAGE

    with docker_kernel(tmp_path) as k:
        # the session agent refuses to start an absent program (no exit status is invented): the cell's
        # error names it, and the image that has it
        run = k.run("%%sandbox python3\nprint('never')", timeout=60)
        error = " ".join(str(e.get("evalue", "")) for e in run.errors)
        assert "cannot run 'python3': no such program in the session" in error, run.errors
        assert (
            f"python3 is not in the session's image {TEST_IMAGE}; {PYTHON_IMAGE} has it: "
            "build it with `jupyter tai-sandbox build-image --python`"
        ) in error, run.errors
        # a program run from the body's shell is found in its "not found" line too
        run = k.run("%%sandbox\nno-such-tool --version", timeout=60)
        assert f"sandbox: no-such-tool is not in the session's image {TEST_IMAGE}" in run.stderr, run.stderr
        # any other non-zero status gets no hint
        run = k.run("%%sandbox\nexit 3", timeout=60)
        assert run.stderr.strip().splitlines()[-1] == "sandbox: exit status 3", run.stderr
