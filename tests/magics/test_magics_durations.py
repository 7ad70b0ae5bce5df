"""`--ttl` and `--timeout` take durations with units, as `%sandbox extend` does: one parser for all three."""

from __future__ import annotations

import time

import pytest

from jupyter_tai_sandbox.magics.options import DEFAULT_TTL
from tests.support.live_server import local_server, magics_kernel


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from local_server(tmp_path_factory, "durations-server")


@pytest.fixture(scope="module")
def kernel(server):
    yield from magics_kernel(server)


def ttl_of(server, kernel, name: str) -> float:
    listing = kernel.ok("%sandbox sessions").stdout
    sid = next(
        word
        for line in listing.splitlines()
        if line.split()[:1] == [name]
        for word in line.split()
        if word.startswith("sbx-")
    )
    info = server.request("GET", f"api/sandbox/sessions/{sid}?usage=0")
    return info["expires_at"] - info["created_at"]


def test_sandbox_new_ttl_takes_units_like_extend(kernel, server):
    kernel.ok("%sandbox new brief --ttl 5s")
    assert ttl_of(server, kernel, "brief") == pytest.approx(5, abs=0.01)
    kernel.ok("%sandbox new longer --ttl 1h30m")
    assert ttl_of(server, kernel, "longer") == pytest.approx(5400, abs=0.01)
    kernel.ok("%sandbox extend longer 30m")
    assert ttl_of(server, kernel, "longer") == pytest.approx(7200, abs=0.01)
    kernel.ok("%sandbox new plain --ttl 90")  # a bare number is seconds
    assert ttl_of(server, kernel, "plain") == pytest.approx(90, abs=0.01)
    kernel.ok("%sandbox new default")
    assert ttl_of(server, kernel, "default") == pytest.approx(DEFAULT_TTL, abs=0.01) == 8 * 3600
    for name in ("brief", "longer", "plain", "default"):
        kernel.ok(f"%sandbox rm {name}")


def test_a_cell_timeout_takes_units(kernel):
    start = time.monotonic()
    run = kernel.ok("%%sandbox --timeout 1.5s\necho started; sleep 30; echo never")
    assert time.monotonic() - start < 8
    assert run.stdout == "started\n" and "deadline" in run.stderr


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("%sandbox new x --ttl 5x", ["argument --ttl: '5x' is not a duration: give seconds", "1h30m"]),
        ("%%sandbox --timeout soon\necho never", ["argument --timeout: 'soon' is not a duration"]),
        ("%sandbox new x --ttl 30m1h", ["argument --ttl: '30m1h' gives its units out of order or twice"]),
        ("%sandbox new x --ttl 0", ["argument --ttl: '0' is not a duration of more than 0 seconds"]),
        ("%sandbox extend x soon", ["argument DURATION: 'soon' is not a duration", "1h30m"]),
    ],
)
def test_a_bad_duration_says_what_was_typed_and_the_forms(kernel, line, words):
    run = kernel.run(line)
    shown = run.error_line()
    assert all(word in shown for word in words), shown
    assert "never" not in run.stdout
