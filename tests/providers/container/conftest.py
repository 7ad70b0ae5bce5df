"""Real containers running the session agent, for the container base's tests: the agent tests' fixtures
(tests/support/agent.py)."""

from tests.support.agent import *  # noqa: F403 - its __all__: the fixtures
