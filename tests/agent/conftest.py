"""The agent tests' fixtures: real containers running the session agent (tests/support/agent.py)."""

from tests.support.agent import *  # noqa: F403 - its __all__: the fixtures
