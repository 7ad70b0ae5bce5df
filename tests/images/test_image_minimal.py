"""The minimal image's wget: it works without -T (Debian's static busybox segfaults with -T; see providers/docker/images/build.py)."""

from __future__ import annotations

import secrets

import pytest

from jupyter_tai_sandbox.providers.docker.images.build import build_minimal_image

pytestmark = [pytest.mark.docker]


def test_wget_in_an_image_built_now_works_as_documented():
    from tests.support.docker import docker_client

    client = docker_client()
    name = f"jupyter-tai-sandbox/minimal:test-{secrets.token_hex(4)}"
    build_minimal_image(name)
    try:
        script = (
            "echo hi > /tmp/page; httpd -p 127.0.0.1:8080 -h /tmp; "
            "wget -q -O- http://127.0.0.1:8080/page; "  # an address
            "timeout 5 wget -q -O- http://web:8080/page; "  # a name (/etc/hosts), bounded as the docstring says
            "wget -q -T 5 -O- http://127.0.0.1:8080/page; echo status $?"  # the known crash, pinned
        )
        out = client.containers.run(name, ["sh", "-c", script], remove=True, extra_hosts={"web": "127.0.0.1"})
        assert out == b"hi\nhi\nstatus 139\n", out
    finally:
        client.images.remove(name, force=True)
