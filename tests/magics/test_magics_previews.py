"""``%sandbox ports NAME`` and ``%sandbox open NAME PORT [PATH]``: a session's listening ports and a link to
a port's web preview (no token in it), in a kernel of a live docker server (network ``none``)."""

from __future__ import annotations

import time

import pytest

from jupyter_tai_sandbox.images import PYTHON_IMAGE
from tests.support.live_server import LiveServer

pytestmark = [pytest.mark.docker, pytest.mark.slow(30)]


def test_ports_lists_a_web_server_and_open_links_its_preview_without_the_token(tmp_path):
    from tests.support.docker import python_image, server_args

    python_image().close()
    live = LiveServer(tmp_path, args=server_args(PYTHON_IMAGE)).start()
    try:
        k = live.start_kernel()
        try:
            k.ok("%load_ext jupyter_tai_sandbox")
            k.ok("%sandbox new web --network none")
            assert "nothing listens on a TCP port in session 'web'" in k.ok("%sandbox ports web").stdout
            k.ok("%%sandbox --session web\nsetsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &")
            give_up = time.monotonic() + 30
            while "8000" not in (listed := k.ok("%sandbox ports web").stdout) and time.monotonic() < give_up:
                time.sleep(0.3)
            sid = next(s["id"] for s in live.call("GET", "sessions")[1]["sessions"])
            path = f"/api/sandbox/sessions/{sid}/ports/8000/"
            assert listed.splitlines()[0].split() == ["PORT", "ADDRESS", "PREVIEW"], listed
            assert listed.splitlines()[1].split() == ["8000", "0.0.0.0", path], listed

            run = k.ok("%sandbox open web 8000 /index.html?x=1")
            assert run.stderr == "" and len(run.displays) == 1, (run.stderr, run.displays)
            data = run.displays[0]["data"]
            assert data["text/plain"] == path + "index.html?x=1"
            assert f'href="{path}index.html?x=1"' in data["text/html"] and "<iframe" not in data["text/html"]
            token = live.token
            assert token and token not in str(run.displays) and "token" not in str(run.displays)

            framed = k.ok("%sandbox open web 8000 --iframe --height 300")
            assert (
                len(framed.displays) == 2
                and f'<iframe src="{path}"' in framed.displays[1]["data"]["text/html"]
            )
            assert 'height="300"' in framed.displays[1]["data"]["text/html"]

            quiet = k.ok("%sandbox open web 9")
            assert "nothing listens on port 9 in session 'web' yet" in quiet.stderr, quiet.stderr
            assert "PORT" in k.run("%sandbox open web 70000").error_line()
            assert "no session named 'nope'" in k.run("%sandbox ports nope").error_line()
        finally:
            k.shutdown()
    finally:
        live.stop()
