"""The docker provider on the session agent (``session_agent=True``) through the conformance suite, with the
warm pool off and on: the same checks, at full strength, as the sh-wrapper provider."""

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
