"""The hostile tests' fixture: ``client``, a client of the live engine for one module (tests/support/docker.py)."""

from tests.support.docker import client

__all__ = ["client"]
