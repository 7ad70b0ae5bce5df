"""``python -m jupyter_tai_sandbox.agent [--force]``: build the agent binaries of a checkout (``.ci/agent-up``)."""

from .binary import main

main()
