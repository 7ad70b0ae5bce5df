"""The docker provider through the conformance suite's pytest face, one test per check, with the warm pool
off and on.

Skipped when no engine answers, unless CI is set (see tests/support/docker.py): then it fails.
"""

from __future__ import annotations

import pytest

from jupyter_tai_sandbox.testing import SandboxConformance
from tests.support.docker import TEST_IMAGE, docker_client, leftovers, provider

pytestmark = [pytest.mark.docker, pytest.mark.slow(110)]


@pytest.fixture(scope="module", autouse=True)
def engine():
    client = docker_client()  # skips (fails in CI) without an engine
    yield client
    client.close()


class TestDockerConformance(SandboxConformance):
    image = TEST_IMAGE

    def make_sandbox(self, tmp_path):
        return provider()


# a unit of its own (it runs beside the plain class on another worker), checked on its own worker
@pytest.mark.xdist_group("conformance-docker-warm-pool")
class TestDockerWarmPoolConformance(TestDockerConformance):
    """Sessions handed out from a warm pool of started containers."""

    def make_sandbox(self, tmp_path):
        return provider(pool_size=2)

    @pytest.fixture(scope="class", autouse=True)
    def nothing_is_left_after_the_class(self, engine):
        """After its last check: no container, volume or network of ours remains on this worker."""
        yield
        assert leftovers(engine) == []


def test_nothing_is_left_behind(engine):
    """Runs last in this module: no container, volume or network of ours remains."""
    assert leftovers(engine) == []
