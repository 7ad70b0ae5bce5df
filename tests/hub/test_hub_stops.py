"""A real JupyterHub stopped and its sandbox service killed, with sessions live: nothing of the deployment
outlives the hub (issue 50, point 4).

JupyterHub stops its managed services before users' servers: the service must destroy every session it
holds, refuse creates while it stops (a user's server's kernel restarter re-creates its kernel's session
right then), and a service the hub restarted after a SIGKILL must take the sessions made before the crash
as its own, so the next stop ends them too. While the service is down a user's server says so as a typed
plain-text 503, for a create and on its status route.

Each test starts the hub (examples/jupyterhub_config.py, as tests/hub/test_hub.py runs it) again in one
tmp dir (its database, tokens and users' homes are kept; its processes are not) and checks after every
stop that the engine holds no container, network, image, volume or host firewall rule of the deployment
(persistent workspace volumes stay: a workspace outlives its sessions by design) and that none of the run's
processes is left. It skips as test_hub.py does (fails under CI=true), and without the Python image.

One start, sessions and stop of the hub takes 15 to 25 s here, so the stop count is TAI_SANDBOX_HUB_STOPS,
default STOPS (about two minutes), alternating SIGINT and SIGTERM; the issue's 20 were run with
TAI_SANDBOX_HUB_STOPS=20 (5 1/2 to 8 1/2 min on a loaded 2-core machine, nothing left after any).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.hub import (
    Hub,
    deployment_leftovers,
    deployment_workspaces,
    engine_sessions,
    install_sandboxed_kernelspec,
    remove_hub,
    require_hub,
    require_python_image,
)

#: stops of the hub with sessions live (TAI_SANDBOX_HUB_STOPS overrides), alternating SIGINT and SIGTERM
STOPS = int(os.environ.get("TAI_SANDBOX_HUB_STOPS", "6"))
#: seconds from alice's server's kernel restarter starting to re-create its kernel's session to the hub's
#: stop: the re-create is under way at the service as its stop begins, or just made
RESTARTER_OFFSETS = (0.0, 0.4, 1.0)
RESTARTING = "AsyncIOLoopKernelRestarter: restarting kernel"
#: JupyterHub polls a managed service every 30 s (with 10 % jitter) and starts it again once it is gone
RESTART_WAIT = 60.0
KERNELSPEC = "tai-hub-kernel"

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow(240)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A hub dir with alice's and bob's tokens and alice's sandboxed kernelspec; the hub itself stopped."""
    require_hub()
    require_python_image()
    hub = Hub(tmp_path_factory.mktemp("hub-stops"))
    try:
        hub.start()
        for user in ("alice", "bob"):
            hub.token_for(user)
        assert install_sandboxed_kernelspec(hub, "alice") == KERNELSPEC
        hub.stop()
        yield hub
    finally:
        remove_hub(hub)


@pytest.fixture
def hub(prepared):
    """The prepared hub dir; whatever a test leaves running or on the engine goes at its end."""
    yield prepared
    remove_hub(prepared)


def _create(hub: Hub, user: str, *, direct: bool = False, **spec) -> str:
    """A session of ``user``'s, through their server or (``direct``) at the service with their token."""
    body = {"ttl_seconds": 600, **spec}
    if direct:
        status, info = hub.service("POST", "sessions", token=hub.tokens[user], body=body)
    else:
        status, info = hub.sandbox(user, "POST", "sessions", body=body)
    assert status == 201 and info["owner"] == user, info
    return info["id"]


def _start_kernel(hub: Hub) -> str:
    """A sandboxed kernel in alice's server: its session's id."""
    before = {s.id for s in engine_sessions(hub.deployment)}
    status, model = hub._call(
        "POST", f"{hub.url}/user/alice/api/kernels", hub.tokens["alice"], {"name": KERNELSPEC}
    )
    assert status == 201, model
    made = [s for s in engine_sessions(hub.deployment) if s.id not in before]
    assert len(made) == 1 and made[0].owner == "alice", made
    return made[0].id


def _start(hub: Hub) -> None:
    hub.start()
    hub.start_server("alice")


def _live_sessions(hub: Hub, kernel: bool) -> set[str]:
    """The hub started, alice's server up, and sessions live: hers through her server (one persistent), bob's
    at the service, and a sandboxed kernel in her server."""
    _start(hub)
    made = {
        _create(hub, "alice"),
        _create(hub, "alice", durability="persistent", workspace_key="alice-stops"),
        _create(hub, "bob", direct=True),
    }
    if kernel:
        made.add(_start_kernel(hub))
    assert made <= {s.id for s in engine_sessions(hub.deployment)}
    return made


def _stopped_leaving_nothing(hub: Hub, sig: signal.Signals, what: str, workspace: bool = True) -> None:
    code = hub.stop(sig)
    assert code is not None, f"the hub did not exit on {sig.name} ({what}):\n{hub.log_tail()}"
    assert hub.outlived == [], f"processes outlived the hub ({what}): {hub.outlived}"
    assert deployment_leftovers(hub.deployment) == [], f"{what}:\n{hub.log_tail()}"
    if workspace:  # alice's persistent workspace outlives its session, as the operators' page says
        assert "alice-stops" in deployment_workspaces(hub.deployment), what


@pytest.mark.timeout(120 + 45 * STOPS)
def test_every_stop_of_the_hub_destroys_every_session(hub):
    """Stopped by SIGINT and by SIGTERM with plain sessions and a sandboxed kernel live: nothing is left."""
    for stop in range(STOPS):
        sig = (signal.SIGINT, signal.SIGTERM)[stop % 2]
        _live_sessions(hub, kernel=True)
        _stopped_leaving_nothing(hub, sig, f"stop {stop + 1} of {STOPS}, by {sig.name}")


def test_a_service_killed_and_restarted_by_the_hub_stops_what_the_one_before_made(hub):
    """SIGKILL the service mid-run: while it is down alice's server answers a typed plain-text 503 for a
    create and on its status route; the hub starts it again; the next stop ends the sessions made before
    the crash as well as those made after."""
    before = _live_sessions(hub, kernel=True)
    killed = hub.service_pid()
    os.kill(killed, signal.SIGKILL)

    status, body = hub.sandbox("alice", "POST", "sessions", body={"ttl_seconds": 600})
    assert (status, body.get("error")) == (503, "SandboxUnavailableError"), body
    assert "<" not in body["message"], body
    status, body = hub.sandbox("alice", "GET", "status")
    assert (status, body.get("error")) == (503, "SandboxUnavailableError"), body
    assert "<" not in body["message"], body

    # the hub notices the dead service on its next poll and starts it again
    hub.wait_for(
        lambda: hub.service("GET", "sessions", token=hub.tokens["alice"])[0] == 200,
        "the service to be started again by the hub",
        timeout=RESTART_WAIT,
    )
    assert hub.service_pid() != killed
    hub.wait_for(lambda: hub.sandbox("alice", "GET", "status")[0] == 200, "alice's status to recover")
    after = {_create(hub, "alice"), _create(hub, "bob", direct=True)}
    assert before | after <= {s.id for s in engine_sessions(hub.deployment)}
    _stopped_leaving_nothing(hub, signal.SIGTERM, "the stop after the service's restart")


def test_a_kernel_restarter_racing_the_stop_leaves_nothing(hub):
    """alice's sandboxed kernel loses its session (destroyed at the service); her server's kernel restarter
    makes it a new one, and the hub is stopped as that create is under way or just done: nothing is left,
    whichever wins."""
    for n, offset in enumerate(RESTARTER_OFFSETS):
        sig = (signal.SIGTERM, signal.SIGINT)[n % 2]
        _start(hub)
        session = _start_kernel(hub)
        restarts = hub.log_text().count(RESTARTING)
        status, body = hub.service("DELETE", f"sessions/{session}", token=hub.tokens["alice"])
        assert status == 204, body
        hub.wait_for(
            lambda seen=restarts: hub.log_text().count(RESTARTING) > seen, "the restarter", timeout=15
        )
        time.sleep(offset)
        _stopped_leaving_nothing(hub, sig, f"the hub's {sig.name} {offset} s into a restart", workspace=False)
