"""The docker provider on the session agent (``session_agent=True``, off by default) through the
conformance suite, with the warm pool off and on: the same checks, at full strength, as the sh-wrapper
provider. Two checks fail on the agent as it is, pinned here as strict xfails until the agent changes
(agent/PROTOCOL.md "Process group"): the mode is not certified while they do."""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.providers.docker import DockerSandbox
from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support.docker import RUN_LABEL, TEST_IMAGE, docker_client, leftovers

pytestmark = [pytest.mark.docker, pytest.mark.slow(110)]


@pytest.fixture(scope="module", autouse=True)
def engine():
    client = docker_client()  # skips (fails in CI) without an engine
    yield client
    client.close()


class TestDockerAgentConformance(SandboxConformance):
    image = TEST_IMAGE

    def make_sandbox(self, tmp_path):
        return DockerSandbox(image=TEST_IMAGE, extra_labels=RUN_LABEL, session_agent=True)

    @pytest.mark.xfail(strict=True, reason=(
        "the agent makes each command its group's leader, so `setsid` (the program) forks and the command's "
        "process leaves the group: DESIGN.md wants a command that is not its group's leader (a holder leads it)"))
    def test_setsid_command_is_stopped(self, sandbox, tmp_path):
        self.run_conformance_check("setsid_command_is_stopped", sandbox, tmp_path)

    @pytest.mark.xfail(strict=True, reason=(
        "the agent's KILL stops the command's group; a terminal's job control puts background jobs in "
        "groups of their own in the terminal's session, which the sh wrapper's KILL_PTY stopped whole"))
    def test_pty_stop_ends_the_terminal_session(self, sandbox, tmp_path):
        self.run_conformance_check("pty_stop_ends_the_terminal_session", sandbox, tmp_path)


@pytest.mark.xdist_group("conformance-docker-agent-warm-pool")
class TestDockerAgentWarmPoolConformance(TestDockerAgentConformance):
    """Sessions on the agent handed out from a warm pool of started containers."""

    def make_sandbox(self, tmp_path):
        return DockerSandbox(image=TEST_IMAGE, extra_labels=RUN_LABEL, session_agent=True, pool_size=2)

    @pytest.fixture(scope="class", autouse=True)
    def nothing_is_left_after_the_class(self, engine):
        yield
        assert leftovers(engine) == []


def test_nothing_is_left_behind(engine):
    assert leftovers(engine) == []
