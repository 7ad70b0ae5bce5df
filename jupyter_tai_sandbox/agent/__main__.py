"""``python -m jupyter_tai_sandbox.agent [--force]``: rebuild the agent binaries of a checkout in place (after
editing agent/*.go in an editable install; ``.ci/agent-up``). The package build makes them on its own."""

from .binary import main

main()
