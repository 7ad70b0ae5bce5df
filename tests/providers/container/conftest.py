"""Real containers running the session agent, for the container base's tests (the agent tests' fixtures)."""

from tests.agent.conftest import (  # noqa: F401 - fixtures
    agent_path,
    bare_session,
    docker_api,
    hostile_binary,
    images,
    nothing_left_behind,
    session,
)
